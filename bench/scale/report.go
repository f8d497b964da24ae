package main

import (
	"fmt"
	"runtime"
	"slices"
	"time"
)

// Targets of issues 16 and 26.
const (
	ratioAt2Target      = 1.8
	ratioAt3Target      = 2.6
	egressTarget        = 1.05 // every scenario but failover
	failoverEgress      = 1.2
	availabilityRatio   = 1.3 // orderly at 3 replicas, fanout at 5, vs 1
	failoverAvailRatio  = 1.5 // the survivors vs one replica alone
	overlapClientErrors = 0
)

// budget is the CPU the fills' verification takes at the chosen rates.
type budget struct {
	lines []string
	share float64 // of the machine's CPUs, at the most fills at once
}

// cpuBudget: a fill verifies the image at the pace the registry sends its
// layer (a follower streams the layer at that pace too), so it takes cost
// × registry rate × size/layer of CPU; the most fills at once are the
// largest replica count.
func cpuBudget(o options, cost float64, blobSize int64) budget {
	reg, _ := parseRate(o.rates.registry)
	perFill := reg / 8 * float64(o.size) / float64(blobSize) // image bytes per second
	cores := cost * perFill
	most := slices.Max(o.counts)
	for _, s := range o.scenarios {
		switch s {
		case scenarioFanout:
			most = max(most, fanoutReplicas)
		case scenarioSimultaneous, scenarioFailover, scenarioOverlap:
			most = max(most, 3)
		}
	}
	cpus := float64(runtime.NumCPU())
	b := budget{share: cores * float64(most) / cpus}
	b.lines = append(b.lines,
		fmt.Sprintf("verification (gunzip, sha256, md5) costs %.2f CPU-s per GiB of image here (measured on one core); a fill at the registry's %s verifies %.0f MiB/s of image: %.0f%% of a core",
			cost*gib, o.rates.registry, perFill/mib, 100*cores),
		fmt.Sprintf("at most %d fills at once take %.0f%% of the machine's %d CPUs (target <= %.0f%%: %s): the times to available measure the protocol and the network, not the CPU",
			most, 100*b.share, int(cpus), 100*o.maxCPUShare, verdict(b.share <= o.maxCPUShare)))
	return b
}

type judged struct {
	text string
	met  bool
}

func report(o options, cases [][]spec, results map[spec][]runResult, blobSize int64, peers bool, b budget) (missed int) {
	fmt.Println()
	for _, l := range b.lines {
		fmt.Println("  " + l)
	}
	fmt.Println()
	fmt.Println("  medians of the runs, [min-max]; egress is the worst run; clients: first answers that were not the image / clients that never got it, over all runs")
	fmt.Printf("  %-13s %3s %10s %18s %18s %11s %7s %9s %12s %10s %6s\n",
		"scenario", "n", "egress", "select->available", "select->all hold", "clients", "ratio", "failures", "replicas cpu", "load1", "busy")
	base := map[string]spec{}
	for _, cs := range cases {
		for _, c := range cs {
			if c.replicas == 1 {
				if _, ok := base[c.scenario]; !ok {
					base[c.scenario] = c
				}
			}
		}
	}
	for _, cs := range cases {
		for _, c := range cs {
			rs := results[c]
			avail := durations(rs, func(r runResult) time.Duration { return r.toAvailable })
			serve := durations(rs, func(r runResult) time.Duration { return r.allServing })
			clients, ratio, fails := "-", "-", "-"
			if c.clients > 0 {
				agg := median(floats(rs, func(r runResult) float64 { return r.aggregate }))
				clients = fmt.Sprintf("%.1f MiB/s", agg/mib)
				if bc, ok := base[c.scenario]; ok && bc != c {
					ratio = fmt.Sprintf("%.2fx", agg/median(floats(results[bc], func(r runResult) float64 { return r.aggregate })))
				}
				first, final := 0, 0
				for _, r := range rs {
					f1, f2 := r.clientFailures()
					first, final = first+f1, final+f2
				}
				fails = fmt.Sprintf("%d/%d", first, final)
			}
			cpu := median(floats(rs, func(r runResult) float64 { return r.cpuTotal().Seconds() }))
			loads := floats(rs, func(r runResult) float64 { return max(r.load1[0], r.load1[1]) })
			busy := median(floats(rs, func(r runResult) float64 { return r.busy }))
			fmt.Printf("  %-13s %3d %9.2fx %18s %18s %11s %7s %9s %10.1f s %10s %5.0f%%\n",
				c.scenario, c.replicas, worstEgress(rs, blobSize), spread(avail), spread(serve), clients, ratio, fails,
				cpu, fmt.Sprintf("%.1f-%.1f", slices.Min(loads), slices.Max(loads)), 100*busy)
		}
	}
	for _, cs := range cases {
		for _, c := range cs {
			for i, r := range results[c] {
				if r.killed != "" {
					fmt.Printf("  %s run %d: %s killed at %s of the %s layer\n", c.scenario, i+1, r.killed, human(r.killedAt), human(blobSize))
				}
				for j, cr := range r.clients {
					if cr.firstFailure != "" {
						fmt.Printf("  %s, %d replica(s), run %d, client %d: first answer %s; %s after %d tries\n", c.scenario, c.replicas, i+1, j, cr.firstFailure,
							map[bool]string{true: "got the image", false: "never got it: " + fmt.Sprint(cr.err)}[cr.err == nil], cr.tries)
						break
					}
				}
			}
		}
	}

	fmt.Println()
	var targets []judged
	judge := func(ok bool, format string, a ...any) {
		targets = append(targets, judged{fmt.Sprintf(format, a...) + fmt.Sprintf(" %s", verdict(ok)), ok})
	}
	judge(b.share <= o.maxCPUShare, "CPU: the fills take %.0f%% of the CPUs at these rates (target <= %.0f%%):", 100*b.share, 100*o.maxCPUShare)
	medianOf := func(c spec, f func(runResult) time.Duration) float64 {
		return median(floats(results[c], func(r runResult) float64 { return f(r).Seconds() }))
	}
	for _, cs := range cases {
		for _, c := range cs {
			rs := results[c]
			egress := worstEgress(rs, blobSize)
			limit := egressTarget
			if c.scenario == scenarioFailover {
				limit = failoverEgress
			}
			judge(egress <= limit, "%s, %d replica(s): registry egress %.2fx the layer, worst of %d runs (target <= %.2fx):", c.scenario, c.replicas, egress, len(rs), limit)
			bc := base[c.scenario]
			switch {
			case c.scenario == scenarioOrderly && c.replicas > 1:
				agg := median(floats(rs, func(r runResult) float64 { return r.aggregate }))
				ratio := agg / median(floats(results[bc], func(r runResult) float64 { return r.aggregate }))
				switch c.replicas {
				case 2:
					judge(ratio >= ratioAt2Target, "orderly, 2 replicas: clients' throughput %.2fx one replica's (target >= %.1fx):", ratio, ratioAt2Target)
				case 3:
					judge(ratio >= ratioAt3Target, "orderly, 3 replicas: clients' throughput %.2fx one replica's (target >= %.1fx):", ratio, ratioAt3Target)
					a, a1 := medianOf(c, func(r runResult) time.Duration { return r.toAvailable }), medianOf(bc, func(r runResult) time.Duration { return r.toAvailable })
					judge(a <= availabilityRatio*a1, "orderly, 3 replicas: selection to available: true %.1f s vs one replica %.1f s, %.2fx (target <= %.1fx):", a, a1, a/a1, availabilityRatio)
				}
			case c.scenario == scenarioFailover:
				bc = base[scenarioOrderly]
				a, a1 := medianOf(c, func(r runResult) time.Duration { return r.allServing }), medianOf(bc, func(r runResult) time.Duration { return r.allServing })
				judge(a <= failoverAvailRatio*a1, "failover: every survivor holding it verified %.1f s after selection vs one replica alone %.1f s, %.2fx (target <= %.1fx):", a, a1, a/a1, failoverAvailRatio)
			case c.scenario == scenarioFanout && c.replicas > 1:
				a, a1 := medianOf(c, func(r runResult) time.Duration { return r.allServing }), medianOf(bc, func(r runResult) time.Duration { return r.allServing })
				judge(a <= availabilityRatio*a1, "fanout, %d replicas: every replica holding it verified %.1f s after selection vs one replica %.1f s, %.2fx (target <= %.1fx):", c.replicas, a, a1, a/a1, availabilityRatio)
			}
			if c.clients > 0 {
				first, final := 0, 0
				for _, r := range rs {
					f1, f2 := r.clientFailures()
					first, final = first+f1, final+f2
				}
				judge(first+final == overlapClientErrors, "%s, %d replica(s): %d clients' first answers were not the image (Ironic's conductor fails those hosts), %d never got it, over %d runs (target 0):",
					c.scenario, c.replicas, first, final, len(rs))
			}
		}
	}
	for _, t := range targets {
		fmt.Println("  " + t.text)
		if !t.met {
			missed++
		}
	}
	if !peers {
		fmt.Println("  (this osimages has no peer fills: each replica pulled from the registry, and available: true was written by the first replica done)")
	}
	if missed > 0 {
		fmt.Printf("  %d of %d targets NOT met\n", missed, len(targets))
	} else {
		fmt.Printf("  all %d targets met\n", len(targets))
	}
	return missed
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func floats(rs []runResult, f func(runResult) float64) []float64 {
	out := make([]float64, 0, len(rs))
	for _, r := range rs {
		out = append(out, f(r))
	}
	return out
}

func durations(rs []runResult, f func(runResult) time.Duration) []float64 {
	return floats(rs, func(r runResult) float64 { return f(r).Seconds() })
}

// median of a sample: the middle value, or the mean of the two middle
// ones.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// spread is a sample's median and range, in seconds.
func spread(v []float64) string {
	if len(v) == 1 {
		return fmt.Sprintf("%.1f s", v[0])
	}
	return fmt.Sprintf("%.1f [%.1f-%.1f]", median(v), slices.Min(v), slices.Max(v))
}

func worstEgress(rs []runResult, blobSize int64) float64 {
	return slices.Max(floats(rs, func(r runResult) float64 { return float64(r.egress) / float64(blobSize) }))
}

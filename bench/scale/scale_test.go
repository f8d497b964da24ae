package main

import (
	"os"
	"testing"
	"time"
)

// What tc 6.1 prints for two classes, one of which sent nothing.
const tcClasses = `class htb 1:10 root prio 0 rate 400Mbit ceil 400Mbit burst 262125b cburst 262125b 
 Sent 536879104 bytes 8195 pkt (dropped 0, overlimits 4100 requeues 0) 
 backlog 0b 0p requeues 0
 lended: 4095 borrowed: 0 giants: 0
 tokens: 327671 ctokens: 327671

class htb 1:50 root prio 0 rate 64Mbit ceil 64Mbit burst 262125b cburst 262125b 
 Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0) 
 backlog 0b 0p requeues 0
`

func TestParseClassSent(t *testing.T) {
	got, err := parseClassSent(tcClasses)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["1:10"] != 536879104 || got["1:50"] != 0 {
		t.Fatalf("parseClassSent = %v, want 1:10 536879104 and 1:50 0", got)
	}
	if _, err := parseClassSent("qdisc htb 1: root\n"); err == nil {
		t.Fatal("output without a class: no error")
	}
	if _, err := parseClassSent("class htb 1:10 root\n Sent x bytes 0 pkt\n"); err == nil {
		t.Fatal("a count that is not a number: no error")
	}
}

func TestMedianAndSpread(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{9, 1, 5}, 5}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if got := spread([]float64{5.04, 4.0, 9.96}); got != "5.0 [4.0-10.0]" {
		t.Errorf("spread = %q", got)
	}
}

func TestProcessCPU(t *testing.T) {
	// Once this process has used some CPU, its CPU time is read; a
	// process that does not exist has none.
	for selfCPU() < 50*time.Millisecond {
	}
	if got := processCPU(os.Getpid()); got <= 0 {
		t.Fatalf("processCPU(self) = %v, want > 0", got)
	}
	if got := processCPU(1 << 30); got != 0 {
		t.Fatalf("processCPU(no such pid) = %v, want 0", got)
	}
}

func TestPlan(t *testing.T) {
	o := options{counts: []int{1, 2, 3}, scenarios: []string{scenarioFailover, scenarioFanout}, clients: 6,
		rates: rates{replica: "400mbit", registry: "64mbit"}, fanoutRate: "128mbit"}
	p := plan(o)
	// The failover needs the orderly single replica as its baseline.
	if len(p) != 3 || p[0][0] != (spec{scenarioOrderly, 1, o.rates, 6}) || p[1][0].scenario != scenarioFailover ||
		p[2][1] != (spec{scenarioFanout, fanoutReplicas, rates{"128mbit", "64mbit"}, 0}) {
		t.Fatalf("plan = %v", p)
	}
}

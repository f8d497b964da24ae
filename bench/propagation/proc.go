package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is one controller process, its output appended to a log file.
// With restart, it is started again whenever it exits, as a Deployment's
// pod would be: Kyverno's controllers exit when they lose their lease.
type proc struct {
	name    string
	logPath string
	restart bool
	// fixedPID is a process the bench did not start (apiserverProcs).
	fixedPID int

	mu       sync.Mutex
	cmd      *exec.Cmd
	restarts int
	cpuEnded time.Duration // CPU time of the runs that ended
	peak     int64         // highest VmHWM seen over the runs
	stopping bool
	done     chan struct{}
	err      error
}

func startProc(name, dir string, restart bool, env []string, binary string, args ...string) (*proc, error) {
	p := &proc{name: name, logPath: filepath.Join(dir, name+".log"), restart: restart, done: make(chan struct{})}
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	newCmd := func() *exec.Cmd {
		cmd := exec.Command(binary, args...)
		cmd.Stdout, cmd.Stderr = log, log
		cmd.Env = append(os.Environ(), env...)
		return cmd
	}
	p.cmd = newCmd()
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		defer close(p.done)
		defer log.Close()
		for {
			p.mu.Lock()
			cmd := p.cmd
			p.mu.Unlock()
			err := cmd.Wait()
			p.mu.Lock()
			if cmd.ProcessState != nil {
				p.cpuEnded += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			}
			if p.stopping || !p.restart {
				p.err = err
				p.mu.Unlock()
				return
			}
			p.restarts++
			fmt.Fprintf(log, "\n===== bench: %s exited (%v); restart %d =====\n\n", name, err, p.restarts)
			next := newCmd()
			if err := next.Start(); err != nil {
				p.err = err
				p.mu.Unlock()
				return
			}
			p.cmd = next
			p.mu.Unlock()
		}
	}()
	return p, nil
}

// exited returns an error when the process ended before it was stopped
// (for good, if it restarts).
func (p *proc) exited() error {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.stopping {
			return fmt.Errorf("%s ended: %v", p.name, p.err)
		}
	default:
	}
	return nil
}

func (p *proc) stop() {
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		return
	}
	p.stopping = true
	cmd := p.cmd
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) pid() int {
	if p.fixedPID != 0 {
		return p.fixedPID
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// apiserverProcs finds the etcd and kube-apiserver that envtest started
// for this process (its children), to follow their RSS.
func apiserverProcs() ([]*proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	found := map[string]*proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		open, end := strings.IndexByte(string(b), '('), strings.LastIndexByte(string(b), ')')
		if open < 0 || end < open {
			continue
		}
		comm := string(b[open+1 : end])
		f := strings.Fields(string(b[end+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		if comm == "etcd" || comm == "kube-apiserver" {
			if found[comm] != nil {
				return nil, fmt.Errorf("two %s processes are children of the bench: is an earlier apiserver still running?", comm)
			}
			found[comm] = &proc{name: comm, fixedPID: pid}
		}
	}
	if len(found) != 2 {
		return nil, fmt.Errorf("found %d of etcd and kube-apiserver among the bench's children", len(found))
	}
	return []*proc{found["etcd"], found["kube-apiserver"]}, nil
}

// status reads a kB field of /proc/PID/status, in bytes.
func (p *proc) status(field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func (p *proc) rss() int64 { return p.status("VmRSS") }

// hwm is the kernel's record of the peak RSS, over every run seen.
func (p *proc) hwm() int64 {
	h := p.status("VmHWM")
	p.mu.Lock()
	defer p.mu.Unlock()
	p.peak = max(p.peak, h)
	return p.peak
}

// cpu is the user and system time used, over every run.
func (p *proc) cpu() time.Duration {
	p.mu.Lock()
	ended := p.cpuEnded
	p.mu.Unlock()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		return ended
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces; utime and stime are fields 14 and 15 of the whole line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return ended
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clockTicks = 100 // USER_HZ on Linux
	return ended + time.Duration(ut+st)*time.Second/clockTicks
}

func (p *proc) restartCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

// sampler follows the summed RSS of processes that run together, and
// each one's peak (a restarted process's earlier peaks included).
type sampler struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	peak  int64
}

func sampleRSS(procs []*proc) *sampler {
	s := &sampler{stopc: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			var sum int64
			for _, p := range procs {
				sum += p.rss()
				p.hwm()
			}
			s.peak = max(s.peak, sum)
			select {
			case <-s.stopc:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) stop() int64 {
	close(s.stopc)
	s.wg.Wait()
	return s.peak
}

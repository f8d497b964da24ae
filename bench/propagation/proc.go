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

// proc is one controller process, its output in a log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
	stopped bool
}

func startProc(name, dir string, env []string, binary string, args ...string) (*proc, error) {
	p := &proc{name: name, logPath: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	log, err := os.Create(p.logPath)
	if err != nil {
		return nil, err
	}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Stdout, p.cmd.Stderr = log, log
	p.cmd.Env = append(os.Environ(), env...)
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// exited returns an error when the process ended before it was stopped.
func (p *proc) exited() error {
	select {
	case <-p.done:
		if !p.stopped {
			return fmt.Errorf("%s ended: %v", p.name, p.err)
		}
	default:
	}
	return nil
}

func (p *proc) stop() {
	if p.stopped {
		return
	}
	p.stopped = true
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// status reads a kB field of /proc/PID/status, in bytes.
func (p *proc) status(field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
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

// hwm is the kernel's record of the process's peak RSS.
func (p *proc) hwm() int64 { return p.status("VmHWM") }

// cpu is the user and system time the process has used.
func (p *proc) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces; utime and stime are fields 14 and 15 of the whole line.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clockTicks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clockTicks
}

// sampler follows the summed RSS of processes that run together.
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

// Package proc runs the servers a benchmark measures, each in a process
// group of its own, so that stopping one also stops its children (nginx's
// workers, say) and never another's.
package proc

import (
	"os/exec"
	"syscall"
	"time"
)

// Process is a started command.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts cmd in a new process group.
func Start(cmd *exec.Cmd) (*Process, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	return p, nil
}

// Pid is the process's pid, which is also its group's.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop sends SIGTERM, then SIGKILL to the whole group after grace, and
// waits for the process to exit.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(-p.Pid(), syscall.SIGKILL)
		<-p.done
	}
}

// Command osimages manages the OS images that bare-metal Kubernetes nodes
// boot from, for Cluster API Provider Metal3 fleets built with Sylva.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(exitCode(err))
	}
}

// Exit codes: 1 when the work failed (an image could not be resolved, a
// pick failed), 2 when the input is wrong (values, flags).
const (
	exitFailure = 1
	exitInput   = 2
)

type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func inputError(err error) error   { return &exitError{code: exitInput, err: err} }
func failureError(err error) error { return &exitError{code: exitFailure, err: err} }

func exitCode(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return exitFailure
}

// Package exitcode carries the exit code of a command's error: the
// commands of cmd/osimages mark which errors are the operator's input and
// which the work's, and main exits with the code. It is the command's
// alone: the packages under internal/ return errors (typed where the
// command must tell them apart) and results, and neither print nor choose
// an exit code (TestTheCLIStaysInTheCLI).
//
// The codes: 0 done, 1 the work failed (an image could not be resolved, a
// pick failed, a controller stopped), 2 the input is wrong (flags, values).
package exitcode

import "errors"

// The exit codes of a failed command.
const (
	Failure = 1
	Input   = 2
)

// Error is an error with its exit code.
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// InputError marks err as a fault of the input (exit 2); nil stays nil.
func InputError(err error) error { return wrap(Input, err) }

// FailureError marks err as a failure of the work (exit 1); nil stays nil.
func FailureError(err error) error { return wrap(Failure, err) }

func wrap(code int, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Code: code, Err: err}
}

// Of returns the exit code of err: that of its first *Error, Failure
// when it has none, 0 for nil.
func Of(err error) int {
	if err == nil {
		return 0
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Failure
}

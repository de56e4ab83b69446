package template

import (
	"errors"
	"fmt"
)

var (
	// ErrUpperRefused: a RUN step's sandbox left what a layer cannot hold
	// (a device node, a FIFO, a file of ids not the sandbox's); the
	// message names the path and why.
	ErrUpperRefused = errors.New("the step's changes were refused")
	// ErrNoBase: the build's base is not in the image store.
	ErrNoBase = errors.New("the build's base is not in the image store")
	// ErrStepFailed: a step failed; the message says which and why (for
	// a RUN, its exit status and the last lines of its output).
	ErrStepFailed = errors.New("build step failed")
)

// ExitError is what Sandboxes.Run returns when the command ran and
// exited with a status other than 0.
type ExitError struct {
	Status int
}

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Status) }

// StepError is a build's failure at one of its steps: 0 its base (FROM),
// i the spec's Steps[i-1]. E2B's SDKs point at the line that made it.
type StepError struct {
	Step int
	Err  error
}

func (e *StepError) Error() string { return e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// BuildStep is the step that failed.
func (e *StepError) BuildStep() int { return e.Step }

// UserError: a RUN step's user is not one of the image's (no such name in
// its /etc/passwd).
type UserError struct{ User string }

func (e *UserError) Error() string { return fmt.Sprintf("invalid username: '%s'", e.User) }

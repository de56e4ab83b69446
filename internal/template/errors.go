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

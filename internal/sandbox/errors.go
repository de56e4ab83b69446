package sandbox

import (
	"errors"
	"fmt"
)

var (
	// ErrInvalidSpec: the request asked for something impossible.
	ErrInvalidSpec = errors.New("invalid sandbox spec")
	// ErrUnsupported: the host lacks a feature the backend needs, or the
	// backend cannot do what was asked (give its sandboxes network
	// access, pause a one-shot). The error text names what and, where
	// there is one, the option or backend that can.
	ErrUnsupported = errors.New("not supported")
	// ErrSetup: the sandbox could not be started; the text says which step
	// failed.
	ErrSetup = errors.New("sandbox setup failed")
	// ErrClosed: the sandbox was closed.
	ErrClosed = errors.New("sandbox closed")
	// ErrBusy: the sandbox is running another execution.
	ErrBusy = errors.New("sandbox busy")
	// ErrTooLarge: a file exceeds the size allowed.
	ErrTooLarge = errors.New("file too large")
	// ErrBadPath: a workspace path is absolute, escapes the workspace, or
	// names something that is not a regular file.
	ErrBadPath = errors.New("invalid workspace path")
	// ErrNoContext: no code context has the ID asked for.
	ErrNoContext = errors.New("no such code context")
	// ErrExists: a file or directory is already there.
	ErrExists = errors.New("already exists")
	// ErrPermission: the sandbox's user (or root) may not do that to a
	// file of the sandbox's (its permissions say no).
	ErrPermission = errors.New("permission denied")
	// ErrNoRoom: the host or the server has no room left for what was
	// asked (the disk a paused sandbox's images go to, the memory its
	// sandboxes may hold together); the text says which. Nothing was
	// changed.
	ErrNoRoom = errors.New("no room")
	// ErrCannotKeep: a pause, a resume, a fork or a snapshot cannot keep
	// something of the sandbox as asked (a volume's files in a snapshot;
	// a file it held open on a volume, changed while it was paused); the
	// text says what, and what to do. Nothing was changed.
	ErrCannotKeep = errors.New("cannot be kept")
	// ErrPaused: the sandbox is paused (Pauser); resume it first.
	ErrPaused = errors.New("sandbox paused")
	// ErrNoTerminal: a process started without a terminal was asked to
	// do what only a terminal does (resize). It is an ErrInvalidSpec.
	ErrNoTerminal = fmt.Errorf("%w: the process has no terminal", ErrInvalidSpec)
)

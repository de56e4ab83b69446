package docker

import (
	"errors"
	"fmt"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

var (
	// ErrNoDaemon: no Docker daemon answers where the backend looks (not
	// installed, not running, or not a local unix socket).
	ErrNoDaemon = fmt.Errorf("%w: docker daemon unavailable", sandbox.ErrUnsupported)
	// ErrAPITooOld: the daemon's Engine API predates what the backend needs.
	ErrAPITooOld = fmt.Errorf("%w: docker API too old", sandbox.ErrUnsupported)
	// ErrDaemonConfig: the daemon runs in a mode the backend does not
	// support (user namespace remapping, rootless).
	ErrDaemonConfig = fmt.Errorf("%w: docker daemon configuration", sandbox.ErrUnsupported)
	// ErrNoRuntime: the daemon has no OCI runtime of the name asked for.
	ErrNoRuntime = fmt.Errorf("%w: docker runtime not registered", sandbox.ErrUnsupported)
	// errGone: the container no longer exists.
	errGone = errors.New("docker: no such container")
)

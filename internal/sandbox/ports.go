package sandbox

import (
	"context"
	"errors"
	"net"
)

// PortDialer is a Sandbox whose own network can be reached from the
// supervisor: a server its code started (on 0.0.0.0, 127.0.0.1 or ::1
// inside the sandbox) can be connected to, from the host, without giving
// the sandbox any route out. This is how a sandbox's ports are served
// through the server (preview URLs).
//
// The connection is made inside the sandbox's own network namespace, so
// it reaches nothing but the sandbox: never the host's loopback, another
// sandbox or the server's API, whatever port is asked for. Everything
// read from it is the sandbox's, and hostile.
type PortDialer interface {
	// DialPort connects to port (1-65535) on the sandbox's loopback. It
	// fails with ErrPortClosed when nothing listens there, ErrClosed when
	// the sandbox is gone.
	DialPort(ctx context.Context, port int) (net.Conn, error)
}

// ErrPortClosed: nothing listens on the port asked for in the sandbox.
var ErrPortClosed = errors.New("nothing listens on that port in the sandbox")

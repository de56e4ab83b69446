package container

import (
	"context"
	"fmt"
	"net"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A container's network is not one the host can enter soundly: under
// gVisor the sandbox's loopback lives in gVisor's own network stack, in
// the Sentry, not in any namespace of the host. Its ports are reached by
// a relay started inside the sandbox (sandbox.RelayPort), which connects
// where the sandbox's own code would.

var _ sandbox.PortDialer = (*Sandbox)(nil)

// DialPort implements sandbox.PortDialer with a relay in the sandbox.
func (s *Sandbox) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if s.spec.Egress != nil && fmt.Sprintf("127.0.0.1:%d", port) == sandbox.EgressAddr {
		// The supervisor's proxy, not the sandbox's (see native).
		return nil, fmt.Errorf("%w: port %d is the sandbox's network proxy, not one of its servers", sandbox.ErrPortClosed, port)
	}
	return sandbox.RelayPort(ctx, s, port)
}

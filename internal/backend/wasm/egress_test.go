package wasm

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

type egressStub struct{ closed bool }

func (e *egressStub) Serve(l net.Listener) error { return l.Close() }
func (e *egressStub) ServeConn(c net.Conn)       { c.Close() }
func (e *egressStub) Close() error               { e.closed = true; return nil }

// The wasm backend has no sockets: a network policy is refused, never
// dropped.
func TestEgressRefused(t *testing.T) {
	_, err := (&Backend{}).Create(context.Background(), sandbox.Spec{Egress: &egressStub{}})
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "the wasm backend cannot give a sandbox network access") {
		t.Errorf("Create with an Egress: %v", err)
	}
}

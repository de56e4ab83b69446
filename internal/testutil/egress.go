package testutil

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// EgressConfig is the network policy of a test's sandbox.
type EgressConfig struct {
	// Allow is the allowlist (netpolicy.ParseRule's syntax), both the
	// operator's and the sandbox's.
	Allow []string
	// Names answers lookups; a name not in it does not resolve. Nil: the
	// system's resolver.
	Names map[string][]netip.Addr
	// Deny and Except are the sandbox's own deny list and its exceptions
	// (netpolicy.Request's).
	Deny, Except []string
	// DenyAddrs are refused like the server's API listener.
	DenyAddrs []netip.AddrPort
	Limits    netpolicy.Limits
	// Audit receives each connection's event; nil: none.
	Audit func(netproxy.Event)
}

// NewEgress makes the proxy a server would give a sandbox under cfg: set
// it as Spec.Egress (the sandbox closes it; so does the end of the test).
func NewEgress(t testing.TB, cfg EgressConfig) sandbox.Egress {
	t.Helper()
	proxy, err := Egress(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	return proxy
}

// Egress is NewEgress for callers outside a test's goroutine (workers):
// the caller closes the proxy, or the sandbox it is given to does.
func Egress(cfg EgressConfig) (sandbox.Egress, error) {
	rules, err := netpolicy.ParseRules(cfg.Allow)
	if err != nil {
		return nil, err
	}
	srv := &netpolicy.Server{Rules: rules, DenyAddrs: cfg.DenyAddrs}
	p, err := srv.Grant(netpolicy.Request{Allow: cfg.Allow, Deny: cfg.Deny, Except: cfg.Except, Limits: cfg.Limits})
	if err != nil {
		return nil, err
	}
	var r netpolicy.Resolver
	if cfg.Names != nil {
		r = nameTable(cfg.Names)
	}
	return netproxy.New(netproxy.Config{Checker: srv.Checker(p, r), Audit: cfg.Audit})
}

type nameTable map[string][]netip.Addr

func (n nameTable) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := n[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

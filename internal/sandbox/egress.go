package sandbox

import (
	"fmt"
	"net"
)

// Egress is a sandbox's only way out to the network: a proxy the
// supervisor runs for it (package netproxy), which decides every
// connection by the sandbox's network policy. A backend that supports it
// makes the proxy reachable inside the sandbox at EgressAddr, on the
// sandbox's own loopback, and passes it every connection made there;
// the sandbox's network namespace itself still has no route out.
//
// The sandbox owns its Egress once Create succeeds and closes it when it
// closes; when Create fails, the caller closes it.
type Egress interface {
	// Serve handles the connections accepted on l until l or the Egress
	// is closed; it closes l when it closes.
	Serve(l net.Listener) error
	// ServeConn handles one connection and closes it.
	ServeConn(c net.Conn)
	// Close ends every connection and waits for them. It is safe to call
	// more than once.
	Close() error
}

// EgressAddr is where a sandbox with an Egress finds its proxy.
const EgressAddr = "127.0.0.1:3128"

// EgressEnv is the environment that points HTTP clients (urllib,
// requests, pip, curl) at the proxy. Loopback stays direct: it is the
// sandbox's own.
func EgressEnv() map[string]string {
	url := "http://" + EgressAddr
	noProxy := "localhost,127.0.0.1,::1"
	return map[string]string{
		"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url,
		"NO_PROXY": noProxy, "no_proxy": noProxy,
	}
}

// WithEgressEnv returns env with EgressEnv added; the user's own values
// of those variables win (they change only where their own code goes).
func WithEgressEnv(env map[string]string) map[string]string {
	out := EgressEnv()
	for k, v := range env {
		out[k] = v
	}
	return out
}

// EgressBackend is a Backend whose sandboxes can be given an Egress.
// Backends that are not one refuse a Spec with an Egress (CheckEgress).
type EgressBackend interface {
	// EgressSupported returns nil, or why this backend's sandboxes
	// cannot have network access on this host.
	EgressSupported() error
}

// EgressChooser is a Backend offering several (Mux): whether a sandbox
// can have an Egress depends on the backend its Spec names.
type EgressChooser interface {
	// EgressSupportedBy returns nil, or why sandboxes of the backend
	// named ("": the default) cannot have network access.
	EgressSupportedBy(name string) error
}

// EgressSupported returns nil if b can give sandboxes an Egress, or why
// not.
func EgressSupported(b Backend) error {
	return CheckEgress(b, Spec{Egress: noEgress{}})
}

// EgressSupportedBy returns nil if b can give a sandbox of the backend
// named ("": b's default) an Egress, or why not.
func EgressSupportedBy(b Backend, name string) error {
	if c, ok := b.(EgressChooser); ok {
		return c.EgressSupportedBy(name)
	}
	return EgressSupported(b)
}

type noEgress struct{}

func (noEgress) Serve(l net.Listener) error { return l.Close() }
func (noEgress) ServeConn(c net.Conn)       { c.Close() }
func (noEgress) Close() error               { return nil }

// CheckEgress refuses a Spec with an Egress for a backend that cannot
// give its sandboxes one: a network policy is never silently dropped.
func CheckEgress(b Backend, spec Spec) error {
	if spec.Egress == nil {
		return nil
	}
	eb, ok := b.(EgressBackend)
	if !ok {
		return fmt.Errorf("%w: the %s backend cannot give a sandbox network access; network policies need the native backend",
			ErrUnsupported, b.Name())
	}
	if err := eb.EgressSupported(); err != nil {
		return fmt.Errorf("%w: the %s backend cannot give a sandbox network access: %v", ErrUnsupported, b.Name(), err)
	}
	return nil
}

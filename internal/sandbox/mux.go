package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Mux offers several backends as one: a Spec's Backend field chooses
// among them, an empty one means the first. A server that lets its
// clients choose their isolation (native, gvisor, wasm ...) serves a Mux.
type Mux struct {
	order    []string
	backends map[string]Backend
}

var (
	_ Backend       = (*Mux)(nil)
	_ Sweeper       = (*Mux)(nil)
	_ EgressBackend = (*Mux)(nil)
	_ EgressChooser = (*Mux)(nil)
)

// NewMux offers backends by their names; the first is the default.
func NewMux(def Backend, others ...Backend) *Mux {
	m := &Mux{backends: map[string]Backend{}}
	for _, b := range append([]Backend{def}, others...) {
		if _, dup := m.backends[b.Name()]; dup {
			continue
		}
		m.order = append(m.order, b.Name())
		m.backends[b.Name()] = b
	}
	return m
}

// Name implements Backend: the default backend's name.
func (m *Mux) Name() string { return m.order[0] }

// Names lists the backends offered, the default first.
func (m *Mux) Names() []string { return append([]string(nil), m.order...) }

// Backend returns the backend of that name ("": the default), if offered.
func (m *Mux) Backend(name string) (Backend, bool) {
	if name == "" {
		name = m.order[0]
	}
	b, ok := m.backends[name]
	return b, ok
}

// Create implements Backend.
func (m *Mux) Create(ctx context.Context, spec Spec) (Sandbox, error) {
	b, ok := m.Backend(spec.Backend)
	if !ok {
		return nil, fmt.Errorf("%w: backend %q is not offered here; this server offers %s", ErrInvalidSpec,
			spec.Backend, strings.Join(m.order, ", "))
	}
	if err := CheckEgress(b, spec); err != nil {
		return nil, err
	}
	if err := CheckVolumes(b, spec); err != nil {
		return nil, err
	}
	if err := CheckRoot(b, spec); err != nil {
		return nil, err
	}
	return b.Create(ctx, spec)
}

// EgressSupported implements EgressBackend: Create checks the backend a
// spec chooses.
func (m *Mux) EgressSupported() error { return nil }

// VolumesSupported implements sandbox.VolumeBackend: Create checks the
// backend a spec names.
func (m *Mux) VolumesSupported() error { return nil }

// RootsSupported implements sandbox.RootBackend: Create checks the
// backend a spec names.
func (m *Mux) RootsSupported() error { return nil }

// EgressSupportedBy implements EgressChooser.
func (m *Mux) EgressSupportedBy(name string) error {
	b, ok := m.Backend(name)
	if !ok {
		return nil // Create refuses it, naming what is offered
	}
	return CheckEgress(b, Spec{Egress: noEgress{}})
}

// Sweep implements Sweeper over every backend that sweeps.
func (m *Mux) Sweep() ([]string, error) {
	var out []string
	var errs []error
	for _, name := range m.order {
		if s, ok := m.backends[name].(Sweeper); ok {
			left, err := s.Sweep()
			out = append(out, left...)
			errs = append(errs, err)
		}
	}
	return out, errors.Join(errs...)
}

// Close closes every backend that closes.
func (m *Mux) Close() error {
	var errs []error
	for _, name := range m.order {
		if c, ok := m.backends[name].(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// Unwrapper is a Backend that makes its sandboxes with another (a pool).
type Unwrapper interface {
	Unwrap() Backend
}

// Underlying finds in b the backend name ("": the default), through a
// Mux and any Unwrapper; ok is false where it is not offered.
func Underlying(b Backend, name string) (Backend, bool) {
	for {
		switch x := b.(type) {
		case *Mux:
			nb, ok := x.Backend(name)
			if !ok {
				return nil, false
			}
			b = nb
		case Unwrapper:
			b = x.Unwrap()
		default:
			return b, true
		}
	}
}

// BackendAs finds in b the backend name (see Underlying) as a T: an
// optional interface of backends (SnapshotRestorer, PausedOpener). ok is
// false where that backend has none or is not offered.
func BackendAs[T any](b Backend, name string) (T, bool) {
	var zero T
	u, ok := Underlying(b, name)
	if !ok {
		return zero, false
	}
	t, ok := u.(T)
	return t, ok
}

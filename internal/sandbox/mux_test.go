package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
)

type namedBackend struct {
	name   string
	specs  []Spec
	closed bool
}

func (b *namedBackend) Name() string { return b.name }
func (b *namedBackend) Create(_ context.Context, spec Spec) (Sandbox, error) {
	b.specs = append(b.specs, spec)
	return nil, nil
}
func (b *namedBackend) Close() error { b.closed = true; return nil }

func TestMuxChoosesByName(t *testing.T) {
	native, gvisor := &namedBackend{name: "native"}, &namedBackend{name: "gvisor"}
	m := NewMux(native, gvisor, &namedBackend{name: "native"})
	if m.Name() != "native" || strings.Join(m.Names(), ",") != "native,gvisor" {
		t.Fatalf("name %q, names %v", m.Name(), m.Names())
	}
	m.Create(context.Background(), Spec{})
	m.Create(context.Background(), Spec{Backend: "gvisor"})
	m.Create(context.Background(), Spec{Backend: "native"})
	if len(native.specs) != 2 || len(gvisor.specs) != 1 {
		t.Fatalf("native made %d, gvisor %d", len(native.specs), len(gvisor.specs))
	}
	_, err := m.Create(context.Background(), Spec{Backend: "docker"})
	if !errors.Is(err, ErrInvalidSpec) || !strings.Contains(err.Error(), "native, gvisor") {
		t.Fatalf("unknown backend: %v", err)
	}
	m.Close()
	if !native.closed || !gvisor.closed {
		t.Fatal("Close did not close every backend")
	}
}

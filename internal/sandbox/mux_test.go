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

type egressBackend struct{ namedBackend }

func (*egressBackend) EgressSupported() error { return nil }

// Whether a sandbox can have network access depends on the backend its
// spec names; the mux says so before anything starts.
func TestMuxEgressSupportedBy(t *testing.T) {
	m := NewMux(&egressBackend{namedBackend{name: "native"}}, &namedBackend{name: "wasm"})
	if err := EgressSupportedBy(m, ""); err != nil {
		t.Errorf("default: %v", err)
	}
	if err := EgressSupportedBy(m, "native"); err != nil {
		t.Errorf("native: %v", err)
	}
	err := EgressSupportedBy(m, "wasm")
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "the wasm backend cannot give a sandbox network access") {
		t.Errorf("wasm: %v", err)
	}
	if err := EgressSupportedBy(&namedBackend{name: "plain"}, ""); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a backend without egress: %v", err)
	}
}

type volumeBackend struct{ namedBackend }

func (*volumeBackend) VolumesSupported() error { return nil }

// A spec with volumes reaches only a backend that mounts them; the others
// are never asked to make the sandbox (it would start without them).
func TestMuxVolumes(t *testing.T) {
	native, wasm := &volumeBackend{namedBackend{name: "native"}}, &namedBackend{name: "wasm"}
	m := NewMux(native, wasm)
	vols := []VolumeMount{{Path: "/mnt/v", Mount: noMount, Name: "v"}}
	if _, err := m.Create(context.Background(), Spec{Volumes: vols}); err != nil || len(native.specs) != 1 {
		t.Fatalf("native: %v, %d made", err, len(native.specs))
	}
	_, err := m.Create(context.Background(), Spec{Backend: "wasm", Volumes: vols})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "the wasm backend cannot mount volumes") || len(wasm.specs) != 0 {
		t.Fatalf("wasm: %v, %d made", err, len(wasm.specs))
	}
}

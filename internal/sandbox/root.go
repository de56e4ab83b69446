package sandbox

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Root is a template's file system as a sandbox's root, in place of the
// host's /usr: an image's layers, read-only and shared by every sandbox of
// it, under a writable layer of the sandbox's own, bounded by its disk
// limit. The server fills it in from its image store (Spec.Root).
type Root struct {
	// Template is the template's name, for messages; ID its
	// configuration's digest, which tells two builds of one name apart.
	Template string `json:"template"`
	ID       string `json:"id"`
	// Layers are the host directories of its layers (overlayfs's form),
	// the lowest first.
	Layers []string `json:"layers"`
	// Env is the template's environment (KEY=VALUE), under the spec's own.
	Env []string `json:"env,omitempty"`
	// Dir is where its code and commands start ("": the sandbox's home).
	Dir string `json:"dir,omitempty"`
}

// RootBackend is a Backend whose sandboxes can have a template's root.
// Backends that are not one refuse a Spec with a Root (CheckRoot).
type RootBackend interface {
	// RootsSupported returns nil, or why this backend's sandboxes cannot
	// run templates on this host.
	RootsSupported() error
}

// CheckRoot refuses a Spec with a Root for a backend that cannot give it,
// naming it.
func CheckRoot(b Backend, spec Spec) error {
	if spec.Root == nil {
		return nil
	}
	rb, ok := b.(RootBackend)
	if !ok {
		return fmt.Errorf("%w: the %s backend cannot run templates; templates need the native backend", ErrUnsupported, b.Name())
	}
	if err := rb.RootsSupported(); err != nil {
		return fmt.Errorf("%w: the %s backend cannot run templates: %v", ErrUnsupported, b.Name(), err)
	}
	return nil
}

// maxRootLayers bounds a root's layers (the image store refuses more).
const maxRootLayers = 128

func (r *Root) validate() error {
	if r == nil {
		return nil
	}
	if len(r.Layers) == 0 || len(r.Layers) > maxRootLayers {
		return fmt.Errorf("%w: template %q: %d layers (1 to %d)", ErrInvalidSpec, r.Template, len(r.Layers), maxRootLayers)
	}
	for _, l := range r.Layers {
		if !filepath.IsAbs(l) || filepath.Clean(l) != l || strings.ContainsAny(l, ":,") {
			return fmt.Errorf("%w: template %q: a layer at %q", ErrInvalidSpec, r.Template, l)
		}
	}
	for _, kv := range r.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%w: template %q: environment entry %q has no '='", ErrInvalidSpec, r.Template, kv)
		}
		if err := validEnv(k, v); err != nil {
			return err
		}
	}
	if r.Dir != "" && (!filepath.IsAbs(r.Dir) || strings.Contains(r.Dir, "\x00")) {
		return fmt.Errorf("%w: template %q: working directory %q is not absolute", ErrInvalidSpec, r.Template, r.Dir)
	}
	return nil
}

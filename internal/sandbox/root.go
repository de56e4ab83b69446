package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"
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
	// User is the sandbox user of its sandboxes, the template's USER;
	// nil: the default (uid and gid 1000).
	User *RootUser `json:"user,omitempty"`
}

// RootLayers is the spec's template's layers (nil: no template).
func (s Spec) RootLayers() []string {
	if s.Root == nil {
		return nil
	}
	return s.Root.Layers
}

// RootUser is who a template's USER names, as its /etc/passwd and
// /etc/group give it: the sandbox user of its sandboxes, who runs their
// code and commands ("" and UserSandbox; UserRoot stays uid 0).
type RootUser struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"` // supplementary
	// Name is its name in the image's /etc/passwd ("": none).
	Name string `json:"name,omitempty"`
}

// The default sandbox user's ids, and bounds of a template's: a sandbox's
// user namespace maps ids 0 to MaxUserID.
const (
	DefaultUID, DefaultGID = 1000, 1000
	MaxUserID              = 65535
	maxUserGroups          = 64
)

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
	if u := r.User; u != nil {
		if u.UID > MaxUserID || u.GID > MaxUserID || len(u.Groups) > maxUserGroups ||
			slices.ContainsFunc(u.Groups, func(g uint32) bool { return g > MaxUserID }) {
			return fmt.Errorf("%w: template %q: user %d:%d (ids 0 to %d, at most %d groups)", ErrInvalidSpec, r.Template,
				u.UID, u.GID, MaxUserID, maxUserGroups)
		}
		if strings.ContainsAny(u.Name, ":\n\x00") {
			return fmt.Errorf("%w: template %q: user name %q", ErrInvalidSpec, r.Template, u.Name)
		}
	}
	return nil
}

// SandboxUser is the sandbox user of a sandbox of spec: its template's
// USER, or the default.
func (s Spec) SandboxUser() RootUser {
	if s.Root != nil && s.Root.User != nil {
		return *s.Root.User
	}
	return RootUser{UID: DefaultUID, GID: DefaultGID}
}

package service

import (
	"errors"
	"fmt"
	"maps"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// ErrNoTemplate: no template (image of the server's store) has the name
// a request gives.
var ErrNoTemplate = errors.New("no such template")

// withTemplate gives spec the template it names (spec.Template), from the
// server's image store: its layers as the root (sandbox.Root), its
// environment under the spec's own, its WORKDIR.
func (s *Service) withTemplate(spec *sandbox.Spec) error { return ResolveTemplate(s.cfg.Images, spec) }

// ResolveTemplate is withTemplate with the image store images (nil: none),
// for what makes sandboxes without a server (vivarium run).
func ResolveTemplate(images *image.Store, spec *sandbox.Spec) error {
	if spec.Template == "" {
		return nil
	}
	if images == nil {
		return fmt.Errorf("%w: this server keeps no templates (it runs without an image store)", sandbox.ErrUnsupported)
	}
	if spec.Python != "" {
		return fmt.Errorf("%w: a template's sandbox runs the template's python3; python cannot be chosen with a template", sandbox.ErrInvalidSpec)
	}
	im, err := images.Get(spec.Template)
	if errors.Is(err, image.ErrNotFound) {
		return fmt.Errorf("%w: %q (the server's templates: vivarium image ls)", ErrNoTemplate, spec.Template)
	}
	if err != nil {
		return fmt.Errorf("template %q: %w", spec.Template, err)
	}
	cfg, err := images.ConfigFile(im)
	if err != nil {
		return fmt.Errorf("template %q: %w", spec.Template, err)
	}
	root := &sandbox.Root{Template: spec.Template, ID: im.Config, Dir: cfg.Config.WorkingDir}
	for _, id := range im.Layers {
		root.Layers = append(root.Layers, images.LayerDir(id))
	}
	env := map[string]string{}
	for _, kv := range cfg.Config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	maps.Copy(env, spec.Env)
	if err := checkEnv(env); err != nil {
		return fmt.Errorf("template %q: %w", spec.Template, err)
	}
	spec.Root, spec.Env = root, env
	return nil
}

// template is the name of the template the sandbox is made of, or "".
func (b *Box) template() string {
	if b.spec == nil {
		return b.snapTemplate.name
	}
	return b.spec.Template
}

// templateDigest is the digest of the configuration of the template the
// sandbox is made of, or "".
func (b *Box) templateDigest() string {
	if b.spec == nil || b.spec.Root == nil {
		return b.snapTemplate.digest
	}
	return b.spec.Root.ID
}

// snapshotTemplate is the template of a sandbox made of a snapshot, as
// the snapshot records it.
type snapshotTemplate struct{ name, digest string }

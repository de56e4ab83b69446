package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/template"
)

// ErrNoTemplate: no template (image of the server's store) has the name
// a request gives.
var ErrNoTemplate = errors.New("no such template")

// withTemplate gives spec the template it names (spec.Template), from the
// server's image store: its layers as the root (sandbox.Root), its
// environment under the spec's own, its WORKDIR and USER; and returns what its
// sandboxes start with. A name of the owner's own templates (built
// through E2B's API: builds.go) comes before the store's images; with a
// template registry (registry.go), the key's templates are the
// registry's, and a name neither the key nor the store has is looked
// up among the registry's shared templates.
func (s *Service) withTemplate(ctx context.Context, owner string, spec *sandbox.Spec) (templateStart, error) {
	if spec.Template == "" {
		return templateStart{}, nil
	}
	ref, err := s.templateRef(ctx, owner, spec.Template)
	if err != nil {
		return templateStart{}, err
	}
	return resolveTemplate(s.cfg.Images, spec, ref)
}

// templateRef is the image store's name of owner's template tpl.
func (s *Service) templateRef(ctx context.Context, owner, tpl string) (string, error) {
	reg := s.registry
	// A registry that fails is said only when nothing else has the name.
	var regErr error
	if reg != nil {
		if ref := reg.keyRef(owner, tpl); ref != "" {
			local, err := reg.local(ctx, ref)
			switch {
			case err == nil:
				return local, nil
			case errors.Is(err, ErrRegistry):
				regErr = err
			case !errors.Is(err, ErrNoTemplate):
				return "", err
			}
		}
	}
	if im, err := s.TemplateImage(owner, tpl); err == nil {
		return im.Name, nil
	}
	if reg == nil || s.cfg.Images == nil {
		return tpl, nil
	}
	if _, err := s.cfg.Images.Get(tpl); !errors.Is(err, image.ErrNotFound) {
		return tpl, nil
	}
	if ref := reg.sharedRef(tpl); ref != "" {
		local, err := reg.local(ctx, ref)
		if err == nil || !errors.Is(err, ErrNoTemplate) {
			return local, err
		}
	}
	if regErr != nil {
		return "", regErr
	}
	return tpl, nil
}

// ResolveTemplate is withTemplate with the image store images (nil: none),
// for what makes sandboxes without a server (vivarium run).
func ResolveTemplate(images *image.Store, spec *sandbox.Spec) error {
	if spec.Template == "" {
		return nil
	}
	_, err := resolveTemplate(images, spec, spec.Template)
	return err
}

// templateStart is a template's start and ready commands, as its build
// labelled them (template.LabelStartCmd, LabelReadyCmd): "" for none. An
// image's own CMD is not run.
type templateStart struct{ start, ready string }

// resolveTemplate gives spec the template stored as ref.
func resolveTemplate(images *image.Store, spec *sandbox.Spec, ref string) (templateStart, error) {
	if images == nil {
		return templateStart{}, fmt.Errorf("%w: this server keeps no templates (it runs without an image store)", sandbox.ErrUnsupported)
	}
	if spec.Python != "" {
		return templateStart{}, fmt.Errorf("%w: a template's sandbox runs the template's python3; python cannot be chosen with a template", sandbox.ErrInvalidSpec)
	}
	im, err := images.Get(ref)
	if errors.Is(err, image.ErrNotFound) {
		return templateStart{}, fmt.Errorf("%w: %q (the server's templates: vivarium image ls)", ErrNoTemplate, spec.Template)
	}
	if err != nil {
		return templateStart{}, fmt.Errorf("template %q: %w", spec.Template, err)
	}
	cfg, err := images.ConfigFile(im)
	if err != nil {
		return templateStart{}, fmt.Errorf("template %q: %w", spec.Template, err)
	}
	root := &sandbox.Root{Template: spec.Template, ID: im.Config, Dir: cfg.Config.WorkingDir, Env: cfg.Config.Env}
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
		return templateStart{}, fmt.Errorf("template %q: %w", spec.Template, err)
	}
	if u := cfg.Config.User; u != "" {
		user, err := template.ImageUser(root.Layers, u)
		if err != nil {
			return templateStart{}, fmt.Errorf("%w: template %q: its USER %q: %w", sandbox.ErrInvalidSpec, spec.Template, u, err)
		}
		root.User = &user
	}
	spec.Root, spec.Env = root, env
	return templateStart{cfg.Config.Labels[template.LabelStartCmd], cfg.Config.Labels[template.LabelReadyCmd]}, nil
}

// Bounds of a template's start: how long its ready command may take to
// succeed, each try of it, and the pause between tries.
const (
	templateReadyTimeout = 2 * time.Minute
	templateReadyTry     = 10 * time.Second
	templateReadyEvery   = 200 * time.Millisecond
	maxStartOutput       = 2 << 10
)

// startTemplate runs the start command (cmds) of the template of b, a
// new sandbox, as a process of it (tagged "start", listed as any other), and
// waits until its ready command exits 0: E2B's setStartCmd and
// setReadyCmd. A start command that ends first, or a ready command that
// never succeeds, fails the creation, saying what the start command
// printed.
func (s *Service) startTemplate(ctx context.Context, owner string, b *Box, cmds templateStart) error {
	start, ready := cmds.start, cmds.ready
	if start == "" {
		return nil
	}
	p, sub, err := s.StartProcess(ctx, owner, b.id, ProcessRequest{Argv: []string{"/bin/sh", "-c", start}, Tag: "start"})
	if err != nil {
		return fmt.Errorf("%w: the template's start command: %w", sandbox.ErrSetup, err)
	}
	defer sub.Close()
	if ready == "" {
		return nil
	}
	// What it prints until it is ready, the last of it kept, to say why
	// it was not.
	var outMu sync.Mutex
	var out []byte
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case ev, ok := <-sub.Events():
				if !ok {
					return
				}
				outMu.Lock()
				out = append(append(out, ev.Stdout...), ev.Stderr...)
				if len(out) > maxStartOutput {
					out = out[len(out)-maxStartOutput:]
				}
				outMu.Unlock()
			case <-stop:
				return
			}
		}
	}()
	printed := func() string {
		outMu.Lock()
		defer outMu.Unlock()
		return strings.TrimSpace(strings.ToValidUTF8(string(out), "?"))
	}
	deadline := time.NewTimer(templateReadyTimeout)
	defer deadline.Stop()
	for {
		res, err := s.Command(ctx, owner, b.id, CommandRequest{Cmd: ready, Timeout: templateReadyTry}, nil)
		if err == nil && res.Status == sandbox.StatusOK && res.ExitCode == 0 {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("%w: the template's start command ended (exit status %d) before its ready command succeeded; it printed: %q",
				sandbox.ErrSetup, p.End().ExitCode, printed())
		case <-deadline.C:
			return fmt.Errorf("%w: the template's ready command did not succeed within %v; its start command printed: %q",
				sandbox.ErrSetup, templateReadyTimeout, printed())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(templateReadyEvery):
		}
	}
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

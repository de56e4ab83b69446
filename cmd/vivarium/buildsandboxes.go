package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/template"
)

// buildSandboxes runs a template build's RUN steps in native sandboxes
// (template.Sandboxes over native.Backend.RunBuildStep).
type buildSandboxes struct {
	backend *native.Backend
	store   *image.Store
	tenant  string
	// egress, if set, gives each step its proxy; nil: no network.
	egress func() (sandbox.Egress, error)
}

var _ template.Sandboxes = (*buildSandboxes)(nil)

// Run implements template.Sandboxes.
func (bs *buildSandboxes) Run(ctx context.Context, r template.RunRequest) error {
	step := native.BuildStep{Args: r.Args, Env: r.Env, Dir: r.Dir, User: r.User, Log: r.Log, Tenant: bs.tenant,
		Commit: r.Commit}
	for _, id := range r.Layers {
		step.Layers = append(step.Layers, bs.store.LayerDir(id))
	}
	if bs.egress != nil {
		e, err := bs.egress()
		if err != nil {
			return err
		}
		step.Egress = e
	}
	err := bs.backend.RunBuildStep(ctx, step)
	if ee := (*native.BuildExitError)(nil); errors.As(err, &ee) {
		return &template.ExitError{Status: ee.Status}
	}
	if ue := (*native.BuildUserError)(nil); errors.As(err, &ue) {
		return &template.UserError{User: ue.User}
	}
	return err
}

// templateServeFlags are vivarium serve's flags for the templates its
// keys build (E2B's Template SDK): where their bases are pulled from and
// what network their steps have.
type templateServeFlags struct {
	insecure, mirrors listFlag
	allowNet          ruleList
}

func (f *templateServeFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.mirrors, "registry-mirror", "`REGISTRY=MIRROR`: pull the bases of templates built here from MIRROR first (repeatable; docker.io is index.docker.io)")
	fs.Var(&f.insecure, "insecure-registry", "a registry `HOST[:PORT]` the bases of templates are pulled from over plain HTTP (repeatable); no other is")
	fs.Var(&f.allowNet, "build-allow-net", "`RULE` a template build's RUN steps may reach through their sandbox's proxy (repeatable): "+
		"HOST, *.DOMAIN, CIDR or [IPV6-CIDR], each with :PORTS (80,443 when none); default: no network")
}

// buildConfig is the service's build configuration: a builder whose RUN
// steps are sandboxes of the native backend, if the server offers it.
func (f *templateServeFlags) buildConfig(dataDir string, images *image.Store, m *sandbox.Mux) (service.BuildConfig, error) {
	cfg := service.BuildConfig{FilesDir: filepath.Join(dataDir, "template-files")}
	pull, err := pullOptions(f.insecure, f.mirrors)
	if err != nil {
		return cfg, err
	}
	if e, err := runEgress(f.allowNet); err != nil {
		return cfg, err
	} else if e != nil {
		e.Close()
	}
	nb, ok := nativeOf(m)
	if !ok {
		return cfg, nil // builds are refused, saying so
	}
	sandboxes := &buildSandboxes{backend: nb, store: images}
	if len(f.allowNet) > 0 {
		sandboxes.egress = func() (sandbox.Egress, error) { return runEgress(f.allowNet) }
	}
	cfg.Builder = &serveBuilder{builder: &template.Builder{Store: images, Sandboxes: sandboxes,
		CacheDir: filepath.Join(dataDir, "build-cache")}, store: images, pull: pull}
	return cfg, nil
}

// e2bBaseImage is what E2B's own templates ("base", "code-interpreter")
// are built from: E2B's base image, pulled as any other base.
const e2bBaseImage = "e2bdev/base"

// serveBuilder builds a key's templates for the service: a base image not
// in the store yet is pulled first (the serve flags' registries), E2B's
// own templates as a base are its base image, and the steps are the
// template builder's.
type serveBuilder struct {
	builder *template.Builder
	store   *image.Store
	pull    image.PullOptions
}

var (
	_ service.TemplateBuilder = (*serveBuilder)(nil)
	_ service.TemplateRemover = (*serveBuilder)(nil)
)

// Build implements service.TemplateBuilder.
func (sb *serveBuilder) Build(ctx context.Context, name string, spec template.Spec, files service.BuildFiles, log io.Writer) (image.Image, error) {
	switch spec.FromTemplate {
	case "base", "code-interpreter", "code-interpreter-v1":
		spec.FromTemplate, spec.FromImage = "", e2bBaseImage
	}
	if spec.FromImage != "" {
		if _, err := sb.store.Get(spec.FromImage); errors.Is(err, image.ErrNotFound) {
			fmt.Fprintf(log, "pulling %s\n", spec.FromImage)
			if _, err := image.Pull(ctx, sb.store, spec.FromImage, sb.pull, nil); err != nil {
				return image.Image{}, &template.StepError{Step: 0, Err: fmt.Errorf("pull %s: %w", spec.FromImage, err)}
			}
		}
	}
	return sb.builder.Build(ctx, name, spec, files, log)
}

// Remove implements service.TemplateRemover.
func (sb *serveBuilder) Remove(name string) error { return sb.store.Remove(name) }

// pullOptions are image.PullOptions of --insecure-registry and
// --registry-mirror flags.
func pullOptions(insecure, mirrors []string) (image.PullOptions, error) {
	o := image.PullOptions{Insecure: insecure, Mirrors: map[string]string{}}
	for _, m := range mirrors {
		reg, mirror, ok := strings.Cut(m, "=")
		if !ok || reg == "" || mirror == "" {
			return o, fmt.Errorf("--registry-mirror %q: want REGISTRY=MIRROR", m)
		}
		if reg == "docker.io" {
			reg = "index.docker.io"
		}
		o.Mirrors[reg] = mirror
	}
	return o, nil
}

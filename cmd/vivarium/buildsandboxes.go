package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

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
	limits  sandbox.Limits // each step's; zero fields: native.DefaultBuildLimits
	tenant  string         // the group of the key whose build it is (sandbox.Spec.Tenant)
	// egress, if set, gives each step its proxy; nil: no network.
	egress func() (sandbox.Egress, error)
}

var _ template.Sandboxes = (*buildSandboxes)(nil)

// Run implements template.Sandboxes.
func (bs *buildSandboxes) Run(ctx context.Context, r template.RunRequest) error {
	step := native.BuildStep{Args: r.Args, Env: r.Env, Dir: r.Dir, UID: uint32(r.UID), GID: uint32(r.GID), Groups: buildGroups(r.Groups), Log: r.Log, Limits: bs.limits,
		Tenant: bs.tenant, Commit: r.Commit}
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
	return err
}

// templateServeFlags are vivarium serve's flags for the templates its
// keys build (E2B's Template SDK): where their bases are pulled from and
// what network their steps have.
type templateServeFlags struct {
	insecure, mirrors, registries listFlag
	allowNet                      ruleList
	bytesPerKey                   sizeFlag
	shared                        string
}

func (f *templateServeFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.registries, "pull-registry", "a `REGISTRY` the bases of templates built here may be pulled from (repeatable; docker.io is index.docker.io); "+
		"default: none but --registry-mirror's, a base must be in the image store")
	fs.Var(&f.mirrors, "registry-mirror", "`REGISTRY=MIRROR`: pull the bases of templates built here from MIRROR first, and allow REGISTRY (repeatable; docker.io is index.docker.io)")
	fs.Var(&f.insecure, "insecure-registry", "a registry `HOST[:PORT]` reached over plain HTTP (repeatable): for the bases of templates, and --template-registry's; no other is")
	fs.Var(&f.allowNet, "build-allow-net", "`RULE` a template build's RUN steps may reach through their sandbox's proxy (repeatable): "+
		"HOST, *.DOMAIN, CIDR or [IPV6-CIDR], each with :PORTS (80,443 when none); default: no network")
	fs.StringVar(&f.shared, "template-registry", "", "`REGISTRY/REPOSITORY` a cluster's nodes share templates through: "+
		"a key's builds are pushed there, and a template this node lacks is pulled from there on first use "+
		"(credentials: Docker's config.json, $DOCKER_CONFIG; plain HTTP only with --insecure-registry)")
	f.bytesPerKey = service.DefaultBuildBytes
	fs.Var(&f.bytesPerKey, "build-disk-per-key", "most an API key's built templates may add to their bases on disk, "+
		"its running builds' budgets included; one build at most half of it")
}

// registry is where the server shares templates (service.Config.Registry).
func (f *templateServeFlags) registry() (service.TemplateRegistry, error) {
	r := service.TemplateRegistry{Repo: f.shared, Options: image.PullOptions{Insecure: f.insecure}}
	return r, r.Check()
}

// buildConfig is the service's build configuration: a builder whose RUN
// steps are sandboxes of the native backend, if the server offers it.
// Each step is held to the server's limits of a sandbox (max), as a
// key's sandboxes are: a build spends no more of the host than they may.
func (f *templateServeFlags) buildConfig(dataDir string, images *image.Store, m *sandbox.Mux, max sandbox.Limits) (service.BuildConfig, error) {
	cfg := service.BuildConfig{FilesDir: filepath.Join(dataDir, "template-files"), MaxBytes: int64(f.bytesPerKey)}
	if f.bytesPerKey < 1<<20 {
		return cfg, errors.New("--build-disk-per-key must be at least 1MiB")
	}
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
	max = max.WithDefaults()
	def := native.DefaultBuildLimits
	sandboxes := &buildSandboxes{backend: nb, store: images, limits: sandbox.Limits{Timeout: def.Timeout,
		Memory: min(def.Memory, max.Memory), Disk: min(def.Disk, max.Disk), Pids: min(def.Pids, max.Pids)}}
	if len(f.allowNet) > 0 {
		sandboxes.egress = func() (sandbox.Egress, error) { return runEgress(f.allowNet) }
	}
	allowed := map[string]bool{}
	for reg := range pull.Mirrors {
		allowed[reg] = true
	}
	for _, reg := range f.registries {
		allowed[dockerHub(reg)] = true
	}
	cfg.Builder = &serveBuilder{builder: &template.Builder{Store: images, Sandboxes: sandboxes,
		CacheDir: filepath.Join(dataDir, "build-cache")}, store: images, pull: pull, registries: allowed}
	return cfg, nil
}

// dockerHub names Docker Hub's registry as references resolve it.
func dockerHub(reg string) string {
	if reg == "docker.io" {
		return "index.docker.io"
	}
	return reg
}

// e2bBaseImage is what E2B's own templates ("base", "code-interpreter")
// are built from: E2B's base image, pulled as any other base.
const e2bBaseImage = "e2bdev/base"

// serveBuilder builds a key's templates for the service: a base image not
// in the store yet is pulled first (the serve flags' registries), E2B's
// own templates as a base are its base image, and the steps are the
// template builder's.
//
// A base pulled for a build is the build's to pay for: its bytes count
// in what the build added (its key's --build-disk-per-key), its pull
// may unpack no more than the build's budget, and its name is removed
// from the store once no build uses it, its layers living on in the
// templates built on it (and collected with the last of them). Without
// that, a key could fill the disk with bases that no template holds.
// The images of the store the operator put there are never removed.
type serveBuilder struct {
	builder *template.Builder
	store   *image.Store
	pull    image.PullOptions
	// registries are those a base may be pulled from: a key's build
	// makes the server reach no other host (its network, its cloud's
	// metadata).
	registries map[string]bool

	mu    sync.Mutex
	bases map[string]*pulledBase // bases pulled for builds that run, by name
}

// pulledBase is a base a build pulled, and the builds that use it.
type pulledBase struct {
	users int
	ready chan struct{} // closed once pulled, or not
	err   error
}

// maxBasePull bounds the pull of a build's base: a registry that stalls
// ends the build, not hold one of its key's build slots.
const maxBasePull = 30 * time.Minute

var (
	_ service.TemplateBuilder = (*serveBuilder)(nil)
	_ service.TemplateRemover = (*serveBuilder)(nil)
)

// Build implements service.TemplateBuilder.
func (sb *serveBuilder) Build(ctx context.Context, job service.BuildJob, spec template.Spec, files service.BuildFiles, log io.Writer) (service.Built, error) {
	switch spec.FromTemplate {
	case "base", "code-interpreter", "code-interpreter-v1":
		spec.FromTemplate, spec.FromImage = "", e2bBaseImage
	}
	var paid int64
	if spec.FromImage != "" {
		n, release, err := sb.acquireBase(ctx, spec.FromImage, job.MaxBytes, log)
		if err != nil {
			return service.Built{}, &template.StepError{Step: 0, Err: err}
		}
		defer release()
		paid = n
	}
	b := *sb.builder
	if bs, ok := b.Sandboxes.(*buildSandboxes); ok {
		steps := *bs
		steps.tenant = job.Tenant
		b.Sandboxes = &steps
	}
	if job.MaxBytes > 0 {
		b.MaxBytes = max(job.MaxBytes-paid, 1) // a base that took it all leaves no room for a layer
	}
	im, added, err := b.BuildSized(ctx, job.Name, spec, files, log)
	return service.Built{Image: im, Added: added + paid}, err
}

// acquireBase makes sure the base ref is in the store for a build: the
// operator's image of that name, one another running build pulled, or
// one it pulls now, within maxBytes (0: the store's bound), whose bytes
// it returns as its to pay. release ends its use: the last build to
// release a base pulled for builds removes its name.
func (sb *serveBuilder) acquireBase(ctx context.Context, ref string, maxBytes int64, log io.Writer) (paid int64, release func(), err error) {
	key, err := image.ParseName(ref)
	if err != nil {
		return 0, nil, err
	}
	sb.mu.Lock()
	pb := sb.bases[key]
	if pb == nil {
		if _, err := sb.store.Get(key); err == nil {
			sb.mu.Unlock()
			return 0, func() {}, nil // the operator's
		}
		if sb.bases == nil {
			sb.bases = map[string]*pulledBase{}
		}
		pb = &pulledBase{ready: make(chan struct{})}
		sb.bases[key] = pb
	}
	pb.users++
	first := pb.users == 1
	sb.mu.Unlock()
	release = func() {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		if pb.users--; pb.users > 0 {
			return
		}
		delete(sb.bases, key)
		if pb.err == nil {
			if err := sb.store.Remove(key); err != nil && !errors.Is(err, image.ErrNotFound) {
				fmt.Fprintf(log, "removing base %s: %v\n", ref, err)
			}
		}
	}
	if first {
		var im image.Image
		im, pb.err = sb.pullBase(ctx, ref, maxBytes, log)
		close(pb.ready)
		paid = im.Size
	} else {
		select {
		case <-pb.ready:
		case <-ctx.Done():
			release()
			return 0, nil, ctx.Err()
		}
	}
	if pb.err != nil {
		release()
		return 0, nil, pb.err
	}
	return paid, release, nil
}

// pullBase pulls a build's base image, from a registry the server pulls
// from, its layers unpacking to at most maxBytes (0: the store's bound).
func (sb *serveBuilder) pullBase(ctx context.Context, ref string, maxBytes int64, log io.Writer) (image.Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return image.Image{}, fmt.Errorf("%w: base image %q: %v", image.ErrBadName, ref, err)
	}
	if reg := r.Context().RegistryStr(); !sb.registries[reg] {
		return image.Image{}, fmt.Errorf("%w: base image %s is not in the server's image store, and this server pulls from "+
			"no registry %s (vivarium serve --pull-registry, or vivarium image pull on the server)", image.ErrNotFound, ref, reg)
	}
	fmt.Fprintf(log, "pulling %s\n", ref)
	ctx, cancel := context.WithTimeout(ctx, maxBasePull)
	defer cancel()
	opts := sb.pull
	opts.MaxBytes = maxBytes
	im, err := image.Pull(ctx, sb.store, ref, opts, nil)
	if err != nil {
		return image.Image{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	return im, nil
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
		o.Mirrors[dockerHub(reg)] = mirror
	}
	return o, nil
}

// buildGroups are a RUN step's supplementary groups as native takes them
// (the builder resolves ids 0 to 65535; native refuses any other).
func buildGroups(groups []int) []uint32 {
	out := make([]uint32, len(groups))
	for i, g := range groups {
		out[i] = uint32(g)
	}
	return out
}

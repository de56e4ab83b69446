package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/vivarium-sandbox/vivarium/internal/hostroot"
	"github.com/vivarium-sandbox/vivarium/internal/image"
)

// W9 is creating a sandbox of a template (issue 28) against a default
// one; W10 building a small template, with its cache and without.
var (
	W9  = Workload{ID: "W9", Title: "create a stateful sandbox of a template (an image's file system), ready for code"}
	W10 = Workload{ID: "W10", Title: "build a template: FROM, ENV, COPY, RUN (vivarium template build)"}
)

// benchTemplate is the template W9 and W10 use: one layer of the host's
// python3, its standard library compiled as the host has it, and a few
// programs (hostroot), in the bench server's store.
const benchTemplate = "vivarium-bench-python:1"

// templates are the server's templates for W9 and W10, made once.
type templates struct {
	srv    *server
	python string
	once   sync.Once
	err    error
	store  *image.Store
	layer  string       // the template's one layer
	cold   atomic.Int64 // cold templates made so far
	dir    string       // W10's build directory
}

// setup starts the server and makes the template in its store.
func (t *templates) setup(ctx context.Context) error {
	if err := t.srv.acquire(ctx); err != nil {
		return err
	}
	t.once.Do(func() { t.err = t.make() })
	return t.err
}

func (t *templates) make() error {
	store, err := image.Open(filepath.Join(t.srv.data, "images"), image.DefaultLimits)
	if err != nil {
		return err
	}
	root, err := os.MkdirTemp(t.srv.data, "template-root-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	if err := hostroot.Layer(root, t.python, true); err != nil {
		return err
	}
	tarred, err := hostroot.Tar(root)
	if err != nil {
		return err
	}
	if t.layer, err = store.AddLayer(strings.NewReader(string(tarred))); err != nil {
		return err
	}
	t.store = store
	if err := t.commit(benchTemplate, ""); err != nil {
		return err
	}
	t.dir = filepath.Join(t.srv.data, "build")
	if err := os.MkdirAll(t.dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(t.dir, "data.txt"), []byte("data\n"), 0o644); err != nil {
		return err
	}
	dockerfile := "FROM " + benchTemplate + "\nENV STAGE=bench\nCOPY data.txt /app/\nRUN echo built > /app/built.txt\n"
	return os.WriteFile(filepath.Join(t.dir, "Dockerfile"), []byte(dockerfile), 0o644)
}

// commit names the template's layer name, with a label that makes its
// configuration (and so its pool) its own.
func (t *templates) commit(name, label string) error {
	cfg := &v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH,
		Config: v1.Config{Env: []string{"PATH=/usr/bin:/bin"}, Labels: map[string]string{"dev.vivarium.bench": label}}}
	_, err := t.store.Commit(name, cfg, []string{t.layer})
	return err
}

// create makes a sandbox of template name and closes it.
func (t *templates) create(ctx context.Context, name string) error {
	var info struct{ ID string }
	if err := t.srv.post(ctx, "POST", "/v1/sandboxes", map[string]any{"template": name}, &info); err != nil {
		return err
	}
	t.srv.reaps.Add(1)
	go func() {
		defer t.srv.reaps.Done()
		t.srv.post(context.Background(), "DELETE", "/v1/sandboxes/"+info.ID, nil, nil)
	}()
	return nil
}

// build runs vivarium template build on W10's directory.
func (t *templates) build(ctx context.Context, extra ...string) error {
	args := append([]string{"template", "build", "--data-dir", t.srv.data, "-t", "vivarium-bench-built:1"}, extra...)
	out, err := exec.CommandContext(ctx, t.srv.bin, append(args, t.dir)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("vivarium template build: %v: %s", err, lastLine(string(out)))
	}
	return nil
}

// templateSubjects are W9's and W10's rows.
func templateSubjects(srv *server, skip, python string) []Subject {
	t := &templates{srv: srv, python: python}
	w9, w10 := W9.Label(), W10.Label()
	return []Subject{
		{Workload: w9, Name: "vivarium serve, POST /v1/sandboxes (the host's Python, no template)", Reference: true,
			Skip: skip, Setup: t.setup, Run: srv.create},
		{Workload: w9, Name: "vivarium serve, POST /v1/sandboxes of a template in use (its pool)",
			Skip: skip, Setup: t.setup,
			Run: func(ctx context.Context) error { return t.create(ctx, benchTemplate) }},
		{Workload: w9, Name: "vivarium serve, the first sandbox of a template (no pool yet)",
			Skip: skip, Setup: t.setup, Iterations: 10,
			// Each iteration's template is new: a configuration of its
			// own, whose first sandbox the pool does not have.
			Ready: func(ctx context.Context) error {
				return t.commit(fmt.Sprintf("vivarium-bench-cold-%d:1", t.cold.Add(1)), fmt.Sprint(t.cold.Load()))
			},
			Run: func(ctx context.Context) error {
				return t.create(ctx, fmt.Sprintf("vivarium-bench-cold-%d:1", t.cold.Load()))
			}},
		// What the goal of the first sandbox compares with: the image's
		// own interpreter started, as the template's layer holds the
		// host's python3.
		{Workload: w9, Name: "python3 -c 'print(1)', the template's interpreter (no isolation)", Peer: true, Skip: skip,
			Run: command{argv: []string{python, "-c", W1.Code}, env: peerEnv(), want: W1.Want}.run},
		{Workload: w10, Name: "vivarium template build, every step cached", Reference: true,
			Skip: skip, Setup: t.setup,
			Run: func(ctx context.Context) error { return t.build(ctx) }},
		{Workload: w10, Name: "vivarium template build --no-cache",
			Skip: skip, Setup: t.setup,
			Run: func(ctx context.Context) error { return t.build(ctx, "--no-cache") }},
	}
}

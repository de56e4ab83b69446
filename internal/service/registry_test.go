package service

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/template"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// fakeRegistry is a real registry (go-containerregistry's, in memory)
// that counts the look-ups of each manifest and can be taken down.
type fakeRegistry struct {
	host  string
	down  atomic.Bool
	mu    sync.Mutex
	heads map[string]int // by path
}

func newFakeRegistry(t *testing.T) *fakeRegistry {
	f := &fakeRegistry{heads: map[string]int{}}
	reg := ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		if r.Method == "HEAD" {
			f.mu.Lock()
			f.heads[r.URL.Path]++
			f.mu.Unlock()
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.host = strings.TrimPrefix(srv.URL, "http://")
	return f
}

func (f *fakeRegistry) headsOf(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.heads[path]
}

func (f *fakeRegistry) options() image.PullOptions {
	return image.PullOptions{Insecure: []string{f.host}}
}

// newImageStore is an image store in a directory of the test's.
func newImageStore(t *testing.T) *image.Store {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a layer's files keep the owners the image gives them")
	}
	s, err := image.Open(filepath.Join(t.TempDir(), "images"), image.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// addImage adds to s an image named ref of one small layer whose
// environment has TPL=tpl.
func addImage(t *testing.T, s *image.Store, ref, tpl string) {
	t.Helper()
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "version"), []byte(tpl), 0o644)
	img := testutil.DirImage(t, dir, v1.Config{Env: []string{"PATH=/usr/bin:/bin", "TPL=" + tpl}})
	if _, err := s.Add(context.Background(), ref, img, nil); err != nil {
		t.Fatal(err)
	}
}

// A node with a template registry makes sandboxes of templates it does
// not have: the operator's shared ones (pushed by vivarium image push)
// and a key's own (pushed by a build on another node), pulled on first
// use through its store, asked about again only after Recheck, a tag
// that moved pulled anew; a key never reaches another key's; a registry
// out of reach leaves the node what it pulled, and names what it lacks.
func TestTemplateRegistry(t *testing.T) {
	reg := newFakeRegistry(t)
	repo := reg.host + "/vivarium"
	ctx := context.Background()

	// The publisher: the operator's store, and another node's builds.
	pub := newImageStore(t)
	addImage(t, pub, "tools:1", "one")
	if _, err := template.Push(ctx, pub, "tools:1", repo+"/tools:1", reg.options(), nil); err != nil {
		t.Fatal(err)
	}
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	other := newRegistry(TemplateRegistry{Repo: repo, Options: reg.options()}, pub, slog.New(slog.DiscardHandler), clock)
	addImage(t, pub, "built", "key's")
	if _, err := other.publish(ctx, "owner-a", "built", "my-env", "", []string{defaultTag, "v2"}); err != nil {
		t.Fatal(err)
	}

	rec := &specs{}
	node := newImageStore(t)
	svc := New(Config{Backend: rec, Images: node, Now: clock,
		Registry: TemplateRegistry{Repo: repo, Options: reg.options()}})
	defer svc.Close()
	create := func(owner, tpl string) (map[string]string, error) {
		t.Helper()
		_, err := svc.Create(ctx, CreateRequest{Owner: owner, Template: tpl})
		if !errors.Is(err, errRecorded) {
			return nil, err
		}
		return rec.last(t).Env, nil
	}
	want := func(owner, tpl, value string) {
		t.Helper()
		env, err := create(owner, tpl)
		if err != nil || env["TPL"] != value {
			t.Fatalf("%s's template %q: TPL=%q, %v; want %q", owner, tpl, env["TPL"], err, value)
		}
	}

	want("owner-b", "tools:1", "one")
	if _, err := node.Get(repo + "/tools@" + mustResolve(t, repo+"/tools:1", reg)); err != nil {
		t.Fatalf("the pulled template is not in the node's store by its digest: %v", err)
	}
	heads := reg.headsOf("/v2/vivarium/tools/manifests/1")
	want("owner-b", "tools:1", "one")
	if n := reg.headsOf("/v2/vivarium/tools/manifests/1"); n != heads {
		t.Errorf("the registry was asked again within Recheck (%d look-ups, %d before)", n, heads)
	}

	// The key's own templates, by name and tag; no other key's.
	want("owner-a", "my-env", "key's")
	want("owner-a", "my-env:v2", "key's")
	if _, err := create("owner-b", "my-env"); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("another key's template: %v", err)
	}
	keyPath := strings.TrimPrefix(other.keyRef("owner-a", "my-env"), repo+"/")
	if _, err := create("owner-b", keyPath); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("another key's template by its path in the registry (%s): %v", keyPath, err)
	}
	if _, err := create("owner-b", "absent:1"); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("a template nowhere: %v", err)
	}

	// The tag moves: within Recheck the node keeps its copy, after it
	// takes the new one.
	addImage(t, pub, "tools:1", "two")
	if _, err := template.Push(ctx, pub, "tools:1", repo+"/tools:1", reg.options(), nil); err != nil {
		t.Fatal(err)
	}
	want("owner-b", "tools:1", "one")
	now.Add(int64(registryRecheck + time.Second))
	want("owner-b", "tools:1", "one") // answered at once, looked up again meanwhile
	testutil.WaitFor(t, 10*time.Second, "the moved tag to be pulled", func() bool {
		env, err := create("owner-b", "tools:1")
		return err == nil && env["TPL"] == "two"
	})

	// Many creations of a template not pulled yet: one look-up, one pull.
	addImage(t, pub, "fresh:1", "fresh")
	if _, err := template.Push(ctx, pub, "fresh:1", repo+"/fresh:1", reg.options(), nil); err != nil {
		t.Fatal(err)
	}
	pushHeads := reg.headsOf("/v2/vivarium/fresh/manifests/1") // the push's own
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_, err := svc.Create(ctx, CreateRequest{Owner: "owner-b", Template: "fresh:1"})
			if !errors.Is(err, errRecorded) {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := reg.headsOf("/v2/vivarium/fresh/manifests/1") - pushHeads; n != 1 {
		reg.mu.Lock()
		t.Errorf("8 creations at once looked the tag up %d times: %v", n, reg.heads)
		reg.mu.Unlock()
	}

	// A hostile image in the registry is refused by the store's checks:
	// the creation fails, and nothing of it is named in the store.
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(evil.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	evilImg, _ := mutate.AppendLayers(empty.Image, layer)
	evilRef, _ := reg.options().Parse(repo + "/evil:1")
	if err := remote.Write(evilRef, evilImg, reg.options().RemoteOptions(ctx)...); err != nil {
		t.Fatal(err)
	}
	if _, err := create("owner-b", "evil:1"); !errors.Is(err, ErrRegistry) {
		t.Errorf("a hostile template: %v", err)
	}
	if list, _ := node.List(); slices.ContainsFunc(list, func(im image.Image) bool { return strings.Contains(im.Name, "evil") }) {
		t.Errorf("the hostile template is in the store: %+v", list)
	}

	// The registry out of reach: what was pulled is used; what was not
	// is an error that says the registry failed.
	reg.down.Store(true)
	now.Add(int64(registryRecheck + time.Second))
	want("owner-b", "tools:1", "two")
	if _, err := create("owner-b", "never:1"); !errors.Is(err, ErrRegistry) {
		t.Errorf("a template not pulled, the registry down: %v", err)
	}
	// A name of another registry is the store's alone.
	if _, err := create("owner-b", "elsewhere.example/tools:1"); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("a name of another registry: %v", err)
	}

	// What the node pulled and no creation used for a day is removed,
	// and pulled again when asked for; the store's own images stay.
	reg.down.Store(false)
	addImage(t, node, "own:1", "own")
	want("owner-b", "fresh:1", "fresh")
	svc.registry.sweep()
	now.Add(int64(registryUnused - time.Minute))
	want("owner-b", "fresh:1", "fresh")
	now.Add(int64(2 * time.Minute))
	svc.registry.sweep()
	list, _ := node.List()
	var names []string
	for _, im := range list {
		names = append(names, im.Name)
	}
	if len(names) != 2 || !slices.Contains(names, "index.docker.io/library/own:1") ||
		!slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, repo+"/fresh@") }) {
		t.Errorf("after the sweep the store holds %q, want own:1 and fresh, which was used", names)
	}
	want("owner-b", "tools:1", "two") // pulled again
}

func mustResolve(t *testing.T, ref string, reg *fakeRegistry) string {
	t.Helper()
	d, err := image.Resolve(context.Background(), ref, reg.options())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The registry's names: a shared template's path under the repository,
// never another registry's nor the keys'; a key's under a digest of it.
func TestTemplateRegistryRefs(t *testing.T) {
	r := &registry{cfg: TemplateRegistry{Repo: "reg.lan:5000/viv"}}
	for in, want := range map[string]string{
		"tools":                   "reg.lan:5000/viv/tools:latest",
		"tools:1":                 "reg.lan:5000/viv/tools:1",
		"team/tools:1":            "reg.lan:5000/viv/team/tools:1",
		"library/tools:1":         "reg.lan:5000/viv/tools:1",
		"tools@sha256:" + hex64:   "reg.lan:5000/viv/tools@sha256:" + hex64,
		"docker.io/tools:1":       "",
		"index.docker.io/tools:1": "",
		"my.env:1":                "reg.lan:5000/viv/my.env:1",
		"reg.lan:5000/viv/x:1":    "",
		"localhost/x:1":           "",
		"keys/k0123/my-env:1":     "",
		"keys:1":                  "",
		"Bad Name":                "",
	} {
		if got := r.sharedRef(in); got != want {
			t.Errorf("sharedRef(%q) = %q, want %q", in, got, want)
		}
	}
	a, b := r.keyRef("owner-a", "my-env"), r.keyRef("owner-b", "my-env")
	if !strings.HasPrefix(a, "reg.lan:5000/viv/keys/k") || !strings.HasSuffix(a, "/my-env:"+defaultTag) || a == b ||
		strings.Contains(a, "owner") {
		t.Errorf("keyRef: %q and %q", a, b)
	}
	if got := r.keyRef("owner-a", "my-env:v2"); !strings.HasSuffix(got, "/my-env:v2") || !strings.HasPrefix(got, strings.TrimSuffix(a, "my-env:"+defaultTag)) {
		t.Errorf("keyRef with a tag: %q", got)
	}
	if r.keyRef("owner-a", "../x") != "" || r.keyRef("owner-a", "") != "" {
		t.Error("keyRef of what cannot be a template's name")
	}
	for _, bad := range []string{"", "reg.lan", "UPPER/x", "reg.lan:5000/"} {
		if (TemplateRegistry{Repo: bad}).Check() == nil && bad != "" {
			t.Errorf("Check(%q) passed", bad)
		}
	}
	if err := (TemplateRegistry{Repo: "reg.lan:5000/viv"}).Check(); err != nil {
		t.Error(err)
	}
}

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

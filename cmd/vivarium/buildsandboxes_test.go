package main

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/template"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A key's build makes the server pull a base only from a registry the
// operator named: another registry (the host's network, a cloud's
// metadata) is refused before any connection, saying how to allow it.
func TestServeBuilderPullsOnlyFromNamedRegistries(t *testing.T) {
	store, err := openImages(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sb := &serveBuilder{store: store, registries: map[string]bool{"index.docker.io": true}}
	for _, ref := range []string{"10.0.0.1:5000/tools:1", "169.254.169.254/x:1", "localhost:5000/y:1", "ghcr.io/a/b:1"} {
		_, err := sb.pullBase(context.Background(), ref, 0, io.Discard)
		if !errors.Is(err, image.ErrNotFound) || !strings.Contains(err.Error(), "--pull-registry") {
			t.Errorf("%s: %v", ref, err)
		}
	}
}

// A base pulled for a key's build is the build's: its bytes count in
// what the build added, its pull stays within the build's budget, and
// its name goes once no build uses it, its layers living on in the
// template built on it. The operator's images stay.
func TestServeBuilderPaysForPulledBases(t *testing.T) {
	testutil.RequireRoot(t) // a layer's files keep the owners the image gives them
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	base, err := random.Image(64<<10, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := host + "/base:1"
	r, _ := name.ParseReference(ref, name.Insecure)
	if err := remote.Write(r, base); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	store, err := openImages(dir)
	if err != nil {
		t.Fatal(err)
	}
	sb := &serveBuilder{store: store, registries: map[string]bool{host: true}, pull: image.PullOptions{Insecure: []string{host}},
		builder: &template.Builder{Store: store, Sandboxes: &buildSandboxes{}, CacheDir: filepath.Join(dir, "cache")}}
	spec := template.Spec{FromImage: ref, Steps: []template.Step{{Type: template.Env, Args: []string{"A", "1"}}}}
	build := func(name string, maxBytes int64) (service.Built, error) {
		return sb.Build(context.Background(), service.BuildJob{Name: name, MaxBytes: maxBytes}, spec, nil, io.Discard)
	}

	// A budget smaller than the base: the pull stops, nothing is named.
	if _, err := build("small:1", 32<<10); !errors.Is(err, image.ErrTooLarge) {
		t.Fatalf("a base past the build's budget: %v", err)
	}
	for _, n := range []string{ref, "small:1"} {
		if _, err := store.Get(n); !errors.Is(err, image.ErrNotFound) {
			t.Errorf("%s is in the store: %v", n, err)
		}
	}

	built, err := build("tpl:1", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if built.Added < 128<<10 || built.Added != built.Image.Size {
		t.Errorf("the build added %d bytes, its image holds %d: the pulled base is its to pay", built.Added, built.Image.Size)
	}
	if _, err := store.Get(ref); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("the pulled base is still named: %v", err)
	}
	if _, err := store.Get("tpl:1"); err != nil {
		t.Errorf("the template: %v", err)
	}

	// The operator's image of the base's name: used, not paid, kept.
	if _, err := image.Pull(context.Background(), store, ref, image.PullOptions{Insecure: []string{host}}, nil); err != nil {
		t.Fatal(err)
	}
	built, err = build("tpl:2", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if built.Added != 0 {
		t.Errorf("a build on the operator's image added %d bytes, want 0", built.Added)
	}
	if _, err := store.Get(ref); err != nil {
		t.Errorf("the operator's image was removed: %v", err)
	}
}

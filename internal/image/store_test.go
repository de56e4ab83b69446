package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// testImage is an image of the given uncompressed layers.
func testImage(t *testing.T, layers ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, l := range layers {
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(l)), nil })
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config.Env = []string{"PATH=/usr/bin"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// dockerArchive writes img as `docker save` does, tagged tag.
func dockerArchive(t *testing.T, img v1.Image, tag string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	r, err := name.ParseReference(tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(p, r, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// ociArchive writes img as an OCI image layout tar, its index
// annotated with ref (when not "").
func ociArchive(t *testing.T, img v1.Image, ref string) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	var opts []layout.Option
	if ref != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "oci.tar")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

func openStore(t *testing.T, lim Limits) (*Store, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "images")
	s, err := Open(dir, lim)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func TestImportAndRemove(t *testing.T) {
	ctx := context.Background()
	s, dir := openStore(t, DefaultLimits)
	base := layerTar(t, entry{name: "usr/bin/python3", body: "python", mode: 0o755})
	app := testImage(t, base, layerTar(t, entry{name: "app/main.py", body: "print(1)"}))
	tool := testImage(t, base, layerTar(t, entry{name: "usr/bin/tool", body: "tool"}))

	var steps []Progress
	a, err := Import(ctx, s, dockerArchive(t, app, "example.test/app:1"), "", func(p Progress) { steps = append(steps, p) })
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != "example.test/app:1" || len(a.Layers) != 2 || a.Size != int64(len("python")+len("print(1)")) {
		t.Errorf("imported %+v", a)
	}
	if len(steps) == 0 || !steps[len(steps)-1].Done || steps[len(steps)-1].Layers != 2 {
		t.Errorf("progress: %+v", steps)
	}
	got, err := os.ReadFile(filepath.Join(s.LayerDir(a.Layers[1]), "app/main.py"))
	if err != nil || string(got) != "print(1)" {
		t.Errorf("app/main.py in its layer: %q %v", got, err)
	}
	cfg, err := s.ConfigFile(a)
	if err != nil || strings.Join(cfg.Config.Env, ",") != "PATH=/usr/bin" {
		t.Errorf("configuration: %+v %v", cfg, err)
	}

	// An OCI layout, named by its annotation; the base layer is shared.
	b, err := Import(ctx, s, ociArchive(t, tool, "example.test/tool:2"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.Name != "example.test/tool:2" || b.Layers[0] != a.Layers[0] {
		t.Errorf("imported %+v", b)
	}
	// A name given overrides the archive's; one without a name is refused.
	if _, err := Import(ctx, s, ociArchive(t, tool, ""), "", nil); !errors.Is(err, ErrBadName) {
		t.Errorf("an archive without a name: %v", err)
	}
	if c, err := Import(ctx, s, ociArchive(t, tool, ""), "other:3", nil); err != nil || c.Name != "index.docker.io/library/other:3" {
		t.Errorf("import with a name: %+v %v", c, err)
	}
	list, err := s.List()
	if err != nil || len(list) != 3 {
		t.Fatalf("List: %v %v", list, err)
	}
	if n := len(dirNames(t, filepath.Join(dir, "layers"))); n != 3*2 {
		t.Errorf("the store holds %d layer entries, want 3 layers and their records", n)
	}

	for _, ref := range []string{"other:3", "example.test/app:1"} {
		if err := s.Remove(ref); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Get("example.test/app:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a removed image: %v", err)
	}
	if err := s.Remove("example.test/app:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a second Remove: %v", err)
	}
	// tool's layers stay; app's own is gone.
	if _, err := os.Stat(s.LayerDir(a.Layers[0])); err != nil {
		t.Errorf("the shared layer went: %v", err)
	}
	if _, err := os.Stat(s.LayerDir(a.Layers[1])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("app's own layer stayed: %v", err)
	}
	if err := s.Remove("example.test/tool:2"); err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"layers", "configs", "staging"} {
		if left := dirNames(t, filepath.Join(dir, sub)); len(left) > 0 {
			t.Errorf("%s holds %v after every image was removed", sub, left)
		}
	}
}

// TestHostileImages: each image is refused with an error that says why,
// and nothing of it is left in the store.
func TestHostileImages(t *testing.T) {
	ctx := context.Background()
	small := Limits{Layers: 8, Bytes: 8 << 20, Files: 1000}
	good := layerTar(t, entry{name: "ok", body: "ok"})

	// A gzip bomb: 64 MiB of zeros in a few kilobytes.
	var bomb bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&bomb, gzip.BestCompression)
	zw.Write(layerTar(t, entry{name: "zeros", size: 64 << 20}))
	zw.Close()
	bombLayer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(bomb.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	bombImg, err := mutate.AppendLayers(testImage(t, good), bombLayer)
	if err != nil {
		t.Fatal(err)
	}
	if bomb.Len() > 1<<20 {
		t.Fatalf("the bomb is %d bytes compressed", bomb.Len())
	}

	// A layer whose content is not what the configuration says.
	forged := testImage(t, good, layerTar(t, entry{name: "evil", body: "evil"}))
	cfg, _ := forged.ConfigFile()
	cfg = cfg.DeepCopy()
	cfg.RootFS.DiffIDs[1] = cfg.RootFS.DiffIDs[0]
	forged, err = mutate.ConfigFile(forged, cfg)
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		img  v1.Image
		want error
		says string
	}{
		{"gzip bomb", bombImg, ErrTooLarge, "8.0 MiB"},
		{"wrong diff ID", forged, ErrRefused, "content's digest"},
		{"hostile layer", testImage(t, good, layerTar(t, entry{name: "../../x", body: "x"})), ErrRefused, "leads out"},
		{"too many layers", manyLayers{n: 10_000}, ErrRefused, "10000 layers"},
		{"huge configuration", manyLayers{n: 1, config: 10 << 30}, ErrRefused, "configuration is larger"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, dir := openStore(t, small)
			_, err := s.Add(ctx, "example.test/hostile:1", c.img, nil)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("err = %v, want %v saying %q", err, c.want, c.says)
			}
			if list, _ := s.List(); len(list) != 0 {
				t.Errorf("the store names %v", list)
			}
			if left := dirNames(t, filepath.Join(dir, "staging")); len(left) > 0 {
				t.Errorf("staging holds %v", left)
			}
			// A layer that was good stays (a later image may use it); no
			// other does.
			for _, n := range dirNames(t, filepath.Join(dir, "layers")) {
				if strings.HasSuffix(n, ".json") {
					continue
				}
				if _, err := os.Stat(filepath.Join(dir, "layers", n, "ok")); err != nil {
					t.Errorf("layers holds %s, which is not the good layer", n)
				}
			}
		})
	}
	t.Run("not an archive", func(t *testing.T) {
		s, _ := openStore(t, small)
		p := filepath.Join(t.TempDir(), "x.tar")
		os.WriteFile(p, bytes.Repeat([]byte("nope"), 1000), 0o644)
		if _, err := Import(ctx, s, p, "x:1", nil); !errors.Is(err, ErrRefused) {
			t.Errorf("err = %v", err)
		}
	})
}

// manyLayers is an image whose manifest lists n layers and a
// configuration of the given size; nothing else of it may be read.
type manyLayers struct {
	v1.Image
	n      int
	config int64 // the configuration's size the manifest gives
}

func (m manyLayers) Manifest() (*v1.Manifest, error) {
	out := &v1.Manifest{SchemaVersion: 2, Config: v1.Descriptor{Size: m.config}}
	for i := range m.n {
		out.Layers = append(out.Layers, v1.Descriptor{Digest: v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%064x", i)}})
	}
	return out, nil
}

func TestPull(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a registry")
	}
	ctx := context.Background()
	addr := testutil.Registry(t)
	img := testImage(t, layerTar(t, entry{name: "etc/os-release", body: "ID=test"}))
	ref, err := name.ParseReference(addr+"/tools:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()

	s, _ := openStore(t, DefaultLimits)
	// Plain HTTP only where the registry is named insecure.
	if _, err := Pull(ctx, s, addr+"/tools:1", PullOptions{}, nil); err == nil {
		t.Error("a pull over plain HTTP from a registry not named insecure worked")
	}
	im, err := Pull(ctx, s, addr+"/tools:1", PullOptions{Insecure: []string{addr}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if im.Digest != want.String() {
		t.Errorf("pulled digest %s, pushed %s", im.Digest, want)
	}
	if got, err := os.ReadFile(filepath.Join(s.LayerDir(im.Layers[0]), "etc/os-release")); err != nil || string(got) != "ID=test" {
		t.Errorf("the pulled layer: %q %v", got, err)
	}
	// Through a mirror: the name stays the registry's.
	im, err = Pull(ctx, s, "registry.invalid/tools:1", PullOptions{Insecure: []string{addr},
		Mirrors: map[string]string{"registry.invalid": addr}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if im.Name != "registry.invalid/tools:1" || im.Digest != want.String() {
		t.Errorf("pulled through the mirror: %+v", im)
	}
	if _, err := Pull(ctx, s, addr+"/absent:1", PullOptions{Insecure: []string{addr}}, nil); err == nil {
		t.Error("a pull of an absent image worked")
	}
}

// A store keeps the names and configurations it read, and sees at once
// what another store of its directory (another process) adds and
// removes; a configuration it gives is the caller's to change.
func TestStoreSeesOtherStores(t *testing.T) {
	ctx := context.Background()
	s, dir := openStore(t, DefaultLimits)
	other, err := Open(dir, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	img := testImage(t, layerTar(t, entry{name: "usr/bin/python3", body: "python", mode: 0o755}))
	names := func() string {
		t.Helper()
		all, err := s.List()
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, im := range all {
			n = append(n, im.Name)
		}
		return strings.Join(n, " ")
	}
	if _, err := Import(ctx, other, dockerArchive(t, img, "example.test/a:1"), "", nil); err != nil {
		t.Fatal(err)
	}
	if got := names(); got != "example.test/a:1" {
		t.Fatalf("after another store's import: %q", got)
	}
	// Read again once refs.json is old enough to be kept (refsSettled),
	// then changed by the other store, twice.
	time.Sleep(refsSettled + 100*time.Millisecond)
	if got := names(); got != "example.test/a:1" || s.refs == nil {
		t.Fatalf("kept: %q (kept %v)", got, s.refs != nil)
	}
	if _, err := Import(ctx, other, dockerArchive(t, img, "example.test/b:1"), "", nil); err != nil {
		t.Fatal(err)
	}
	if got := names(); got != "example.test/a:1 example.test/b:1" {
		t.Fatalf("after a second import: %q", got)
	}
	if err := other.Remove("example.test/a:1"); err != nil {
		t.Fatal(err)
	}
	if got := names(); got != "example.test/b:1" {
		t.Fatalf("after another store's removal: %q", got)
	}
	b, err := s.Get("example.test/b:1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := s.ConfigFile(b)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Config.Env = append(cfg.Config.Env, "MINE=1")
	again, err := s.ConfigFile(b)
	if err != nil || strings.Join(again.Config.Env, ",") != "PATH=/usr/bin" {
		t.Fatalf("the configuration again: %+v %v", again, err)
	}
}

package template

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/image"
)

// testRegistry is an OCI registry (go-containerregistry's, in memory) on
// a loopback port, and the options that reach it over plain HTTP.
func testRegistry(t *testing.T) (string, image.PullOptions) {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	return host, image.PullOptions{Insecure: []string{host}}
}

// TestPushPull pushes a template of the store (a whiteout, an opaque
// directory, hard links, a link, owners and modes, its start command's
// label) to a real registry, pulls it into another store, and finds
// every layer's files, and the configuration, as they were; pushed again
// it is the same manifest, and its base's layer the same blob.
func TestPushPull(t *testing.T) {
	s := newStore(t)
	base, _ := s.Get("base:1")
	id, err := s.AddLayer(bytes.NewReader(tarOf(t,
		tentry{name: "old/.wh.file"},
		tentry{name: "etc/.wh..wh..opq"},
		tentry{name: "etc/passwd", body: passwd, mode: 0o600},
		tentry{name: "x/a", body: "shared", mode: 0o750, uid: 1000},
		tentry{name: "x/b", typ: tar.TypeLink, link: "x/a"},
		tentry{name: "x/up", typ: tar.TypeSymlink, link: "../../etc/passwd"},
		tentry{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
	)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH,
		Config: v1.Config{Env: []string{"PATH=/usr/bin:/bin", "A=1"}, WorkingDir: "/x", User: "user",
			Labels: map[string]string{LabelStartCmd: "sleep 1"}}}
	if _, err := s.Commit("tpl:1", cfg, append(slices.Clone(base.Layers), id)); err != nil {
		t.Fatal(err)
	}

	host, o := testRegistry(t)
	ctx := context.Background()
	dest := host + "/team/tpl:1"
	var sent, total int64
	digest, err := Push(ctx, s, "tpl:1", dest, o, func(s, t int64) { sent, total = s, t })
	if err != nil {
		t.Fatal(err)
	}
	// The store remembers each layer's blob, for the next push.
	for _, l := range append(slices.Clone(base.Layers), id) {
		if p, ok := s.Packed(l); !ok || p.Go != runtime.Version() || p.Size == 0 || p.DiffID == l {
			t.Errorf("layer %s packed as %+v, %v", l, p, ok)
		}
	}
	again, err := Push(ctx, s, "tpl:1", dest, o, nil)
	if err != nil || again != digest {
		t.Fatalf("pushed again: %s %v, first %s", again, err, digest)
	}
	if total == 0 || sent != total {
		t.Errorf("progress of the push: %d of %d bytes", sent, total)
	}
	if d, err := image.Resolve(ctx, dest, o); err != nil || d != digest {
		t.Fatalf("resolved %s %v, pushed %s", d, err, digest)
	}

	s2, err := image.Open(filepath.Join(t.TempDir(), "images"), image.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	got, err := image.Pull(ctx, s2, host+"/team/tpl@"+digest, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != digest || len(got.Layers) != 2 {
		t.Fatalf("pulled %+v, pushed %s", got, digest)
	}
	gotCfg, err := s2.ConfigFile(got)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gotCfg.Config.Env, cfg.Config.Env) || gotCfg.Config.WorkingDir != "/x" ||
		gotCfg.Config.User != "user" || gotCfg.Config.Labels[LabelStartCmd] != "sleep 1" {
		t.Fatalf("configuration pulled: %+v", gotCfg.Config)
	}
	wantLayers := append(slices.Clone(base.Layers), id)
	for i, l := range got.Layers {
		want, have := treeOf(t, s.LayerDir(wantLayers[i])), treeOf(t, s2.LayerDir(l))
		if !slices.Equal(want, have) {
			t.Errorf("layer %d pulled:\n%s\nwas:\n%s", i+1, strings.Join(have, "\n"), strings.Join(want, "\n"))
		}
	}
	// The whiteout, the opaque directory and the hard link are there
	// as overlayfs stacks them (treeOf compares them too; this says so).
	tree := strings.Join(treeOf(t, s2.LayerDir(got.Layers[1])), "\n")
	for _, w := range []string{"old/file c 0:0", "etc drwxr-xr-x 0:0 opaque", "x/b f750 1000:1000 links=2 shared"} {
		if !strings.Contains(tree, w) {
			t.Errorf("pulled layer lacks %q:\n%s", w, tree)
		}
	}

	// The base alone: its one layer is the blob already there.
	baseDigest, err := Push(ctx, s, "base:1", host+"/team/base:1", o, nil)
	if err != nil {
		t.Fatal(err)
	}
	b1, _ := image.Pull(ctx, s2, host+"/team/base@"+baseDigest, o, nil)
	if b1.Layers[0] != got.Layers[0] {
		t.Errorf("the base's layer pulled as %s, the template's first as %s", b1.Layers[0], got.Layers[0])
	}
}

// TestPushRefused: an image the store lacks, and a registry not named
// insecure over plain HTTP, are refused with what is wrong.
func TestPushRefused(t *testing.T) {
	s := newStore(t)
	host, o := testRegistry(t)
	if _, err := Push(context.Background(), s, "nope:1", host+"/x:1", o, nil); err == nil || !strings.Contains(err.Error(), "no such image") {
		t.Errorf("push of an image not there: %v", err)
	}
	_, err := Push(context.Background(), s, "base:1", host+"/x:1", image.PullOptions{}, nil)
	if err == nil || !strings.Contains(err.Error(), "insecure") {
		t.Errorf("push over plain HTTP to a registry not named insecure: %v", err)
	}
}

// treeOf lists a layer's directory: each entry's path, type, mode,
// owners, links, content, link target, and opaque mark.
func treeOf(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		var line string
		switch {
		case fi.Mode()&fs.ModeCharDevice != 0:
			line = fmt.Sprintf("%s c %d:%d", rel, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		case fi.IsDir():
			line = fmt.Sprintf("%s %s %d:%d", rel, fi.Mode(), st.Uid, st.Gid)
			v := make([]byte, 8)
			if n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", v); err == nil && string(v[:n]) == "y" {
				line += " opaque"
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			line = fmt.Sprintf("%s l %d:%d -> %s", rel, st.Uid, st.Gid, l)
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			line = fmt.Sprintf("%s f%o %d:%d links=%d %s", rel, fi.Mode().Perm(), st.Uid, st.Gid, st.Nlink, b)
		default:
			line = rel + " " + fi.Mode().String()
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

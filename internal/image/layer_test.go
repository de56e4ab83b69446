package image

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestAddLayerAndCommit: a layer made on the host passes the same
// unpacking as a pulled one, and an image of such layers is named by
// Commit only when every layer is in the store.
func TestAddLayerAndCommit(t *testing.T) {
	s, dir := openStore(t, DefaultLimits)
	if _, err := s.AddLayer(bytes.NewReader(layerTar(t, entry{name: "../../escape", body: "x"}))); !errors.Is(err, ErrRefused) {
		t.Errorf("a layer with a path out of its root: %v", err)
	}
	if left := dirNames(t, filepath.Join(dir, "staging")); len(left) > 0 {
		t.Errorf("staging holds %v", left)
	}
	tarball := layerTar(t, entry{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n"})
	id, err := s.AddLayer(bytes.NewReader(tarball))
	if err != nil {
		t.Fatal(err)
	}
	if again, err := s.AddLayer(bytes.NewReader(tarball)); err != nil || again != id {
		t.Errorf("the same layer again: %s %v, want %s", again, err, id)
	}
	if !s.HasLayer(id) {
		t.Fatal("HasLayer of the layer added")
	}
	cfg := &v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH, Config: v1.Config{Env: []string{"A=1"}}}
	absent := "sha256:" + string(bytes.Repeat([]byte("0"), 64))
	if _, err := s.Commit("built:1", cfg, []string{id, absent}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Commit of an absent layer: %v", err)
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Errorf("a failed Commit named %v", list)
	}
	im, err := s.Commit("built:1", cfg, []string{id})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Get("built:1")
	if err != nil || got.Config != im.Config || len(got.Layers) != 1 || got.Size != int64(len("root:x:0:0::/root:/bin/sh\n")) {
		t.Errorf("Get: %+v %v, committed %+v", got, err, im)
	}
	back, err := s.ConfigFile(got)
	if err != nil || back.Config.Env[0] != "A=1" || len(back.RootFS.DiffIDs) != 1 || back.RootFS.DiffIDs[0].String() != id {
		t.Errorf("the committed configuration: %+v %v", back, err)
	}
}

// TestHoldKeepsLayers: a layer added and not yet named stays while the
// store is held, through a removal's collection; the next collection
// after the hold takes it.
func TestHoldKeepsLayers(t *testing.T) {
	s, _ := openStore(t, DefaultLimits)
	other, err := s.AddLayer(bytes.NewReader(layerTar(t, entry{name: "other", body: "o"})))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a:1", "b:1"} {
		if _, err := s.Commit(n, &v1.ConfigFile{OS: "linux"}, []string{other}); err != nil {
			t.Fatal(err)
		}
	}
	release, err := s.Hold()
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.AddLayer(bytes.NewReader(layerTar(t, entry{name: "built", body: "b"})))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("a:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.LayerDir(id)); err != nil {
		t.Fatalf("a removal collected a layer while the store was held: %v", err)
	}
	release()
	if err := s.Remove("b:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.LayerDir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the unnamed layer outlived the hold and a collection: %v", err)
	}
}

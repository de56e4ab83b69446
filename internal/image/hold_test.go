package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/layers"
)

// A held layer outlives its image's removal, in this process or
// another, and goes when the last hold does; a hold of a layer already
// collected fails.
func TestHoldLayers(t *testing.T) {
	ctx := context.Background()
	s, dir := openStore(t, DefaultLimits)
	img := testImage(t, layerTar(t, entry{name: "usr/bin/python3", body: "python", mode: 0o755}),
		layerTar(t, entry{name: "app/main.py", body: "print(1)"}))
	im, err := Import(ctx, s, dockerArchive(t, img, "example.test/app:1"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{s.LayerDir(im.Layers[0]), s.LayerDir(im.Layers[1])}
	first, err := layers.HoldLayers(dirs)
	if err != nil {
		t.Fatal(err)
	}
	second, err := layers.HoldLayers(dirs[1:])
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("example.test/app:1"); err != nil {
		t.Fatal(err)
	}
	// Another process's collection: a store of its own on the directory.
	other, err := Open(dir, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.collect(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "app")); err != nil && d == dirs[1] {
			t.Fatalf("a held layer was collected: %v", err)
		}
	}
	first()
	if _, err := os.Stat(dirs[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a layer held no more stayed: %v", err)
	}
	if _, err := os.Stat(dirs[1]); err != nil {
		t.Errorf("a layer still held went: %v", err)
	}
	second()
	for _, sub := range []string{"layers", "configs", "holds"} {
		if left := dirNames(t, filepath.Join(dir, sub)); len(left) > 0 {
			t.Errorf("%s holds %v after the last hold went", sub, left)
		}
	}
	if _, err := layers.HoldLayers(dirs); !errors.Is(err, layers.ErrLayerGone) {
		t.Errorf("holding a collected layer: %v", err)
	}
	if left := dirNames(t, filepath.Join(dir, "holds")); len(left) > 0 {
		t.Errorf("a failed hold left %v", left)
	}
}

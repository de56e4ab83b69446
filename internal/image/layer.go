package image

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// Images made on the host (a template's build) enter the store through
// the same boundary as pulled ones: each layer is an uncompressed tar
// stream, unpacked by unpackLayer (AddLayer), and the image is named
// once all its layers are in (Commit). Between the two, the builder
// holds the store (Hold) so that a removal's collection, in any
// process, cannot take a layer no name uses yet.

// Hold keeps the store's layers and configurations from being collected
// until release is called: it holds gc.lock shared, as an addition
// does. A build holds it from before its first AddLayer (or its first
// look at a cached layer) until its Commit.
func (s *Store) Hold() (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(s.dir, "gc.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil // closing the descriptor drops the lock
}

// AddLayer unpacks the uncompressed tar stream r into the store as a
// layer and returns its diff ID (the digest of r). It is checked as a
// pulled layer is (paths inside the layer, links, devices, set-ID bits,
// the store's bounds) and named only once whole; a layer of the same
// content already in the store is kept as it is. Nothing names it until
// an image does (Commit): hold the store (Hold) in between.
func (s *Store) AddLayer(r io.Reader) (diffID string, err error) {
	err = s.withLock("gc.lock", unix.LOCK_SH, func() error {
		staging, err := os.MkdirTemp(filepath.Join(s.dir, "staging"), "layer-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(staging)
		b := &budget{lim: s.lim}
		if diffID, err = unpackLayer(staging, r, b); err != nil {
			return err
		}
		final := s.LayerDir(diffID)
		if err := os.Rename(staging, final); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, unix.ENOTEMPTY) {
			return err
		}
		// The stream is its own blob: an archive holding this tar
		// uncompressed may reuse the layer.
		return s.addBlob(final+".json", layerMeta{Bytes: b.wrote, Files: b.files}, diffID)
	})
	return diffID, err
}

// HasLayer says whether the store holds the layer diffID whole (its
// directory and its record).
func (s *Store) HasLayer(diffID string) bool {
	_, err := readMeta(s.LayerDir(diffID) + ".json")
	return err == nil
}

// Commit names an image made of the store's layers diffIDs (the lowest
// first) with the configuration cfg, whose rootfs it sets to them. Every
// layer must be in the store already (AddLayer, or an image's). Another
// image of that name is replaced; its layers are collected by the next
// removal if no name uses them.
func (s *Store) Commit(ref string, cfg *v1.ConfigFile, diffIDs []string) (Image, error) {
	n, err := ParseName(ref)
	if err != nil {
		return Image{}, err
	}
	if err := s.checkLayers(len(diffIDs)); err != nil {
		return Image{}, err
	}
	cfg.RootFS = v1.RootFS{Type: "layers"}
	for _, id := range diffIDs {
		h, err := v1.NewHash(id)
		if err != nil {
			return Image{}, fmt.Errorf("layer %.80s: %w", id, err)
		}
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, h)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return Image{}, err
	}
	if len(raw) > maxConfig {
		return Image{}, fmt.Errorf("%w: its configuration is larger than %s", ErrRefused, FormatBytes(maxConfig))
	}
	sum := sha256.Sum256(raw)
	im := Image{Name: n, Config: "sha256:" + hex.EncodeToString(sum[:]), Layers: diffIDs, Stored: time.Now().UTC()}
	im.Digest = im.Config // no manifest: known by its configuration, as an archive's image
	err = s.withLock("gc.lock", unix.LOCK_SH, func() error {
		for _, id := range diffIDs {
			meta, err := readMeta(s.LayerDir(id) + ".json")
			if err != nil {
				return fmt.Errorf("%w: layer %.19s is not in the store", ErrNotFound, id)
			}
			im.Size += meta.Bytes
		}
		if err := writeAtomic(filepath.Join(s.dir, "configs", hex.EncodeToString(sum[:])+".json"), raw); err != nil {
			return err
		}
		return s.withLock("refs.lock", unix.LOCK_EX, func() error {
			refs, err := s.readRefs()
			if err != nil {
				return err
			}
			refs[n] = im
			return s.writeRefs(refs)
		})
	})
	if err != nil {
		return Image{}, err
	}
	return im, nil
}

// Package image keeps OCI images on the host: a store under the data
// directory that holds each image's configuration and each layer,
// unpacked once by its digest (diff ID) and shared by every image that
// has it, and the sources that fill it (a registry, an archive).
//
// Layout of the store's directory (root's, 0700):
//
//	refs.json        name -> Image, rewritten whole under refs.lock
//	configs/HEX.json an image's configuration, by its digest
//	layers/HEX/      a layer unpacked in overlayfs's form, by its diff ID
//	layers/HEX.json  what it holds (bytes, files)
//	staging/         layers being unpacked; renamed into layers/ once verified
//
// Adding an image holds gc.lock shared; removing one drops its name and
// then, holding gc.lock exclusively (when no addition runs, in any
// process), deletes the layers and configurations no name uses and what
// staging holds.
package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vivarium-sandbox/vivarium/internal/layers"
	"golang.org/x/sys/unix"
)

// Image is an image of the store.
type Image struct {
	// Name is the image's reference, normalised
	// ("index.docker.io/library/python:3", "localhost:5000/tools:1").
	Name string `json:"name"`
	// Digest is its manifest's digest (for an image of a docker save
	// archive, which has none, its configuration's); Config its
	// configuration's.
	Digest string `json:"digest"`
	Config string `json:"config"`
	// Layers are the diff IDs of its layers, the lowest first.
	Layers []string `json:"layers"`
	// Size is what its layers take unpacked.
	Size int64 `json:"size"`
	// Stored is when it was added.
	Stored time.Time `json:"stored"`
}

// Progress is where an addition stands.
type Progress struct {
	Layer, Layers int   // the layer being unpacked (1-based), of how many
	Bytes         int64 // bytes of it read so far (uncompressed)
	Done          bool  // the layer is unpacked (or was already)
	Cached        bool  // it was already in the store
}

// Store is an image store in a directory.
type Store struct {
	dir string
	lim Limits

	// What List and ConfigFile read last, kept for the next sandbox of a
	// template: the names while refs.json is the same file, and
	// configurations, which their digests name, for good.
	mu      sync.Mutex
	refs    map[string]Image
	refsID  fileID
	configs map[string]*v1.ConfigFile
}

// fileID tells one version of a file from another: each is a new file
// (writeAtomic), whose inode number may be an older one's but whose
// change time is then later.
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime unix.Timespec
}

func idOf(st *unix.Stat_t) fileID {
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

// Bounds of what the store keeps in memory: configurations, and how old
// (by its change time) a version of refs.json must be when read to be
// kept, so that a later version made within the file system clock's
// granularity (with a reused inode number and the same size) cannot be
// taken for it.
const (
	maxCachedConfigs = 64
	refsSettled      = time.Second
)

// maxConfig bounds an image's configuration.
const maxConfig = 8 << 20

// Open opens the store in dir, making it if needed.
func Open(dir string, lim Limits) (*Store, error) {
	for _, d := range []string{dir, filepath.Join(dir, "configs"), filepath.Join(dir, "layers"), filepath.Join(dir, "staging")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	s := &Store{dir: dir, lim: lim}
	// What a crashed addition left in staging goes when none runs.
	err := s.withLock("gc.lock", unix.LOCK_EX|unix.LOCK_NB, s.clearStaging)
	if err != nil && !errors.Is(err, unix.EWOULDBLOCK) {
		return nil, err
	}
	return s, nil
}

// clearStaging removes what staging holds; gc.lock is held exclusively.
func (s *Store) clearStaging() error {
	entries, err := os.ReadDir(filepath.Join(s.dir, "staging"))
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, os.RemoveAll(filepath.Join(s.dir, "staging", e.Name())))
	}
	return errors.Join(errs...)
}

// ParseName normalises an image reference.
func ParseName(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrBadName, ref, err)
	}
	return r.Name(), nil
}

// LayerDir is the directory of an unpacked layer, by its diff ID.
func (s *Store) LayerDir(diffID string) string {
	return filepath.Join(s.dir, "layers", strings.TrimPrefix(diffID, "sha256:"))
}

// List returns the store's images, by name.
func (s *Store) List() ([]Image, error) {
	refs, err := s.currentRefs()
	if err != nil {
		return nil, err
	}
	out := make([]Image, 0, len(refs))
	for _, im := range refs {
		im.Layers = slices.Clone(im.Layers) // refs is shared
		out = append(out, im)
	}
	slices.SortFunc(out, func(a, b Image) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Get returns the image ref names.
func (s *Store) Get(ref string) (Image, error) {
	n, err := ParseName(ref)
	if err != nil {
		return Image{}, err
	}
	all, err := s.List()
	if err != nil {
		return Image{}, err
	}
	for _, im := range all {
		if im.Name == n {
			return im, nil
		}
	}
	return Image{}, fmt.Errorf("%w: %s", ErrNotFound, ref)
}

// currentRefs is refs.json's names, read again only when it is another
// file than the one read last. The map is shared: not to be changed.
func (s *Store) currentRefs() (map[string]Image, error) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(s.dir, "refs.json"), &st); err == nil {
		s.mu.Lock()
		refs, id := s.refs, s.refsID
		s.mu.Unlock()
		if refs != nil && id == idOf(&st) {
			return refs, nil
		}
	}
	var refs map[string]Image
	var id fileID
	read := time.Now()
	err := s.withLock("refs.lock", unix.LOCK_SH, func() (err error) {
		refs, id, err = s.readRefsID()
		return err
	})
	if err != nil {
		return nil, err
	}
	if id != (fileID{}) && time.Unix(id.ctime.Unix()).Before(read.Add(-refsSettled)) {
		s.mu.Lock()
		s.refs, s.refsID = refs, id
		s.mu.Unlock()
	}
	return refs, nil
}

// ConfigFile returns an image's configuration, the caller's to change.
func (s *Store) ConfigFile(im Image) (*v1.ConfigFile, error) {
	s.mu.Lock()
	cfg := s.configs[im.Config]
	s.mu.Unlock()
	if cfg != nil {
		return cfg.DeepCopy(), nil
	}
	b, err := os.ReadFile(filepath.Join(s.dir, "configs", strings.TrimPrefix(im.Config, "sha256:")+".json"))
	if err != nil {
		return nil, err
	}
	if cfg, err = v1.ParseConfigFile(bytes.NewReader(b)); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if len(s.configs) >= maxCachedConfigs {
		clear(s.configs)
	}
	if s.configs == nil {
		s.configs = map[string]*v1.ConfigFile{}
	}
	s.configs[im.Config] = cfg.DeepCopy()
	s.mu.Unlock()
	return cfg, nil
}

// Remove deletes the image ref names, and what no other image uses.
func (s *Store) Remove(ref string) error {
	n, err := ParseName(ref)
	if err != nil {
		return err
	}
	err = s.withLock("refs.lock", unix.LOCK_EX, func() error {
		refs, err := s.readRefs()
		if err != nil {
			return err
		}
		if _, ok := refs[n]; !ok {
			return fmt.Errorf("%w: %s", ErrNotFound, ref)
		}
		delete(refs, n)
		return s.writeRefs(refs)
	})
	if err != nil {
		return err
	}
	return s.collect()
}

// collect deletes the layers and configurations no image names, and
// staging's leftovers, when no addition runs; otherwise the next removal
// does.
func (s *Store) collect() error {
	err := s.withLock("gc.lock", unix.LOCK_EX|unix.LOCK_NB, func() error {
		var refs map[string]Image
		err := s.withLock("refs.lock", unix.LOCK_SH, func() (err error) {
			refs, err = s.readRefs()
			return err
		})
		if err != nil {
			return err
		}
		keep := map[string]bool{}
		for _, im := range refs {
			keep[strings.TrimPrefix(im.Config, "sha256:")+".json"] = true
			for _, l := range im.Layers {
				h := strings.TrimPrefix(l, "sha256:")
				keep[h], keep[h+".json"] = true, true
			}
		}
		held := layers.NewHeldCheck(s.dir)
		defer held.Close()
		var errs []error
		for _, sub := range []string{"configs", "layers"} {
			entries, err := os.ReadDir(filepath.Join(s.dir, sub))
			if err != nil {
				return err
			}
			// A layer's record before its directory: a record names a
			// whole layer, and a collection cut short must not leave one
			// naming a half-removed directory (a build's cache and an
			// addition reuse a layer by its record).
			slices.SortStableFunc(entries, func(a, b os.DirEntry) int {
				return cmpBool(strings.HasSuffix(b.Name(), ".json"), strings.HasSuffix(a.Name(), ".json"))
			})
			for _, e := range entries {
				if keep[e.Name()] {
					continue
				}
				// A layer a sandbox still stacks stays, its record with
				// it, until the last hold goes (hold.go).
				if sub == "layers" && held.Elsewhere(strings.TrimSuffix(e.Name(), ".json")) {
					continue
				}
				errs = append(errs, os.RemoveAll(filepath.Join(s.dir, sub, e.Name())))
			}
		}
		errs = append(errs, s.clearStaging())
		return errors.Join(errs...)
	})
	if errors.Is(err, unix.EWOULDBLOCK) {
		return nil
	}
	return err
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// rawLayers is an image whose layers are read uncompressed (an
// archive's: go-containerregistry would compress them to give their
// blobs).
type rawLayers struct{ v1.Image }

// layerMeta is what layers/HEX.json says of a layer.
type layerMeta struct {
	Bytes int64 `json:"bytes"`
	Files int64 `json:"files"`
	// Blobs are the digests of the blobs (compressed or not) seen to
	// unpack to this layer. An image whose blob is not among them has its
	// blob unpacked again: a manifest cannot borrow a layer it does not
	// have by naming its diff ID.
	Blobs []string `json:"blobs"`
	// Packed is the layer written again as a blob (a push), if it was.
	Packed *Packed `json:"packed,omitempty"`
}

// Packed is a layer of the store written again as a gzipped tar, as a
// push sends it (template.Push): the tar's digest, the blob's digest and
// size, and the Go version whose compress/gzip wrote it (another may
// write other bytes for the same tar). The store's layers do not change,
// so a push after the first knows its blob without writing it.
type Packed struct {
	DiffID string `json:"diffID"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	Go     string `json:"go"`
}

// Packed returns what the layer diffID was packed as, if it was.
func (s *Store) Packed(diffID string) (Packed, bool) {
	meta, err := readMeta(s.LayerDir(diffID) + ".json")
	if err != nil || meta.Packed == nil {
		return Packed{}, false
	}
	return *meta.Packed, true
}

// SetPacked records what the layer diffID was packed as.
func (s *Store) SetPacked(diffID string, p Packed) error {
	path := s.LayerDir(diffID) + ".json"
	return s.withLock("refs.lock", unix.LOCK_EX, func() error {
		meta, err := readMeta(path)
		if err != nil {
			return err
		}
		meta.Packed = &p
		raw, err := json.Marshal(meta)
		if err != nil {
			return err
		}
		return writeAtomic(path, raw)
	})
}

// Add stores img under the name ref: its configuration, and each of its
// layers not yet in the store, unpacked and checked against the diff ID
// its configuration gives. progress, if not nil, hears of each layer.
// On failure nothing of img is named and its staging is removed.
func (s *Store) Add(ctx context.Context, ref string, img v1.Image, progress func(Progress)) (Image, error) {
	return s.AddWithin(ctx, ref, img, 0, progress)
}

// AddWithin is Add, its layers unpacking to at most maxBytes (0: the
// store's bound).
func (s *Store) AddWithin(ctx context.Context, ref string, img v1.Image, maxBytes int64, progress func(Progress)) (Image, error) {
	lim := s.lim
	if maxBytes > 0 {
		lim.Bytes = min(lim.Bytes, maxBytes)
	}
	n, err := ParseName(ref)
	if err != nil {
		return Image{}, err
	}
	if progress == nil {
		progress = func(Progress) {}
	}
	var out Image
	err = s.withLock("gc.lock", unix.LOCK_SH, func() error {
		var err error
		out, err = s.add(ctx, n, img, lim, progress)
		return err
	})
	return out, err
}

func (s *Store) add(ctx context.Context, n string, img v1.Image, lim Limits, progress func(Progress)) (Image, error) {
	// An archive's image has no manifest of its own: go-containerregistry
	// would compress every layer to make one. Its layers are counted
	// from its configuration, and it is known by its configuration's
	// digest (as Docker knows an image by its ID).
	r, uncompressed := img.(rawLayers)
	var m *v1.Manifest
	if uncompressed {
		img = r.Image
	} else {
		var err error
		if m, err = img.Manifest(); err != nil {
			return Image{}, err
		}
		if err := s.checkLayers(len(m.Layers)); err != nil {
			return Image{}, err
		}
		// The manifest's word on the configuration's size first: a
		// source is read whole for it.
		if m.Config.Size > maxConfig {
			return Image{}, fmt.Errorf("%w: its configuration is larger than %s", ErrRefused, FormatBytes(maxConfig))
		}
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return Image{}, err
	}
	if len(raw) > maxConfig {
		return Image{}, fmt.Errorf("%w: its configuration is larger than %s", ErrRefused, FormatBytes(maxConfig))
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return Image{}, fmt.Errorf("%w: its configuration: %v", ErrRefused, err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return Image{}, fmt.Errorf("%w: it is an image for %s, not linux", ErrRefused, cfg.OS)
	}
	diffIDs := cfg.RootFS.DiffIDs
	if err := s.checkLayers(len(diffIDs)); err != nil {
		return Image{}, err
	}
	if m != nil && len(diffIDs) != len(m.Layers) {
		return Image{}, fmt.Errorf("%w: its configuration lists %d layers, its manifest %d", ErrRefused, len(diffIDs), len(m.Layers))
	}
	layers, err := img.Layers()
	if err != nil {
		return Image{}, err
	}
	b := &budget{lim: lim}
	im := Image{Name: n, Stored: time.Now().UTC()}
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return Image{}, err
		}
		want := diffIDs[i]
		if want.Algorithm != "sha256" || len(want.Hex) != 64 {
			return Image{}, fmt.Errorf("%w: layer %d has a diff ID that is not sha256 (%.80s)", ErrRefused, i+1, want.String())
		}
		meta, err := s.unpack(l, want.String(), uncompressed, b, func(bytes int64) {
			progress(Progress{Layer: i + 1, Layers: len(layers), Bytes: bytes})
		})
		if err != nil {
			return Image{}, fmt.Errorf("layer %d of %d: %w", i+1, len(layers), err)
		}
		progress(Progress{Layer: i + 1, Layers: len(layers), Bytes: meta.Bytes, Done: true})
		im.Layers = append(im.Layers, want.String())
		im.Size += meta.Bytes
	}
	sum := sha256.Sum256(raw)
	im.Config = "sha256:" + hex.EncodeToString(sum[:])
	if m != nil && im.Config != m.Config.Digest.String() {
		return Image{}, fmt.Errorf("%w: its configuration's digest is %s, where its manifest says %s", ErrRefused, im.Config, m.Config.Digest)
	}
	if err := writeAtomic(filepath.Join(s.dir, "configs", hex.EncodeToString(sum[:])+".json"), raw); err != nil {
		return Image{}, err
	}
	im.Digest = im.Config
	if !uncompressed {
		d, err := img.Digest()
		if err != nil {
			return Image{}, err
		}
		im.Digest = d.String()
	}
	err = s.withLock("refs.lock", unix.LOCK_EX, func() error {
		refs, err := s.readRefs()
		if err != nil {
			return err
		}
		refs[n] = im
		return s.writeRefs(refs)
	})
	return im, err
}

// checkLayers refuses an image of more layers than the store allows.
// CheckLayers fails when an image of n layers is more than the store
// takes: a build checks it as its layers are made.
func (s *Store) CheckLayers(n int) error { return s.checkLayers(n) }

// LayerBytes is what the layer diffID holds unpacked.
func (s *Store) LayerBytes(diffID string) (int64, error) {
	m, err := readMeta(s.LayerDir(diffID) + ".json")
	if err != nil {
		return 0, fmt.Errorf("%w: layer %.19s is not in the store", ErrNotFound, diffID)
	}
	return m.Bytes, nil
}

func (s *Store) checkLayers(n int) error {
	if n > s.lim.Layers {
		return fmt.Errorf("%w: it has %d layers, more than the %d allowed", ErrRefused, n, s.lim.Layers)
	}
	return nil
}

// unpack makes the layer diffID in the store from l, unless the store
// has it from the same blob.
//
// The reuse is the store's owner's: a manifest that names a blob the
// store has seen gets its layer without serving it. That is right for
// the images an operator pulls; a build on behalf of a client that must
// not borrow others' layers will have to fetch and check each blob.
func (s *Store) unpack(l v1.Layer, diffID string, raw bool, b *budget, read func(int64)) (layerMeta, error) {
	final := s.LayerDir(diffID)
	var blob v1.Hash
	var err error
	if raw {
		// An archive's own layers are uncompressed tars: the blob is the
		// content, its digest the diff ID (checked as it is unpacked).
		blob, err = v1.NewHash(diffID)
	} else {
		blob, err = l.Digest()
	}
	if err != nil {
		return layerMeta{}, err
	}
	meta, err := readMeta(final + ".json")
	if err == nil && slices.Contains(meta.Blobs, blob.String()) {
		return meta, b.addWrite(meta.Bytes)
	}
	staging, err := os.MkdirTemp(filepath.Join(s.dir, "staging"), "layer-")
	if err != nil {
		return layerMeta{}, err
	}
	defer os.RemoveAll(staging)
	open := l.Compressed
	if raw {
		open = l.Uncompressed
	}
	rc, err := open()
	if err != nil {
		return layerMeta{}, err
	}
	defer rc.Close()
	blobHash := sha256.New()
	var ur io.ReadCloser = io.NopCloser(io.TeeReader(rc, blobHash))
	if !raw {
		if ur, err = decompress(io.TeeReader(rc, blobHash)); err != nil {
			return layerMeta{}, err
		}
	}
	defer ur.Close()
	files0, wrote0 := b.files, b.wrote
	got, err := unpackLayer(staging, &progressReader{r: ur, f: read}, b)
	if err != nil {
		return layerMeta{}, err
	}
	// What follows the compressed stream is part of the blob too.
	if _, err := io.Copy(io.Discard, io.LimitReader(rc, b.lim.Bytes)); err != nil {
		return layerMeta{}, err
	}
	if got != diffID {
		return layerMeta{}, fmt.Errorf("%w: its content's digest is %s, where the image says %s", ErrRefused, got, diffID)
	}
	if sum := "sha256:" + hex.EncodeToString(blobHash.Sum(nil)); blob.Algorithm != "sha256" || sum != blob.String() {
		return layerMeta{}, fmt.Errorf("%w: its blob's digest is %s, where the manifest says %s", ErrRefused, sum, blob)
	}
	fresh := layerMeta{Bytes: b.wrote - wrote0, Files: b.files - files0}
	// The directory first, then its record: a record names a whole
	// layer. Where another addition made it meanwhile, its content is
	// the same (the same diff ID).
	if err := os.Rename(staging, final); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, unix.ENOTEMPTY) {
		return layerMeta{}, err
	}
	return fresh, s.addBlob(final+".json", fresh, blob.String())
}

// addBlob records that blob unpacks to the layer whose record is path.
func (s *Store) addBlob(path string, fresh layerMeta, blob string) error {
	return s.withLock("refs.lock", unix.LOCK_EX, func() error {
		meta, err := readMeta(path)
		if err != nil {
			meta = fresh
		}
		if !slices.Contains(meta.Blobs, blob) {
			meta.Blobs = append(meta.Blobs, blob)
		}
		raw, err := json.Marshal(meta)
		if err != nil {
			return err
		}
		return writeAtomic(path, raw)
	})
}

func readMeta(path string) (layerMeta, error) {
	var m layerMeta
	b, err := os.ReadFile(path)
	if err != nil {
		return m, err
	}
	return m, json.Unmarshal(b, &m)
}

// progressReader tells f how many bytes have been read, at most every
// MiB.
type progressReader struct {
	r         io.Reader
	f         func(int64)
	n, toldAt int64
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if p.n += int64(n); p.n-p.toldAt >= 1<<20 {
		p.toldAt = p.n
		p.f(p.n)
	}
	return n, err
}

func (s *Store) readRefs() (map[string]Image, error) {
	refs, _, err := s.readRefsID()
	return refs, err
}

// readRefsID is readRefs with the identity of the file it read (zero if
// there is none yet).
func (s *Store) readRefsID() (map[string]Image, fileID, error) {
	refs := map[string]Image{}
	f, err := os.Open(filepath.Join(s.dir, "refs.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return refs, fileID{}, nil
	}
	if err != nil {
		return nil, fileID{}, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fileID{}, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fileID{}, err
	}
	if err := json.Unmarshal(b, &refs); err != nil {
		return nil, fileID{}, fmt.Errorf("the image store's refs.json: %w", err)
	}
	return refs, idOf(&st), nil
}

func (s *Store) writeRefs(refs map[string]Image) error {
	b, err := json.MarshalIndent(refs, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(s.dir, "refs.json"), b)
}

// withLock runs fn holding the flock how on the store's file name.
func (s *Store) withLock(file string, how int, fn func() error) error {
	f, err := os.OpenFile(filepath.Join(s.dir, file), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		return err
	}
	return fn()
}

// writeAtomic writes a file whole, or leaves what was there.
func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// A layer's last hold released collects its store (layers.HoldLayers).
func init() { layers.Collect = func(dir string) { (&Store{dir: dir}).collect() } }

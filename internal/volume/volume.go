// Package volume keeps named persistent volumes, owned by an API key (a
// tenant) and mounted into sandboxes, under the server's data directory.
//
// Each volume is an ext4 file system in a sparse image file of its own,
// made by mkfs.ext4: its size limit is the file system's, enforced by the
// kernel (a write past it fails with ENOSPC in the sandbox), and the host
// disk holds at most that many bytes of it. While a sandbox or a content
// request uses a volume, its image is attached to a loop device (with
// autoclear: the device detaches when its file system's last mount is
// gone) and mounted, nosuid, nodev and noexec, detached: the server holds
// the mount by a descriptor and no mount namespace of the host's has it,
// so none made meanwhile can keep a copy. Each sandbox gets a mount of its
// own (Lease.Mount). When the last user is gone the server lets go of its
// mount. A sandbox never sees the image itself, only the file system the
// kernel keeps in it.
//
// Ownership in a volume is canonical: what a sandbox's user (uid 1000 in
// every sandbox) writes is owned by 1000 on disk, whichever host uids the
// sandbox's user namespace maps (backends translate, see the native
// backend's idmapped mounts); the content API reads and writes as 1000
// too, with that user's permissions (Dir).
//
// Layout of Config.Dir (mode 0700): <id>/meta.json, <id>/image (and an
// empty <id>/mnt of earlier versions, which mounted volumes there).
package volume

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/hostdisk"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// Sizes and counts.
const (
	DefaultSize        = 1 << 30  // a volume's size when its creator names none
	MinSize            = 16 << 20 // below this ext4 keeps little room for files
	DefaultMaxSize     = 10 << 30 // the operator's cap when Config names none
	DefaultMaxPerOwner = 20
	DefaultMaxMounted  = 256
	// MaxNameLen bounds a volume's name.
	MaxNameLen = 63
)

// OwnerUID and OwnerGID own a new volume's root and what the content API
// writes: the sandbox user of every backend.
const (
	OwnerUID = 1000
	OwnerGID = 1000
)

// Config is where volumes live and how large and many they may be.
type Config struct {
	Dir string // e.g. <data dir>/volumes; created with mode 0700
	// MaxSize caps a volume's size; zero: DefaultMaxSize.
	MaxSize int64
	// DefaultSize is a new volume's size when none is asked; zero:
	// DefaultSize, or MaxSize if that is smaller.
	DefaultSize int64
	// MaxPerOwner bounds the volumes one owner keeps; zero:
	// DefaultMaxPerOwner.
	MaxPerOwner int
	// MaxMounted bounds the volumes mounted at once, each a loop device
	// of the host's; zero: DefaultMaxMounted.
	MaxMounted int
	// Node is the cluster node this server is ("": none), named in the
	// ids of its volumes (sandboxid) so that a gateway finds them.
	Node   string
	Logger *slog.Logger
}

// Volume is what an owner sees of a volume.
type Volume struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Size      int64     `json:"size" doc:"bytes the volume's file system holds at most"`
	CreatedAt time.Time `json:"created_at"`
}

// meta is a volume's record on disk.
type meta struct {
	Volume
	Owner string `json:"owner"`
}

type entry struct {
	meta
	users     int // leases held by sandboxes and content requests
	sandboxes int // of them, sandboxes'
	deleting  bool
	// While a lease is held (users > 0): the loop device, and the
	// server's own mount of it (detached, newMount), which keeps the
	// device for the leases; nil otherwise.
	dev string
	mnt *os.File
	// mounting serialises making the mount, which may wait seconds for
	// a device an ending sandbox still holds: per volume, so that no
	// other volume's lease waits on it.
	mounting sync.Mutex
}

// Store keeps the volumes of every owner.
type Store struct {
	cfg         Config
	unavailable error // why volumes cannot be kept here; nil: they can
	mu          sync.Mutex
	vols        map[string]*entry // by ID
	mounted     int               // of them, mounted
	lock        *os.File          // held while the store is open: one per directory
	closed      bool
}

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`) })

// ValidName checks a volume's name: 1 to 63 letters, digits, '_', '.' and
// '-', starting with a letter or digit (so never "." or "..", never a
// path).
func ValidName(name string) error {
	if len(name) == 0 || len(name) > MaxNameLen || !nameRE().MatchString(name) {
		return fmt.Errorf("%w: a volume name is 1 to %d letters, digits, '_', '.' and '-', starting with a letter or digit",
			ErrInvalid, MaxNameLen)
	}
	return nil
}

// Open opens the store in cfg.Dir, creating it, and probes that this host
// can keep volumes: a small image is made, attached to a loop device,
// mounted and written. Where it cannot, Open still succeeds and every
// creation and mount answers ErrUnavailable with the reason (Unavailable).
// Mounts left by a server that did not stop cleanly are removed.
func Open(cfg Config) (*Store, error) {
	if cfg.MaxSize <= 0 {
		cfg.MaxSize = DefaultMaxSize
	}
	if cfg.MaxSize < MinSize {
		return nil, fmt.Errorf("%w: the largest volume must be at least %d MiB", ErrInvalid, MinSize>>20)
	}
	if cfg.DefaultSize <= 0 {
		cfg.DefaultSize = min(DefaultSize, cfg.MaxSize)
	}
	if cfg.DefaultSize < MinSize || cfg.DefaultSize > cfg.MaxSize {
		return nil, fmt.Errorf("%w: the default volume size must be between %d MiB and the largest", ErrInvalid, MinSize>>20)
	}
	if cfg.MaxPerOwner <= 0 {
		cfg.MaxPerOwner = DefaultMaxPerOwner
	}
	if cfg.MaxMounted <= 0 {
		cfg.MaxMounted = DefaultMaxMounted
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes directory: %w", err)
	}
	if err := os.Chmod(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("volumes directory: %w", err)
	}
	if abs, err := filepath.Abs(cfg.Dir); err == nil {
		cfg.Dir = abs
	}
	s := &Store{cfg: cfg, vols: map[string]*entry{}}
	// One store per directory: another's sweep would unmount this one's
	// volumes under it.
	lock, err := os.OpenFile(filepath.Join(cfg.Dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("volumes directory: %w", err)
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		s.unavailable = fmt.Errorf("another server keeps the volumes in %s (its lock is held): one server per data directory", cfg.Dir)
		cfg.Logger.Warn("volumes unavailable", "err", s.unavailable)
		return s, nil
	}
	s.lock = lock
	sweepMounts(cfg.Dir, cfg.Logger)
	ents, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("volumes directory: %w", err)
	}
	for _, de := range ents {
		if !sandboxid.Volume.Valid(de.Name()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(cfg.Dir, de.Name(), "meta.json"))
		if err != nil {
			// A creation that did not finish: nothing was promised.
			cfg.Logger.Warn("volume without a record removed", "id", de.Name())
			os.RemoveAll(filepath.Join(cfg.Dir, de.Name()))
			continue
		}
		var m meta
		if err := json.Unmarshal(b, &m); err != nil || m.ID != de.Name() {
			return nil, fmt.Errorf("volume %s: unreadable record", de.Name())
		}
		s.vols[m.ID] = &entry{meta: m}
	}
	s.unavailable = probe(cfg.Dir)
	if s.unavailable != nil {
		cfg.Logger.Warn("volumes unavailable", "err", s.unavailable)
	}
	return s, nil
}

// errUnavailable is what clients are told where the probe failed; the
// reason, which names the host's paths and devices, is the server's log's.
var errUnavailable = fmt.Errorf("%w: this host cannot keep volumes (the server's log says why)", ErrUnavailable)

// Unavailable returns nil if volumes can be kept and mounted here, or why
// not.
func (s *Store) Unavailable() error { return s.unavailable }

func (s *Store) dir(id string) string { return filepath.Join(s.cfg.Dir, id) }

// Create makes a volume of the owner's, of size bytes (0: the default).
func (s *Store) Create(owner, name string, size int64) (Volume, error) {
	if err := ValidName(name); err != nil {
		return Volume{}, err
	}
	if size == 0 {
		size = s.cfg.DefaultSize
	}
	if size < MinSize || size > s.cfg.MaxSize {
		return Volume{}, fmt.Errorf("%w: a volume's size must be between %d MiB and %d MiB on this server",
			ErrInvalid, MinSize>>20, s.cfg.MaxSize>>20)
	}
	if s.unavailable != nil {
		return Volume{}, errUnavailable
	}
	if err := hostdisk.Fits(s.cfg.Dir, size, fmt.Sprintf("a volume of %d MiB", size>>20)); err != nil {
		return Volume{}, err
	}
	id := sandboxid.Volume.New(s.cfg.Node)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Volume{}, fmt.Errorf("%w: the server is shutting down", ErrUnavailable)
	}
	n := 0
	for _, e := range s.vols {
		if e.Owner == owner {
			if e.Name == name {
				s.mu.Unlock()
				return Volume{}, fmt.Errorf("%w: this key already has a volume named %q", ErrExists, name)
			}
			n++
		}
	}
	if n >= s.cfg.MaxPerOwner {
		s.mu.Unlock()
		return Volume{}, fmt.Errorf("%w: this key may keep %d volumes; delete one first", ErrQuota, s.cfg.MaxPerOwner)
	}
	// Reserved under the lock (name and count), made outside it.
	e := &entry{meta: meta{Volume: Volume{ID: id, Name: name, Size: size, CreatedAt: time.Now().UTC()}, Owner: owner},
		deleting: true}
	s.vols[id] = e
	s.mu.Unlock()

	err := s.make(e.meta)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		delete(s.vols, id)
		os.RemoveAll(s.dir(id))
		return Volume{}, err
	}
	e.deleting = false
	return e.Volume, nil
}

// make creates the volume's directory, image, file system and record.
func (s *Store) make(m meta) error {
	dir := s.dir(m.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("volume directory: %w", err)
	}
	if err := makeImage(filepath.Join(dir, "image"), m.Size); err != nil {
		return err
	}
	b, _ := json.Marshal(m)
	tmp := filepath.Join(dir, "meta.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("volume record: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, "meta.json"))
}

// lookup finds an owner's volume by ID or, failing that, by name; the
// caller holds s.mu.
func (s *Store) lookup(owner, idOrName string) (*entry, error) {
	if e, ok := s.vols[idOrName]; ok && e.Owner == owner && !e.deleting {
		return e, nil
	}
	for _, e := range s.vols {
		if e.Owner == owner && e.Name == idOrName && !e.deleting {
			return e, nil
		}
	}
	return nil, fmt.Errorf("%w: this key has no volume %q", ErrNotFound, idOrName)
}

// OwnerOf returns the owner of the volume id, for what checks a
// credential of that one volume's (a volume token) without a key.
func (s *Store) OwnerOf(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.vols[id]; ok && !e.deleting {
		return e.Owner, true
	}
	return "", false
}

// Get returns an owner's volume by ID or name. Another owner's is
// ErrNotFound, as one that does not exist.
func (s *Store) Get(owner, idOrName string) (Volume, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.lookup(owner, idOrName)
	if err != nil {
		return Volume{}, err
	}
	return e.Volume, nil
}

// List returns an owner's volumes, by name.
func (s *Store) List(owner string) []Volume {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Volume{}
	for _, e := range s.vols {
		if e.Owner == owner && !e.deleting {
			out = append(out, e.Volume)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Delete removes an owner's volume and everything in it. A volume that a
// sandbox mounts, running or paused, is ErrInUse: close the sandbox first.
func (s *Store) Delete(owner, idOrName string) error {
	s.mu.Lock()
	e, err := s.lookup(owner, idOrName)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	if e.sandboxes > 0 {
		s.mu.Unlock()
		return fmt.Errorf("%w: volume %q is mounted by %d sandbox(es), running or paused; close them first", ErrInUse, e.Name,
			e.sandboxes)
	}
	if e.users > 0 {
		s.mu.Unlock()
		return fmt.Errorf("%w: volume %q is being read or written; try again", ErrInUse, e.Name)
	}
	e.deleting = true
	s.mu.Unlock()
	err = os.RemoveAll(s.dir(e.ID))
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		e.deleting = false
		return fmt.Errorf("delete volume %q: %w", e.Name, err)
	}
	delete(s.vols, e.ID)
	return nil
}

// Lease is one use of a mounted volume. Release it once: the last
// release unmounts the volume.
type Lease struct {
	s        *Store
	e        *entry
	sandbox  bool
	once     sync.Once
	released bool // under s.mu
	// Volume is the volume leased.
	Volume Volume
}

// Acquire mounts an owner's volume (by ID or name), if it is not already,
// for a sandbox (forSandbox: Delete refuses while it holds the lease) or a
// content request.
func (s *Store) Acquire(owner, idOrName string, forSandbox bool) (*Lease, error) {
	if s.unavailable != nil {
		return nil, errUnavailable
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: the server is shutting down", ErrUnavailable)
	}
	e, err := s.lookup(owner, idOrName)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	// Counted first: Delete refuses it, and no release unmounts it,
	// while it is being mounted.
	e.users++
	if forSandbox {
		e.sandboxes++
	}
	s.mu.Unlock()
	l := &Lease{s: s, e: e, sandbox: forSandbox, Volume: e.Volume}
	if err := s.mount(e); err != nil {
		l.Release()
		return nil, err
	}
	return l, nil
}

// mount mounts e's image unless it is mounted: once, however many leases
// ask at once (two mounts of one image would be two file systems writing
// one disk), and outside the store's lock.
func (s *Store) mount(e *entry) error {
	e.mounting.Lock()
	defer e.mounting.Unlock()
	s.mu.Lock()
	if e.mnt != nil {
		s.mu.Unlock()
		return nil
	}
	if s.mounted >= s.cfg.MaxMounted {
		s.mu.Unlock()
		return fmt.Errorf("%w: the server has %d volumes mounted, its maximum; try again when sandboxes have ended",
			ErrQuota, s.cfg.MaxMounted)
	}
	s.mounted++ // taken now: others count it while it is made
	s.mu.Unlock()
	dev, mnt, err := mountImage(filepath.Join(s.dir(e.ID), "image"))
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.mounted--
		return fmt.Errorf("mount volume %q: %w", e.Name, err)
	}
	e.dev, e.mnt = dev, mnt
	return nil
}

// Mount makes a new mount of the volume's file system, for a sandbox:
// detached (the backend attaches it in the sandbox's mount namespace),
// nosuid, nodev, noexec and noatime. The caller closes the descriptor
// once it has attached it; the file system lives as long as any of its
// mounts does. A released lease makes none.
func (l *Lease) Mount() (int, error) {
	l.s.mu.Lock() // the device is the volume's until the last release
	defer l.s.mu.Unlock()
	if l.released {
		return -1, fmt.Errorf("volume %q: the lease was released", l.Volume.Name)
	}
	fd, err := newMount(l.e.dev)
	if err != nil {
		return -1, fmt.Errorf("volume %q: %w", l.Volume.Name, err)
	}
	return fd, nil
}

// Open opens the volume's root confined (workspace.Open) and reached as
// the sandbox user (Dir): what it makes is OwnerUID:OwnerGID's, and it
// reads and writes with that user's permissions. The Dir keeps the file
// system open until it is closed. A released lease opens nothing.
func (l *Lease) Open() (*Dir, error) {
	l.s.mu.Lock() // the server's mount is open until the last release
	defer l.s.mu.Unlock()
	if l.released {
		return nil, fmt.Errorf("volume %q: the lease was released", l.Volume.Name)
	}
	d, err := workspace.Open(procPath(l.e.mnt), OwnerUID, OwnerGID)
	if err != nil {
		return nil, err
	}
	return &Dir{d: d}, nil
}

// Dir names the root of the volume's file system in this process only
// (the server's mount of it, /proc/self/fd/N), for tests and tools that
// hold the lease until they are done with the path; requests use Open.
func (l *Lease) Dir() string {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.released {
		return ""
	}
	return procPath(l.e.mnt)
}

// Release ends the lease; the volume is unmounted when it was the last.
// It must be called only once its user can no longer reach the volume
// (a sandbox's processes are gone).
func (l *Lease) Release() {
	l.once.Do(func() {
		s := l.s
		s.mu.Lock()
		defer s.mu.Unlock()
		l.released = true
		l.e.users--
		if l.sandbox {
			l.e.sandboxes--
		}
		if l.e.users == 0 {
			s.unmountLocked(l.e)
		}
	})
}

// unmountLocked lets go of the server's mount of a volume: its file system,
// and loop device, go once the sandboxes' mounts of it have gone too.
func (s *Store) unmountLocked(e *entry) {
	if e.mnt == nil {
		return // its mount failed: the lease that made it is released
	}
	e.mnt.Close()
	e.dev, e.mnt = "", nil
	s.mounted--
}

// closeWait bounds how long Close waits for the loop devices of the
// volumes last released to go.
const closeWait = 10 * time.Second

// Close refuses new leases (the service releases its sandboxes' leases as
// it closes them, before this), then waits a little for the loop devices
// of released volumes to detach: the kernel lets go of a dead sandbox's
// mounts asynchronously.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	var errs []error
	for _, e := range s.vols {
		if e.users > 0 {
			errs = append(errs, fmt.Errorf("volume %s still has %d user(s)", e.ID, e.users))
		}
	}
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
	s.mu.Unlock()
	if len(errs) == 0 {
		waitDetached(s.cfg.Dir, closeWait)
	}
	return errors.Join(errs...)
}

// Content runs fn with the owner's volume (by ID or name) mounted and
// opened confined (no link is followed, nothing resolves outside the
// volume), as the sandbox user (Dir): the content API has no more rights
// in a volume than a sandbox's user has.
func (s *Store) Content(owner, idOrName string, fn func(Volume, *Dir) error) error {
	l, err := s.Acquire(owner, idOrName, false)
	if err != nil {
		return err
	}
	defer l.Release()
	d, err := l.Open()
	if err != nil {
		return err
	}
	defer d.Close()
	return fn(l.Volume, d)
}

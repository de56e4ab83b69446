// Package hostuid hands out ranges of host user and group ids, one range per
// sandbox, so that no two sandboxes, and no sandbox and the host, are the
// same host user.
//
// The kernel keeps many budgets per user: inotify instances and watches,
// queued signals, POSIX message-queue bytes, locked memory, pipe buffers,
// descriptors in flight over Unix sockets, user namespaces. A sandbox that is
// a host user of its own can exhaust only its own budgets.
//
// A range is held by a write lock on the bytes of one lock file whose
// offsets are the range's ids (an open file description lock, F_OFD_SETLK):
// every process that uses the same lock file sees every range in use,
// whatever the bounds of its own pool, and a process that dies releases its
// ranges with its descriptors. The lock file stays empty: locks need no data.
package hostuid

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// RangeSize is the number of ids in a range: a sandbox's user namespace
// maps ids 0 to 65535 (root, the sandbox user 1000, nobody 65534).
const RangeSize = 65536

// DefaultLockFile is the lock file every Vivarium process on a host shares.
const DefaultLockFile = "/run/vivarium/hostuid.lock"

// ErrExhausted says that every range of the pool is in use.
var ErrExhausted = errors.New("every host uid range of the pool is in use")

// Config describes a pool.
type Config struct {
	// Base is the first host id of the first range.
	Base uint32
	// Ranges is how many ranges the pool holds: as many sandboxes can
	// exist at once.
	Ranges int
	// LockFile is shared by every pool on the host; DefaultLockFile when
	// empty.
	LockFile string
}

// Range is one sandbox's host ids: First (root of the sandbox) to
// First+RangeSize-1.
type Range struct {
	First uint32
	slot  int
}

// ID returns the host id that id inside the sandbox maps to.
func (r Range) ID(inside uint32) uint32 { return r.First + inside }

// Pool hands out ranges. It is safe for concurrent use.
type Pool struct {
	cfg  Config
	lock *os.File

	mu     sync.Mutex
	held   map[int]bool
	next   int // where the next search starts: freed ranges rest a while
	closed bool
}

// New opens a pool. It fails when the pool's ids overflow 32 bits or
// belong to users and groups the host knows.
func New(cfg Config) (*Pool, error) {
	if cfg.LockFile == "" {
		cfg.LockFile = DefaultLockFile
	}
	if cfg.Ranges <= 0 {
		return nil, fmt.Errorf("host uid pool: %d ranges", cfg.Ranges)
	}
	if cfg.Base == 0 {
		return nil, errors.New("host uid pool: base 0 is root")
	}
	last := uint64(cfg.Base) + uint64(cfg.Ranges)*RangeSize - 1
	if last >= 1<<32-1 { // (uid_t)-1 is "no id"
		return nil, fmt.Errorf("host uid pool: %d ranges from %d end past the last uid", cfg.Ranges, cfg.Base)
	}
	if err := checkUnowned(cfg.Base, uint32(last)); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(cfg.LockFile), 0o700); err != nil {
		return nil, fmt.Errorf("host uid pool: %w", err)
	}
	f, err := os.OpenFile(cfg.LockFile, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("host uid pool: %w", err)
	}
	return &Pool{cfg: cfg, lock: f, held: map[int]bool{}}, nil
}

// Bounds returns the first and last host ids of the pool.
func (p *Pool) Bounds() (first, last uint32) {
	return p.cfg.Base, p.cfg.Base + uint32(p.cfg.Ranges)*RangeSize - 1
}

// Ranges is the pool's size.
func (p *Pool) Ranges() int { return p.cfg.Ranges }

// Held is the number of ranges this pool holds now.
func (p *Pool) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// Acquire takes a free range. The search goes round the pool from where
// the last one ended, so that a range just released (whose last processes
// the kernel may still be tearing down) is the last to be reused.
func (p *Pool) Acquire() (Range, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return Range{}, errors.New("host uid pool closed")
	}
	for i := 0; i < p.cfg.Ranges; i++ {
		slot := (p.next + i) % p.cfg.Ranges
		if p.held[slot] {
			continue
		}
		r := Range{First: p.cfg.Base + uint32(slot)*RangeSize, slot: slot}
		err := p.setLock(r, unix.F_WRLCK)
		if err == unix.EAGAIN || err == unix.EACCES {
			continue // another pool on this host holds it
		}
		if err != nil {
			return Range{}, fmt.Errorf("host uid pool: lock %s: %w", p.cfg.LockFile, err)
		}
		p.held[slot] = true
		p.next = slot + 1
		return r, nil
	}
	first, last := p.Bounds()
	return Range{}, fmt.Errorf("%w (%d ranges, uids %d-%d): raise the pool's size (--uid-ranges)",
		ErrExhausted, p.cfg.Ranges, first, last)
}

// Release returns a range to the pool. Call it only once no process of the
// range is left.
func (p *Pool) Release(r Range) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.held[r.slot] || p.closed {
		return
	}
	delete(p.held, r.slot)
	p.setLock(r, unix.F_UNLCK)
}

// Close releases every range and the lock file.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.held = nil
	return p.lock.Close()
}

func (p *Pool) setLock(r Range, typ int16) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: int64(r.First), Len: RangeSize}
	for {
		err := unix.FcntlFlock(p.lock.Fd(), unix.F_OFD_SETLK, &lk)
		if err != unix.EINTR {
			return err
		}
	}
}

// InUse counts the ranges of the pool that any process on the host holds.
func (p *Pool) InUse() (int, error) {
	n := 0
	for slot := 0; slot < p.cfg.Ranges; slot++ {
		lk := unix.Flock_t{Type: unix.F_WRLCK, Start: int64(p.cfg.Base) + int64(slot)*RangeSize, Len: RangeSize}
		if err := unix.FcntlFlock(p.lock.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
			return 0, err
		}
		// F_OFD_GETLK ignores this descriptor's own locks: count them apart.
		p.mu.Lock()
		mine := p.held[slot]
		p.mu.Unlock()
		if lk.Type != unix.F_UNLCK || mine {
			n++
		}
	}
	return n, nil
}

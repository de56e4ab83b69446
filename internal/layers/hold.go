package layers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// A layer a sandbox's root stacks must stay whole while the sandbox
// lives, whoever removes its image meanwhile, in this process or another
// (vivarium image rm beside a server). Each user of a layer holds a
// shared lock on holds/HEX; a collection deletes a layer only with that
// lock taken exclusively, and leaves a held one to a later collection,
// which the last release of a hold starts. A holder checks the layer is
// still there once it holds it: a collection that won the race has
// removed it, and the hold fails.

// holds are this process's holds, by hold file, counted: one descriptor
// per layer however many sandboxes use it.
var holds = struct {
	sync.Mutex
	m map[string]*hold
}{m: map[string]*hold{}}

type hold struct {
	f *os.File
	n int
}

// ErrLayerGone: a layer to hold was removed (its image too).
var ErrLayerGone = errors.New("a layer of the template was removed")

// HoldLayers keeps the layers at dirs (a store's LayerDir) from the
// store's collection until release is called.
func HoldLayers(dirs []string) (release func(), err error) {
	var held []string
	release = func() { releaseHolds(held) }
	for _, d := range dirs {
		p, ok := holdPath(d)
		if !ok {
			continue // not a store's: nothing collects it
		}
		if err := takeHold(p, d); err != nil {
			release()
			return nil, err
		}
		held = append(held, p)
	}
	return release, nil
}

// holdPath is the hold file of the layer at dir, if it is a store's
// (layers/HEX).
func holdPath(dir string) (string, bool) {
	layers := filepath.Dir(dir)
	if filepath.Base(layers) != "layers" {
		return "", false
	}
	return filepath.Join(filepath.Dir(layers), "holds", filepath.Base(dir)), true
}

func takeHold(p, layer string) error {
	holds.Lock()
	defer holds.Unlock()
	if h := holds.m[p]; h != nil {
		h.n++
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		f.Close()
		return err
	}
	if _, err := os.Stat(layer + ".json"); err != nil {
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			os.Remove(p) // made for nothing, and nobody else waits on it
		}
		f.Close()
		return fmt.Errorf("%w: %.19s", ErrLayerGone, filepath.Base(layer))
	}
	holds.m[p] = &hold{f: f, n: 1}
	return nil
}

// releaseHolds drops one hold of each hold file; a layer no longer held
// by this process may now be collected, if no image names it.
func releaseHolds(paths []string) {
	stores := map[string]bool{}
	holds.Lock()
	for _, p := range paths {
		h := holds.m[p]
		if h == nil {
			continue
		}
		if h.n--; h.n == 0 {
			h.f.Close()
			delete(holds.m, p)
			stores[filepath.Dir(filepath.Dir(p))] = true
		}
	}
	holds.Unlock()
	for dir := range stores {
		if Collect != nil {
			Collect(dir)
		}
	}
}

// Collect, set by the image store, collects the store at dir: what a
// release that held a layer last starts.
var Collect func(dir string)

// HeldCheck answers, once per layer of a collection of the store at dir,
// whether another holds it; the hold files of those it may delete stay
// locked exclusively until the collection ends (Close).
type HeldCheck struct {
	dir   string
	seen  map[string]bool
	files []*os.File
}

// NewHeldCheck starts the checks of a collection of the store at dir.
func NewHeldCheck(dir string) *HeldCheck {
	return &HeldCheck{dir: filepath.Join(dir, "holds"), seen: map[string]bool{}}
}

// Elsewhere reports whether a process holds the layer HEX.
func (c *HeldCheck) Elsewhere(hex string) bool {
	if held, ok := c.seen[hex]; ok {
		return held
	}
	held := false
	p := filepath.Join(c.dir, hex)
	if f, err := os.OpenFile(p, os.O_RDWR|unix.O_CLOEXEC, 0); err == nil {
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			held = true
		} else {
			c.files = append(c.files, f)
		}
	}
	c.seen[hex] = held
	return held
}

// Close removes the hold files of the layers the collection deleted, then
// lets go of them: a holder waiting on one finds its layer gone, and one
// that makes the file anew does too.
func (c *HeldCheck) Close() {
	for _, f := range c.files {
		os.Remove(f.Name())
		f.Close()
	}
}

package native

// Reference images of paused sandboxes kept on disk (Config.PauseBaseDir;
// the design and its measurements: docs/notes/2026-11-27-pause-resume-design.md,
// "Kept copies against a base").
//
// A pandas sandbox kept on disk is about 40 MB of pages, 11 MB packed:
// 10,000 of them do not fit on a common disk. Most of those pages are the
// same in every sandbox (the interpreter, numpy, pandas and matplotlib
// after their import), but not at the same addresses and not with the
// same bytes: address-space randomization moves every pointer, and
// Python's string hashes, which order its dicts, are seeded at random.
// Two such sandboxes shared 3% of their pages.
//
// So, where the backend has a PauseBaseDir, a pausable sandbox starts
// from a fixed point: its processes get no address-space randomization
// (spawnWithLayout), its runner the backend's hash seed and the backend's
// Preload imported before its first cell, the collector kept off them.
// Two such sandboxes then share 97% of their runner's pages byte for byte
// at the same address. The base is one such sandbox, paused after a first
// cell: its runner's pagemap and pages, under PauseBaseDir/<key>, with a
// base.json naming its seed, what it was made of and each file's sha256;
// key is the sha256 of base.json. A kept copy (PersistPaused) has every
// page of its runner identical to the base's at the same address written
// as a reference to it (criu.Delta), and its manifest names the base's key
// and the pairing of processes; its resume gives CRIU a view of the base
// as the dump's parent (criu.ParentView). Measured: a kept pandas sandbox
// takes about 5 MB instead of 11.
//
// The seed and the base are the backend's for as long as what made them
// (the runner, the Preload list, the interpreter, the kernel) is the
// same: a restarted server finds its base in PauseBaseDir/current and
// goes on with its seed. A base is checked against base.json once per
// process before it is used; a base that does not match is refused.
// One is made per upgrade, about 60 MB; a server's start removes those
// no kept copy refers to (PruneBases).
//
// What this costs in isolation is stated in docs/security.md: every
// pausable sandbox of a host has the same memory layout and hash seed, as
// the sandboxes forked from one zygote do, for the base's life.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// baseVersion is the format of base.json.
const baseVersion = 1

// currentBase, in PauseBaseDir, holds the key of the base new kept copies
// are written against.
const currentBase = "current"

// pauseBase is a base, checked.
type pauseBase struct {
	key  string
	dir  string
	info baseInfo
}

// baseInfo is a base's base.json.
type baseInfo struct {
	Version     int    `json:"version"`
	Fingerprint string `json:"fingerprint"`
	HashSeed    string `json:"hash_seed"`
	// RunnerNS is the runner's pid in the base sandbox: its pagemap is
	// pagemap-<RunnerNS>.img.
	RunnerNS int `json:"runner_ns"`
	// Files are the base's images and their sha256.
	Files map[string]string `json:"files"`
}

// baseState is the backend's bases.
type baseState struct {
	current *pauseBase            // nil until found or made
	checked map[string]*pauseBase // by key
}

// fingerprint names what a sandbox's runner memory at its start depends
// on: a base made from another is of little use (never wrong: pages are
// compared byte for byte).
func (b *Backend) fingerprint() string {
	h := sha256.New()
	files := runner.Files()
	for _, name := range slices.Sorted(maps.Keys(files)) {
		fmt.Fprintf(h, "%s %d\n", name, len(files[name]))
		h.Write(files[name])
	}
	fmt.Fprintf(h, "preload %s\n", strings.Join(b.cfg.Preload, ","))
	if real, err := filepath.EvalSymlinks(sandbox.DefaultPython); err == nil {
		if st, err := os.Stat(real); err == nil {
			fmt.Fprintf(h, "python %s %d %d\n", real, st.Size(), st.ModTime().UnixNano())
		}
	}
	kernel, _, _ := hostKind()
	fmt.Fprintf(h, "kernel %s\n", kernel)
	return hex.EncodeToString(h.Sum(nil))
}

// initBases sets the backend's hash seed: the current base's, where
// PauseBaseDir has one made from what this backend runs; a new one
// otherwise (its base is made by the first kept copy).
func (b *Backend) initBases() {
	b.hashSeed = strconv.FormatUint(uint64(mrand.Uint32()), 10)
	if b.cfg.PauseBaseDir == "" {
		return
	}
	key, err := os.ReadFile(filepath.Join(b.cfg.PauseBaseDir, currentBase))
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err == nil {
		var base *pauseBase
		if base, err = b.openBase(strings.TrimSpace(string(key))); err == nil {
			if base.info.Fingerprint != b.fingerprint() {
				b.log.Info("pause base: made from another runner, interpreter or kernel; a new one will be made", "key", base.key)
				return
			}
			b.hashSeed, b.bases.current = base.info.HashSeed, base
			return
		}
	}
	b.log.Warn("pause base: the current one cannot be used; a new one will be made", "err", err)
}

// openBase returns the base of key, checked against its base.json (once
// per process).
func (b *Backend) openBase(key string) (*pauseBase, error) {
	b.baseMu.Lock()
	defer b.baseMu.Unlock()
	if base := b.bases.checked[key]; base != nil {
		return base, nil
	}
	if b.cfg.PauseBaseDir == "" {
		return nil, errors.New("a kept copy written against a base, and this backend has no PauseBaseDir")
	}
	if len(key) != 64 || strings.Trim(key, "0123456789abcdef") != "" {
		return nil, fmt.Errorf("pause base %q: not a key", key)
	}
	dir := filepath.Join(b.cfg.PauseBaseDir, key)
	raw, err := os.ReadFile(filepath.Join(dir, "base.json"))
	if err != nil {
		return nil, fmt.Errorf("pause base: %w", err)
	}
	if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != key {
		return nil, fmt.Errorf("pause base %s: its base.json was changed", key)
	}
	var info baseInfo
	if err := json.Unmarshal(raw, &info); err != nil || info.Version != baseVersion || info.RunnerNS <= 0 {
		return nil, fmt.Errorf("pause base %s: base.json of another format", key)
	}
	for name, want := range info.Files {
		if name != filepath.Base(name) || !strings.HasSuffix(name, ".img") {
			return nil, fmt.Errorf("pause base %s: a file %q", key, name)
		}
		got, err := fileutil.SHA256(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("pause base %s: %w", key, err)
		}
		if got != want {
			return nil, fmt.Errorf("pause base %s: %s was changed", key, name)
		}
	}
	base := &pauseBase{key: key, dir: dir, info: info}
	if b.bases.checked == nil {
		b.bases.checked = map[string]*pauseBase{}
	}
	b.bases.checked[key] = base
	return base, nil
}

// pauseBaseFor returns the base s's kept copy is written against, made
// now if there is none: nil (and no error) where s was not started from
// the fixed point (no PauseBaseDir, not pausable, another interpreter or
// a seed of its own).
func (b *Backend) pauseBaseFor(ctx context.Context, s *Sandbox) (*pauseBase, error) {
	if b.cfg.PauseBaseDir == "" || s.cfg.HashSeed == "" || s.cfg.HashSeed != b.hashSeed ||
		s.spec.Python != sandbox.DefaultPython {
		return nil, nil
	}
	b.baseMakeMu.Lock()
	defer b.baseMakeMu.Unlock()
	b.baseMu.Lock()
	base := b.bases.current
	b.baseMu.Unlock()
	if base != nil {
		return base, nil
	}
	base, err := b.makeBase(ctx)
	if err != nil {
		return nil, fmt.Errorf("pause base: %w", err)
	}
	b.baseMu.Lock()
	b.bases.current = base
	b.baseMu.Unlock()
	b.log.Info("pause base made", "key", base.key, "dir", base.dir)
	return base, nil
}

// baseCell is the base sandbox's first cell: what every sandbox has run
// once it has run anything (the runner's first compile and execution).
const baseCell = "None"

// baseCandidates bounds the sandboxes makeBase starts to find two whose
// runners have their files mapped at the same addresses.
const baseCandidates = 3

// makeBase starts pausable sandboxes and runs a first cell in each until
// two have their runner's files mapped alike, then pauses one of those
// and keeps its runner's images as the base. A sandbox's libraries land
// a page apart now and then (on a loaded host), and a base made of such
// a one would share almost nothing with the sandboxes kept against it,
// for as long as it is the backend's; the layout two sandboxes agree on
// is the one the others have.
func (b *Backend) makeBase(ctx context.Context) (*pauseBase, error) {
	var s *Sandbox
	var seen []*Sandbox
	layouts := map[*Sandbox]string{}
	defer func() {
		for _, c := range seen {
			if c != s {
				c.Close()
			}
		}
	}()
	for len(seen) < baseCandidates && s == nil {
		c, err := b.baseCandidate(ctx)
		if err != nil {
			return nil, err
		}
		seen = append(seen, c)
		layouts[c], err = runnerLayout(c)
		if err != nil {
			return nil, err
		}
		for _, other := range seen[:len(seen)-1] {
			if layouts[other] == layouts[c] {
				s = other
				break
			}
		}
	}
	if s == nil {
		b.log.Warn("pause base: no two of its candidates had their runner's files mapped alike; the base is the first",
			"candidates", len(seen))
		s = seen[0]
	}
	defer s.Close()
	if err := s.Pause(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	rp := s.rp
	s.mu.Unlock()
	if rp == nil {
		return nil, errors.New("the paused base's runner is not known")
	}
	runnerNS := rp.pid // in the sandbox
	if err := os.MkdirAll(b.cfg.PauseBaseDir, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(b.cfg.PauseBaseDir, ".new-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	info := baseInfo{Version: baseVersion, Fingerprint: b.fingerprint(), HashSeed: s.cfg.HashSeed, RunnerNS: runnerNS,
		Files: map[string]string{}}
	pagemap, pages, err := criu.PageFiles(s.cp.images(), uint32(runnerNS))
	if err != nil {
		return nil, err
	}
	for _, name := range []string{pagemap, pages} {
		dst := filepath.Join(tmp, name)
		// 0444: a resume's view hard-links the pages where its restored
		// tasks read them (criu.ParentView); this directory (0700) keeps
		// everyone else from them.
		if err := fileutil.CopyNew(filepath.Join(s.cp.images(), name), dst, 0o444); err != nil {
			return nil, err
		}
		if info.Files[name], err = fileutil.SHA256(dst); err != nil {
			return nil, err
		}
	}
	raw, err := json.MarshalIndent(info, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "base.json"), raw, 0o400); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	key := hex.EncodeToString(sum[:])
	dir := filepath.Join(b.cfg.PauseBaseDir, key)
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	cur := filepath.Join(b.cfg.PauseBaseDir, "."+currentBase+".new")
	if err := os.WriteFile(cur, []byte(key+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(cur, filepath.Join(b.cfg.PauseBaseDir, currentBase)); err != nil {
		return nil, err
	}
	return b.openBase(key)
}

// baseCandidate is a pausable sandbox that has run its first cell.
func (b *Backend) baseCandidate(ctx context.Context) (*Sandbox, error) {
	sbx, err := b.Create(ctx, sandbox.Spec{Pausable: true})
	if err != nil {
		return nil, err
	}
	s := sbx.(*Sandbox)
	if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: baseCell}, nil); err != nil {
		s.Close()
		return nil, err
	} else if res.Status != sandbox.StatusOK {
		s.Close()
		return nil, fmt.Errorf("its first cell: %s %s", res.Status, res.Error)
	}
	return s, nil
}

// runnerLayout is where s's runner has its files mapped: the address
// range and path of each file mapping in its /proc/PID/maps.
func runnerLayout(s *Sandbox) (string, error) {
	if s.cg == nil {
		return "", nil // no group to find it by (--insecure-no-cgroups): taken as alike
	}
	pids, err := s.cg.Procs()
	if err != nil {
		return "", err
	}
	for _, pid := range pids {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		if !strings.HasPrefix(string(comm), "python") {
			continue
		}
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
		if err != nil {
			return "", err
		}
		var out strings.Builder
		for _, line := range strings.Split(string(maps), "\n") {
			f := strings.Fields(line)
			if len(f) >= 6 && strings.HasPrefix(f[5], "/") {
				out.WriteString(f[0] + " " + f[5] + "\n")
			}
		}
		return out.String(), nil
	}
	return "", errors.New("the base candidate's runner was not found")
}

// PruneBases implements sandbox.BasePruner: the bases of PauseBaseDir
// other than the current one that no kept copy of keptDirs refers to are
// removed, with what a base's making left when cut short.
func (b *Backend) PruneBases(keptDirs []string) error {
	if b.cfg.PauseBaseDir == "" {
		return nil
	}
	keep := map[string]bool{}
	for _, d := range keptDirs {
		// Its base only: a copy this host cannot restore now (another
		// kernel) still keeps its base, for a host that can.
		var m struct{ Base *manifestBase }
		raw, err := os.ReadFile(filepath.Join(d, "manifest.json"))
		if err == nil {
			err = json.Unmarshal(raw, &m)
		}
		if err != nil {
			return fmt.Errorf("a kept copy's manifest: %w", err)
		}
		if m.Base != nil {
			keep[m.Base.Key] = true
		}
	}
	b.baseMakeMu.Lock() // no base is being made
	defer b.baseMakeMu.Unlock()
	b.baseMu.Lock()
	if b.bases.current != nil {
		keep[b.bases.current.key] = true
	}
	b.baseMu.Unlock()
	ents, err := os.ReadDir(b.cfg.PauseBaseDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		isKey := len(name) == 64 && strings.Trim(name, "0123456789abcdef") == ""
		if !e.IsDir() || !isKey && !strings.HasPrefix(name, ".new-") || keep[name] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(b.cfg.PauseBaseDir, name)); err != nil {
			errs = append(errs, err)
			continue
		}
		if isKey {
			b.baseMu.Lock()
			delete(b.bases.checked, name)
			b.baseMu.Unlock()
			b.log.Info("pause base removed: no kept copy refers to it", "key", name)
		}
	}
	return errors.Join(errs...)
}

package native

// Snapshots (sandbox.Snapshotter and SnapshotRestorer, issue 15,
// docs/snapshots.md): a fork's snapshot (fork_linux.go), kept on disk.
// SaveSnapshot dumps the running sandbox as a fork does, then writes into
// its directory:
//
//	manifest.json  what a restore needs besides the images: the dump's
//	               external mounts, files, pipes and sockets, the
//	               source's spec, init's configuration, code contexts,
//	               host range, the root's size; and the host it was made
//	               on (kernel, CPU flags), checked before a restore
//	images/        CRIU's images
//	ext/           the /proc masks' copies
//	files/         the root tmpfs's files (cp -a, owners kept: the
//	               source's host range, shifted to each new sandbox's)
//
// CreateFromSnapshot restores it as a fork restores a copy: a sandbox of
// its own (host user, cgroup, namespaces, root tmpfs). The directory is
// root's (0700). This package trusts it: the service signs what it keeps
// and checks the signature before a restore (internal/snapshot), as CRIU,
// which runs as root, must only ever read images Vivarium wrote.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
)

var (
	_ sandbox.Snapshotter      = (*Sandbox)(nil)
	_ sandbox.SnapshotRestorer = (*Backend)(nil)
)

// snapshotVersion is the manifest's format: 3 writes pages against a
// base (Base), 2 packs the page images
// (manifest.Packed); 1, which does not, is still written where nothing
// is packed (snapshots), and read.
const snapshotVersion = 3

// manifest is a snapshot's manifest.json.
type manifest struct {
	Version int `json:"version"`
	// The host it was made on: a restore needs the same kernel and CPU
	// features (CRIU's images hold the tasks' registers and what the
	// kernel gave them).
	Kernel string `json:"kernel"`
	CPU    string `json:"cpu"` // hash of the CPU's flags
	Arch   string `json:"arch"`

	Spec      sandbox.Spec         `json:"spec"`
	Init      *initConfig          `json:"init"`
	Contexts  runner.ContextsState `json:"contexts"`
	Owner     uint32               `json:"owner"` // the source's host range's first id
	RunnerNS  int                  `json:"runner_ns"`
	RootOpts  string               `json:"root_opts"`
	RunnerPID int                  `json:"runner_pid"`
	Group     string               `json:"group"`
	Cgroups   []string             `json:"cgroups"`
	Sysctls   []sysctl             `json:"sysctls"`
	Mounts    []manifestMount      `json:"mounts"`
	Files     []manifestFile       `json:"files"`
	Pipes     []manifestPipe       `json:"pipes"`
	Socks     []manifestSock       `json:"socks"`
	// Packed: the images stored compressed, as images/NAME.zst
	// (snapshot.Pack), each with its size unpacked.
	Packed map[string]int64 `json:"packed,omitempty"`
	// Base: pages left to a pause base (pausebase_linux.go).
	Base *manifestBase `json:"base,omitempty"`
	// TookOver: the zygote's memory a restore is charged for
	// (zygotememory_linux.go).
	TookOver int64 `json:"took_over,omitempty"`
}

// manifestBase names the base a kept copy's pages refer to, and which of
// its processes is compared with which of the base's.
type manifestBase struct {
	Key   string     `json:"key"`
	Pairs criu.Pairs `json:"pairs"`
}

type manifestMount struct {
	Key, Mountpoint string
	Source          string // a host path, or ext/NAME: the snapshot's
	Lower, Flags    string
	// Volume: a volume's mount, by the volume's path in the spec (a
	// paused sandbox kept on disk; a snapshot holds none).
	Volume string `json:",omitempty"`
}

// manifestFile is an external file: Under, for a file mapped from the
// sandbox's overlay at that mount point (extFile.under).
type manifestFile struct {
	Key, Path string
	Under     string `json:",omitempty"`
}

type manifestPipe struct {
	Ino     uint64
	Reader  bool
	PID, FD int
	Init    bool
}

type manifestSock struct {
	Ino uint64
	FD  int
}

// SnapshotSupported implements sandbox.Snapshotter: what can be forked
// can be saved.
func (s *Sandbox) SnapshotSupported() error {
	if err := s.snapshotable(); err != nil {
		return err
	}
	_, err := s.b.criu()
	return err
}

// snapshotable says why the sandbox cannot be saved, if it cannot.
func (s *Sandbox) snapshotable() error {
	if err := s.pausable(); err != nil {
		return fmt.Errorf("%w (nor saved as a snapshot)", err)
	}
	if len(s.spec.Volumes) > 0 {
		// Its processes' memory may hold what they read of a volume,
		// their open files point into it: a snapshot of them without the
		// volume's files, which it cannot hold, would not be the sandbox.
		return fmt.Errorf("%w: a snapshot does not hold a volume's files, and this sandbox mounts %d volume(s); "+
			"only a sandbox without volumes is saved (a fork's copies mount the same volumes)", sandbox.ErrCannotKeep,
			len(s.spec.Volumes))
	}
	return nil
}

// SaveSnapshot implements sandbox.Snapshotter. It fails as Fork does
// (ErrBusy while an execution runs, ErrPaused for a paused sandbox); the
// sandbox goes on unchanged whatever the outcome, and dir is made only
// if it succeeds.
func (s *Sandbox) SaveSnapshot(ctx context.Context, dir string) (int64, error) {
	if err := s.snapshotable(); err != nil {
		return 0, err
	}
	bin, err := s.b.criu()
	if err != nil {
		return 0, err
	}
	if _, err := os.Lstat(dir); err == nil {
		return 0, fmt.Errorf("snapshot: %s exists", dir)
	}
	// Room on the host's disks, which the host and every other tenant
	// draw on: the dump's, and the snapshot's (its images, its files).
	if u, err := s.Usage(); err == nil {
		if err := checkpointRoom(s.b.cfg.CheckpointDir, u.Memory); err != nil {
			return 0, err
		}
		if err := checkpointRoom(filepath.Dir(dir), u.Memory); err != nil {
			return 0, err
		}
	}
	snap, err := s.snapshot(ctx, bin, nil)
	if err != nil {
		return 0, err
	}
	defer removeSnapshot(snap.dir)
	size, err := writeSnapshot(snap, dir, false)
	if err != nil {
		return 0, fmt.Errorf("snapshot: %w", err)
	}
	return size, nil
}

// writeSnapshot writes snap into dir (root's, 0700), whole or not at
// all: into dir.partial, renamed once complete. It returns the size
// written. With pack, the page images are stored packed (about a
// quarter of their size, and 40 ms more for a restore of a sandbox that
// imported pandas): for a paused sandbox kept on disk, not for a
// snapshot, which is made to start sandboxes fast.
func writeSnapshot(snap *forkSnapshot, dir string, pack bool) (int64, error) {
	return fileutil.WriteDir(dir, func(tmp string) error { return writeSnapshotFiles(snap, tmp, pack) })
}

// writeSnapshotFiles writes snap into dir, which it makes.
func writeSnapshotFiles(snap *forkSnapshot, dir string, pack bool) error {
	for _, d := range []string{dir, filepath.Join(dir, "images"), filepath.Join(dir, "ext")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(snap.images())
	if err != nil {
		return err
	}
	packed := map[string]int64{}
	delta := pack && snap.base != nil
	for _, e := range ents {
		src, dst := filepath.Join(snap.images(), e.Name()), filepath.Join(dir, "images", e.Name())
		if !pack || !packs(e.Name()) || delta {
			if err := fileutil.CopyNew(src, dst, 0o644); err != nil {
				return err
			}
			continue
		}
		if packed[e.Name()], err = snapshot.Pack(dst+snapshot.PackedSuffix, src); err != nil {
			return err
		}
	}
	var base *manifestBase
	if delta {
		// Pages the base has are left to it, and what is left packed.
		if _, err := criu.Delta(filepath.Join(dir, "images"), snap.base.dir, snap.basePairs); err != nil {
			return err
		}
		for _, e := range ents {
			if dst := filepath.Join(dir, "images", e.Name()); packs(e.Name()) {
				if packed[e.Name()], err = snapshot.Pack(dst+snapshot.PackedSuffix, dst); err != nil {
					return err
				}
				if err := os.Remove(dst); err != nil {
					return err
				}
			}
		}
		base = &manifestBase{Key: snap.base.key, Pairs: snap.basePairs}
	}
	// init's configuration without the runner's files and the /etc it
	// writes, which init uses only when it starts (1.2 MB, and in the
	// root's files already).
	cfg := *snap.cfg
	cfg.RunnerFiles, cfg.Etc = nil, nil
	m := manifest{Version: snapshotVersion, Arch: runtime.GOARCH, Spec: snap.spec, Init: &cfg,
		Contexts: snap.contexts, Owner: snap.owner.First, RunnerNS: snap.runnerNS, RootOpts: snap.rootOpts,
		RunnerPID: snap.runnerPID, Group: snap.group, Cgroups: snap.cgroups, Sysctls: snap.userSysctls, Packed: packed,
		Base: base, TookOver: snap.tookOver}
	switch {
	case len(packed) == 0:
		m.Version = 1 // nothing packed: readable by a Vivarium that does not unpack
	case base == nil:
		m.Version = 2 // readable by a Vivarium without bases
	}
	if m.Kernel, m.CPU, err = hostKind(); err != nil {
		return err
	}
	ext := filepath.Join(snap.dir, "ext")
	for _, x := range snap.mounts {
		src := x.source
		if filepath.Dir(x.source) == ext {
			src = filepath.Join("ext", filepath.Base(x.source))
			if err := copyMaskFile(x.source, filepath.Join(dir, src)); err != nil {
				return err
			}
		}
		m.Mounts = append(m.Mounts, manifestMount{Key: x.key, Mountpoint: x.mountpoint, Source: src,
			Lower: x.lower, Flags: x.flags, Volume: x.volume})
	}
	for _, f := range snap.checkpoint.files {
		m.Files = append(m.Files, manifestFile{Key: f.key, Path: f.path, Under: f.under})
	}
	for _, p := range snap.pipes {
		m.Pipes = append(m.Pipes, manifestPipe{Ino: p.ino, Reader: p.reader, PID: p.pid, FD: p.fd, Init: p.init})
	}
	for _, k := range snap.socks {
		m.Socks = append(m.Socks, manifestSock{Ino: k.ino, FD: k.fd})
	}
	// The root's files, from the snapshot's tmpfs to the disk.
	if err := fileutil.CopyTree(snap.rootFiles, filepath.Join(dir, "files"), nil); err != nil {
		return fmt.Errorf("the root's files: %w", err)
	}
	b, err := json.MarshalIndent(m, "", "\t")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o600)
}

// packs says whether the image named name is stored packed: the pages,
// nearly all of a snapshot's size.
func packs(name string) bool {
	return strings.HasPrefix(name, "pages-") && strings.HasSuffix(name, ".img")
}

// CreateFromSnapshot implements sandbox.SnapshotRestorer: a new sandbox,
// a copy of the one saved in dir.
func (b *Backend) CreateFromSnapshot(ctx context.Context, dir string, opts sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	bin, err := b.criu()
	if err != nil {
		return nil, err
	}
	snap, err := b.loadSnapshot(dir)
	if err != nil {
		return nil, err
	}
	snap.spec.Tenant = opts.Tenant
	if err := snap.spec.Validate(); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	// No network access: a snapshot holds none (the saved sandbox's
	// proxy is not in it), and the sandbox made of it asks for none.
	c, _, err := b.restoreCopy(ctx, bin, snap, newID(), nil, nil)
	if err != nil {
		return nil, fmt.Errorf("from snapshot: %w", err)
	}
	return sandbox.Reseed(ctx, c, opts.SameRandomState)
}

// loadSnapshot reads the snapshot in dir, refusing one made on a host of
// another kind (ErrUnsupported, saying what differs).
func loadSnapshot(dir string) (*forkSnapshot, error) {
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("snapshot: its manifest: %w", err)
	}
	if m.Version < 1 || m.Version > snapshotVersion {
		return nil, fmt.Errorf("%w: a snapshot of format %d (this Vivarium reads 1 to %d)", sandbox.ErrUnsupported, m.Version, snapshotVersion)
	}
	kernel, cpu, err := hostKind()
	if err != nil {
		return nil, err
	}
	switch {
	case m.Arch != runtime.GOARCH:
		return nil, fmt.Errorf("%w: the snapshot was made on %s, this host is %s", sandbox.ErrUnsupported, m.Arch, runtime.GOARCH)
	case m.Kernel != kernel:
		return nil, fmt.Errorf("%w: the snapshot was made on kernel %s, this host runs %s: a snapshot is restored on the kernel it was made on",
			sandbox.ErrUnsupported, m.Kernel, kernel)
	case m.CPU != cpu:
		return nil, fmt.Errorf("%w: the snapshot was made on a CPU with other features than this host's", sandbox.ErrUnsupported)
	case m.Init == nil || m.Owner == 0 || m.RunnerNS <= 0 || m.RootOpts == "":
		return nil, errors.New("snapshot: its manifest is incomplete")
	}
	cp := &checkpoint{dir: dir, userSysctls: m.Sysctls, runnerPID: m.RunnerPID, cgroups: m.Cgroups, tookOver: m.TookOver}
	for _, x := range m.Mounts {
		src := x.Source
		if src != "" && !filepath.IsAbs(src) {
			if filepath.Dir(src) != "ext" {
				return nil, fmt.Errorf("snapshot: a mount's source %q", src)
			}
			src = filepath.Join(dir, src)
		}
		cp.mounts = append(cp.mounts, extMount{key: x.Key, mountpoint: x.Mountpoint, source: src, lower: x.Lower, flags: x.Flags,
			volume: x.Volume})
	}
	for _, f := range m.Files {
		cp.files = append(cp.files, extFile{key: f.Key, path: f.Path, under: f.Under})
	}
	for _, p := range m.Pipes {
		cp.pipes = append(cp.pipes, extPipe{ino: p.Ino, reader: p.Reader, pid: p.PID, fd: p.FD, init: p.Init})
	}
	for _, k := range m.Socks {
		cp.socks = append(cp.socks, extSock{ino: k.Ino, fd: k.FD})
	}
	return &forkSnapshot{checkpoint: cp, spec: m.Spec, cfg: m.Init, contexts: m.Contexts,
		rootFiles: filepath.Join(dir, "files"), group: m.Group, owner: hostuid.Range{First: m.Owner},
		runnerNS: m.RunnerNS, rootOpts: m.RootOpts, packed: m.Packed, baseOf: m.Base}, nil
}

// loadSnapshot is loadSnapshot with the snapshot's base, if any, found and
// checked.
func (b *Backend) loadSnapshot(dir string) (*forkSnapshot, error) {
	snap, err := loadSnapshot(dir)
	if err != nil {
		return nil, err
	}
	// A forked sandbox's overlays are of the zygote's files, which this
	// backend has a copy of.
	if snap.zygoteFiles, err = b.zygoteFiles(snap.hasZygoteLower()); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if snap.baseOf == nil {
		return snap, nil
	}
	if snap.base, err = b.openBase(snap.baseOf.Key); err != nil {
		return nil, err
	}
	snap.basePairs = snap.baseOf.Pairs
	return snap, nil
}

// hostKind names what a snapshot's restore depends on of the host: its
// kernel's release and a hash of its CPU's flags.
func hostKind() (kernel, cpu string, err error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", "", err
	}
	kernel = unix.ByteSliceToString(u.Release[:])
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "", "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "flags" {
			sum := sha256.Sum256([]byte(strings.TrimSpace(v)))
			return kernel, hex.EncodeToString(sum[:8]), nil
		}
	}
	return kernel, "", nil
}

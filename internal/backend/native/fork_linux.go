package native

// Fork (sandbox.Forker, issue 15, docs/snapshots.md): n new sandboxes,
// each a copy of a running one. The source's tree is dumped once with
// CRIU, left running (a snapshot), and restored n times, each time into a
// sandbox of its own:
//
//  1. the snapshot: under the same locks as a pause (no execution runs or
//     starts, no command starts), criu dump
//     --leave-running; while the dumped tree is still frozen (CRIU's
//     post-dump action) the root tmpfs's files are copied (cp -a, owners
//     kept) into the snapshot's directory, so that they are those the
//     images' memory saw. The source then goes on as it was.
//  2. each copy gets a host user from the pool, a cgroup with the
//     source's limits, and a checkpoint directory of its own, handed over
//     to its host root group: the images are hard links to the
//     snapshot's (0644, reachable only through directories of that
//     group's, 0750, or root's, 0700), except the user namespace's
//     (userns-*.img), rewritten so that its uid and gid maps name the
//     copy's host range instead of the source's; the /proc masks are
//     copied.
//  3. its root: a new tmpfs of the source's size and inodes, mounted on
//     the host, filled with the snapshot's files by cp -a run in the
//     copy's cgroup (so that their memory is charged to it), then every
//     file's owner moved from the source's host range to the copy's (an
//     owner outside the source's range fails the fork: a copy never maps
//     a host id other than its own). CRIU restores onto it (--root), and
//     the restored tree into the copy's cgroup (--cgroup-root).
//  4. the restored tree is given to a new Sandbox as a resume gives it to
//     the paused one (adopt); its workspace and root are opened from the
//     copy's tmpfs, without following links; then, unless asked to keep
//     them, Python's random and numpy's global generator are reseeded
//     from the OS by an execution in the copy.
//
// Nothing writable is shared: each copy has its own tmpfs, namespaces
// (made anew by CRIU), cgroup and host user; the images it shares with
// its siblings are read-only files, removed once restored.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/core"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/hostmem"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

var _ sandbox.Forker = (*Sandbox)(nil)

// forkParallel is how many copies are restored at once.
const forkParallel = 8

// ForkSupported implements sandbox.Forker.
func (s *Sandbox) ForkSupported() error {
	if err := s.forkable(); err != nil {
		return err
	}
	_, err := s.b.criu()
	return err
}

// forkable says why the sandbox cannot be forked, if it cannot.
func (s *Sandbox) forkable() error {
	if err := s.pausable(); err != nil {
		return fmt.Errorf("%w (nor forked)", err)
	}
	return nil
}

// copyEgress returns the proxy of each of n copies (opts.Egress): a copy
// of a sandbox with network access has one of its own, which records its
// connections under the copy and ends with it; never the source's.
func (s *Sandbox) copyEgress(n int, opts sandbox.ForkOptions) ([]sandbox.Egress, error) {
	if s.spec.Egress == nil {
		if opts.Egress != nil {
			return nil, fmt.Errorf("%w: proxies for the copies of a sandbox without network access", sandbox.ErrInvalidSpec)
		}
		return make([]sandbox.Egress, n), nil
	}
	if len(opts.Egress) != n || slices.Contains(opts.Egress, nil) {
		return nil, fmt.Errorf("%w: each copy of a sandbox with network access needs a proxy of its own", sandbox.ErrInvalidSpec)
	}
	return opts.Egress, nil
}

// copyVolumes returns the volumes of each of n copies (opts.Volumes, or
// the source's), checked to be the source's at the same paths.
func (s *Sandbox) copyVolumes(n int, opts sandbox.ForkOptions) ([][]sandbox.VolumeMount, error) {
	out := make([][]sandbox.VolumeMount, n)
	if opts.Volumes == nil {
		for i := range out {
			out[i] = s.spec.Volumes
		}
		return out, nil
	}
	if len(opts.Volumes) != n {
		return nil, fmt.Errorf("%w: volumes for %d copies, not %d", sandbox.ErrInvalidSpec, len(opts.Volumes), n)
	}
	for _, vols := range opts.Volumes {
		same := len(vols) == len(s.spec.Volumes)
		for j := 0; same && j < len(vols); j++ {
			same = vols[j].Path == s.spec.Volumes[j].Path && vols[j].Mount != nil
		}
		if !same {
			return nil, fmt.Errorf("%w: a copy's volumes are not the source's at the same paths", sandbox.ErrInvalidSpec)
		}
	}
	return opts.Volumes, nil
}

// Fork implements sandbox.Forker. It fails with sandbox.ErrBusy while an
// execution runs, and with sandbox.ErrPaused for a paused sandbox. The
// source goes on unchanged, whatever the outcome. Commands running in the
// source run in the copies too, but their pipes to the host are closed
// there (their input is at its end, their output goes nowhere), their
// terminals hung up, and the copies' cores know only the default code
// contexts.
func (s *Sandbox) Fork(ctx context.Context, n int, opts sandbox.ForkOptions) ([]sandbox.Sandbox, error) {
	if err := sandbox.CheckForkCount(n); err != nil {
		return nil, err
	}
	if err := s.forkable(); err != nil {
		return nil, err
	}
	vols, err := s.copyVolumes(n, opts)
	if err != nil {
		return nil, err
	}
	egress, err := s.copyEgress(n, opts)
	if err != nil {
		return nil, err
	}
	bin, err := s.b.criu()
	if err != nil {
		return nil, err
	}
	// The copies' memory, from the host's: each holds what the source
	// does now (a restore shares no page with it), and of a sandbox
	// forked from a zygote, the zygote's memory it shares too (counted
	// once, for this check and the dump: snapshot).
	roomFor := func(share int64) error {
		u, err := s.Usage()
		if err != nil {
			return nil
		}
		if err := hostmem.Room(hostMemory, int64(n)*(u.Memory+share), "the copies"); err != nil {
			return fmt.Errorf("fork into %d: %w", n, err)
		}
		// Each copy is restored under the source's memory limit: one
		// that would not fit there is killed by it halfway through.
		if err := s.restoreFits(u.Memory); err != nil {
			return fmt.Errorf("fork: %w", err)
		}
		return nil
	}
	snap, err := s.snapshot(ctx, bin, roomFor)
	if err != nil {
		return nil, err
	}
	defer removeSnapshot(snap.dir)

	times := make([]copyTimes, n)
	copies, err := sandbox.Copies(n, forkParallel, func(i int) (sandbox.Sandbox, error) {
		start := time.Now()
		defer func() { times[i].total = time.Since(start) }()
		c, t, err := s.b.restoreCopy(context.WithoutCancel(ctx), bin, snap, newID(), vols[i], egress[i])
		times[i] = t
		if err != nil {
			return nil, err
		}
		return sandbox.Reseed(ctx, c, opts.SameRandomState)
	})
	if err != nil {
		return nil, err
	}
	var slowest copyTimes
	for _, t := range times {
		if t.total > slowest.total {
			slowest = t
		}
	}
	s.b.log.Debug("fork", "sandbox", s.id, "copies", n, "images_bytes", snap.imageSize,
		"dump_ms", snap.dumpTook.Milliseconds(), "slowest_copy_ms", slowest.total.Milliseconds(),
		"its_files_ms", slowest.files.Milliseconds(), "its_criu_restore_ms", slowest.restore.Milliseconds())
	return copies, nil
}

// forkSnapshot is the source's tree dumped with its files, for copies to
// be restored from.
type forkSnapshot struct {
	*checkpoint
	// The source's spec, init's configuration and code contexts: each
	// copy's.
	spec      sandbox.Spec
	cfg       *initConfig
	contexts  runner.ContextsState
	rootFiles string        // the root tmpfs's files, owned by owner's ids
	group     string        // the source's cgroup (its path), "" without
	owner     hostuid.Range // the source's host user
	runnerNS  int           // the runner's pid in the sandbox
	rootOpts  string        // the root tmpfs's size and inodes
	dumpTook  time.Duration // criu dump, with the files' copy
	imageSize int64
	packed    map[string]int64 // a snapshot on disk: its packed images (manifest.Packed)
	// A kept copy's pages left to a base: the base, checked, and the
	// pairing of processes (manifest.Base, what loadSnapshot read).
	base      *pauseBase
	basePairs criu.Pairs
	baseOf    *manifestBase
}

// snapshot dumps the running sandbox, which goes on running, with its
// root's files, into a new directory of its checkpoints. check, if not
// nil, is given the zygote's memory the sandbox shares (zygoteShare),
// counted once for it and the dump, as no execution runs: an error it
// returns is the snapshot's, before anything is dumped.
func (s *Sandbox) snapshot(ctx context.Context, bin string, check func(share int64) error) (*forkSnapshot, error) {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.closing {
		return nil, sandbox.ErrClosed
	}
	if s.Core.Paused() {
		return nil, fmt.Errorf("%w: resume it before forking", sandbox.ErrPaused)
	}
	var snap *forkSnapshot
	err := s.Exclusive(func() error {
		if (*driver)(s).Closed() {
			return sandbox.ErrClosed
		}
		s.startGate.Lock()
		defer s.startGate.Unlock()
		s.mu.Lock()
		rp := s.rp
		s.mu.Unlock()
		if rp == nil {
			return errors.New("fork: the sandbox has no runner")
		}
		// The files copied are those the images' processes saw: the
		// files API changes none meanwhile (pausefiles_linux.go).
		if err := s.files.hold(); err != nil {
			return err
		}
		defer s.files.release(false)
		share, err := s.zygoteShare()
		if err != nil {
			return fmt.Errorf("fork: checkpoint: %w", err)
		}
		if check != nil {
			if err := check(share); err != nil {
				return err
			}
		}
		// A directory of its own, not the source's: a Close of the
		// source while the copies are made does not take it away.
		dir, err := s.b.checkpointDir("fork-" + newID())
		if err != nil {
			return fmt.Errorf("fork: %w", err)
		}
		files := filepath.Join(dir, "files")
		start := time.Now()
		cp, err := s.dumpTree(context.WithoutCancel(ctx), bin, dir,
			dumpOptions{leaveRunning: true, files: files, filesOpts: s.rootOpts(), filesFrom: s.upperDir(), share: &share})
		if err != nil {
			removeSnapshot(dir)
			return fmt.Errorf("fork: %w", err)
		}
		cp.close() // its mount namespace is the running sandbox's
		snap = s.snapshotOf(cp, files, rp.pid)
		snap.dumpTook = time.Since(start)
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The images, read by every copy's restored tasks through their own
	// directory's hard links: readable by all, reachable by nobody else
	// (the snapshot's directory is root's, 0700).
	if err := os.Chmod(snap.dir, 0o700); err != nil {
		removeSnapshot(snap.dir)
		return nil, err
	}
	err = filepath.WalkDir(snap.images(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("fork: unexpected %s in the images", p)
		}
		fi, err := d.Info()
		if err == nil {
			snap.imageSize += fi.Size()
			err = os.Chmod(p, 0o644)
		}
		return err
	})
	if err != nil {
		removeSnapshot(snap.dir)
		return nil, err
	}
	return snap, nil
}

// snapshotOf is the sandbox's dumped tree cp as a snapshot: the root's
// files at rootFiles, the runner's pid in the sandbox runnerNS, and what
// a copy takes of the sandbox (spec, init's configuration, code
// contexts, host range, cgroup).
func (s *Sandbox) snapshotOf(cp *checkpoint, rootFiles string, runnerNS int) *forkSnapshot {
	snap := &forkSnapshot{checkpoint: cp, spec: s.spec, cfg: s.cfg, rootFiles: rootFiles, owner: s.owner,
		runnerNS: runnerNS, rootOpts: s.rootOpts()}
	if s.cg != nil {
		snap.group = s.cg.Path()
	}
	if cc := s.Core.CloneContexts(); cc != nil {
		snap.contexts = cc.State()
	}
	return snap
}

// rootOpts are the mount options of the sandbox's root tmpfs: its disk's
// size and inodes, and the root's own.
func (s *Sandbox) rootOpts() string {
	return fmt.Sprintf("size=%d,nr_inodes=%d,mode=755", s.cfg.DiskBytes, s.cfg.DiskInodes+rootInodes)
}

// removeSnapshot removes a snapshot's directory (CheckpointDir/fork-ID/N:
// the two), and what is mounted in it first: the tmpfs of its files, and
// what a criu that was killed left.
func removeSnapshot(dir string) {
	unmountUnder(filepath.Dir(dir))
	os.RemoveAll(filepath.Dir(dir))
}

// cgroupControllers reads the hierarchies process pid is in group path
// in, as /proc/PID/cgroup names them: "memory", "cpu,cpuacct" (v1), ""
// (v2). A copy's tree is restored into its own group in each (the
// others, where the source is in the host's root group, are not dumped:
// the copy is in CRIU's groups there, the supervisor's, as a new
// sandbox's init is).
func cgroupControllers(pid int, path string) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 || f[2] != path {
			continue
		}
		out = append(out, f[1])
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("process %d is not in its sandbox's cgroup %s", pid, path)
	}
	return out, nil
}

// copyFilesScript mounts a tmpfs at files (removeSnapshot unmounts it),
// and the sandbox's root tmpfs (its files, alone) on the host at
// cp.dir/live, and writes a CRIU action script that, at
// post-dump (the tree dumped and still frozen), copies them to files.
// cleanup unmounts it.
func (cp *checkpoint) copyFilesScript(files, filesOpts, from string) (script string, cleanup func(), err error) {
	// On a tmpfs: cp -a of a sandbox's root (some 600 inodes, most of
	// them directories) took 170 ms to ext4 here, 7 ms to a tmpfs. Its
	// memory is the supervisor's until the fork ends.
	if err := os.Mkdir(files, 0o700); err != nil {
		return "", nil, err
	}
	if err := unix.Mount("tmpfs", files, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, filesOpts); err != nil {
		return "", nil, fmt.Errorf("fork: the snapshot's tmpfs: %w", err)
	}
	live := filepath.Join(cp.dir, "live")
	cleanup = func() {}
	if from != "" {
		live = from
	} else {
		if err := os.Mkdir(live, 0o700); err != nil {
			return "", nil, err
		}
		if err := mountRootOf(cp.mntns, live); err != nil {
			os.Remove(live)
			return "", nil, fmt.Errorf("fork: %w", err)
		}
		cleanup = func() {
			unix.Unmount(live, unix.MNT_DETACH)
			os.Remove(live)
		}
	}
	// Both paths are the supervisor's (the checkpoint's directory).
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	body := "#!/bin/sh\n# Vivarium: a fork's snapshot takes the root's files while the tree is frozen.\n" +
		"[ \"$CRTOOLS_SCRIPT_ACTION\" = post-dump ] || exit 0\n" +
		"exec /bin/cp -a --no-target-directory -- " + quote(live) + " " + quote(files) + "\n"
	script = filepath.Join(cp.dir, "snapshot.sh")
	if err := os.WriteFile(script, []byte(body), 0o700); err != nil {
		cleanup()
		return "", nil, err
	}
	return script, cleanup, nil
}

// restoreCopy makes a new sandbox, id, of snap: its own host user,
// cgroup, checkpoint directory and root tmpfs, and the snapshot's tree
// restored into them, mounting vols (the source's volumes, through the
// copy's leases), with egress as its proxy (nil: no network access),
// which it owns from then on, made or not.
func (b *Backend) restoreCopy(ctx context.Context, bin string, snap *forkSnapshot, id string,
	vols []sandbox.VolumeMount, egress sandbox.Egress) (*Sandbox, copyTimes, error) {
	c, err := b.newCopy(snap, id)
	if err != nil {
		if egress != nil {
			egress.Close()
		}
		return nil, copyTimes{}, err
	}
	c.spec.Volumes, c.spec.Egress = vols, egress
	times, err := c.restoreFrom(ctx, bin, snap)
	if err != nil {
		c.Close()
		return nil, times, err
	}
	return c, times, nil
}

// newCopy is a sandbox, id, of snap that is not restored yet (restoreFrom
// does): the snapshot's spec, init's configuration and code contexts.
func (b *Backend) newCopy(snap *forkSnapshot, id string) (*Sandbox, error) {
	c := &Sandbox{
		id: id, b: b, spec: snap.spec, ctl: -1, cfg: snap.cfg, failed: make(chan struct{}),
		initDone: make(chan struct{}), statusDone: make(chan struct{}), runnerGone: make(chan struct{}),
		ctlDone: make(chan struct{}), terminals: map[uint64]*terminal{},
	}
	// The copy's runner is the source's, with its code contexts.
	var contexts *runner.Contexts
	if snap.contexts.List != nil {
		var err error
		if contexts, err = runner.ContextsFrom(snap.contexts); err != nil {
			return nil, err
		}
	}
	c.Core = core.New((*driver)(c), core.Config{Spec: snap.spec, Contexts: contexts})
	return c, nil
}

// restoreFrom gives c, made by newCopy, a host user, cgroup, checkpoint
// directory and root tmpfs, and restores snap's tree into them. On a
// failure before the tree runs, what it took is given back (c can try
// again); after (c's files could not be opened), c is to be closed.
func (c *Sandbox) restoreFrom(ctx context.Context, bin string, snap *forkSnapshot) (times copyTimes, err error) {
	b := c.b
	adopted := false
	defer func() {
		if err == nil || adopted {
			return
		}
		if c.cg != nil {
			c.cg.Destroy()
			c.setGroup(nil)
		}
		if c.checkpointed {
			b.removeCheckpoints(c.id)
			c.checkpointed = false
		}
		if c.hasOwner {
			b.releaseOwner(c.owner)
			c.hasOwner = false
		}
	}()
	if c.owner, err = b.uids.Acquire(); err != nil {
		return times, err
	}
	c.hasOwner = true
	var restoreArgs []string
	if b.cgroups != nil {
		l := groupLimits(snap.spec)
		if l.MemoryBytes > 0 {
			l.MemoryBytes += snap.tookOver // zygotememory_linux.go
		}
		g, err := b.cgroups.New(c.id, l)
		if err != nil {
			return times, err
		}
		c.setGroup(g)
		for _, field := range snap.cgroups {
			if field == "" { // cgroup v2
				restoreArgs = append(restoreArgs, "--cgroup-root", c.cg.Path())
				continue
			}
			for _, ctrl := range strings.Split(field, ",") {
				restoreArgs = append(restoreArgs, "--cgroup-root", ctrl+":"+c.cg.Path())
			}
		}
	}
	dir, err := b.checkpointDir(c.id)
	c.checkpointed = true
	if err != nil {
		return times, err
	}
	cp, err := snap.copyFor(dir, c.owner)
	if err != nil {
		return times, err
	}
	cp.restoreArgs = restoreArgs
	cp.volumes = c.spec.Volumes
	// The cgroup files init held (the Go runtime's CPU limit): the
	// copy's own group's, not the source's, which may be gone (a
	// snapshot's source).
	cp.files = slices.Clone(cp.files)
	if c.cg != nil && snap.group != "" {
		from := "/" + strings.Trim(snap.group, "/") + "/"
		to := "/" + strings.Trim(c.cg.Path(), "/") + "/"
		for i, f := range cp.files {
			cp.files[i].path = strings.Replace(f.path, from, to, 1)
		}
	}
	cp.root = filepath.Join(dir, "root")
	if err := os.Mkdir(cp.root, 0o700); err != nil {
		return times, err
	}
	filesStart := time.Now()
	if c.spec.Root != nil {
		// A template's: the layers under a copy of the writable layer.
		done, err := c.copyTemplateRoot(snap, dir, cp.root)
		defer done()
		if err != nil {
			return times, err
		}
	} else {
		if err := unix.Mount("tmpfs", cp.root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, snap.rootOpts); err != nil {
			return times, fmt.Errorf("fork: the copy's root tmpfs: %w", err)
		}
		// cp -a, owners kept, run in the copy's cgroup: the tmpfs's
		// memory is charged to the copy.
		if err := fileutil.CopyTree(snap.rootFiles, cp.root, c.cg); err != nil {
			unix.Unmount(cp.root, unix.MNT_DETACH)
			return times, fmt.Errorf("fork: copy the files: %w", err)
		}
		if err := shiftOwners(cp.root, snap.owner.First, c.owner.First); err != nil {
			unix.Unmount(cp.root, unix.MNT_DETACH)
			return times, err
		}
	}
	// Mounted here until the copy holds it (its namespace, its
	// workspace's descriptors).
	defer func() {
		unix.Unmount(cp.root, unix.MNT_DETACH)
		os.Remove(cp.root)
	}()
	times.files = time.Since(filesStart)
	if err := handOverCopy(dir, int(c.owner.ID(0))); err != nil {
		return times, err
	}
	if c.cg != nil {
		cp.group = c.cg.Path()
	}
	cp.layers = c.spec.RootLayers()
	undo := restoreRoom(c.cg, groupLimits(snap.spec).Pids)
	r, err := restoreTree(ctx, bin, cp)
	undo()
	if err != nil {
		reapCopyRestore(c.owner)
		return times, err
	}
	times.restore = r.took
	if r.layerMount != "" {
		c.layerMounts = []string{r.layerMount}
	}
	c.rp = &runnerProc{pid: snap.runnerNS, pidfd: -1} // adopt takes its pid in the sandbox
	if err := c.adopt(r, cp); err != nil {
		r.kill()
		c.rp = nil
		return times, err
	}
	adopted = true
	c.tookOver = snap.tookOver
	c.pidsMax.Store(0)
	c.fitPids()
	settleStops(c.cg)
	c.ctlRead = true
	cp.close()
	b.removeLater(cp.images())
	// The /proc masks' copies stay bound in the copy until it closes.
	c.lastCheckpoint = dir
	if err := c.openFiles(cp.root); err != nil {
		return times, err
	}
	if c.spec.Egress != nil {
		// A fork's copy of a sandbox with network access, or a paused
		// one resumed from disk: its own proxy, at its address in the
		// restored namespace (as Resume).
		if err := c.startEgress(c.spec.Egress); err != nil {
			return times, fmt.Errorf("the network proxy in the restored sandbox: %w", err)
		}
	}
	return times, nil
}

// reapCopyRestore reaps what a failed restore of a copy left as this
// process's child: the restored init (criu restore --restore-sibling),
// which CRIU kills but cannot wait for. reapFailedRestore knows it by
// its name, criu, but a restore that fails late (the restorer unable to
// make a thread, EAGAIN, under a fork storm at the pids limit) has
// given it init's name already. Here it is known by its owner: the
// copy's host range is the copy's alone, and nothing of the copy runs.
func reapCopyRestore(owner hostuid.Range) {
	self := os.Getpid()
	for deadline := time.Now().Add(time.Second); ; time.Sleep(20 * time.Millisecond) {
		found := false
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", self))
		for _, t := range tasks {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", self, t.Name()))
			for _, f := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(f)
				if err != nil || !ownedBy(pid, owner) {
					continue
				}
				found = true
				var ws unix.WaitStatus
				unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			}
		}
		if !found || time.Now().After(deadline) {
			return
		}
	}
}

// ownedBy reports whether process pid's real uid is in owner's range.
func ownedBy(pid int, owner hostuid.Range) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				return false
			}
			uid, err := strconv.ParseUint(f[0], 10, 32)
			return err == nil && uint32(uid) >= owner.First && uint32(uid)-owner.First < hostuid.RangeSize
		}
	}
	return false
}

// copyTimes are where a copy's time went: its files' copy, CRIU's
// restore, all of it (with the reseed).
type copyTimes struct{ files, restore, total time.Duration }

// copyFor makes dir, a copy's checkpoint directory: the snapshot's images
// as hard links, but the user namespace's rewritten for owner, and the
// /proc masks copied. The returned checkpoint is the snapshot's, with
// dir's paths.
func (snap *forkSnapshot) copyFor(dir string, owner hostuid.Range) (*checkpoint, error) {
	cp := &checkpoint{dir: dir, files: snap.checkpoint.files, pipes: snap.pipes, socks: snap.socks,
		userSysctls: snap.userSysctls, runnerPID: snap.runnerPID, cgroups: snap.cgroups, zygoteFiles: snap.zygoteFiles}
	for _, d := range []string{dir, cp.images(), filepath.Join(dir, "ext")} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, err
		}
	}
	ents, err := os.ReadDir(snap.images())
	if err != nil {
		return nil, err
	}
	// Room on the host's disk for the images unpacked.
	var unpacked int64
	for _, n := range snap.packed {
		unpacked += n
	}
	if err := checkpointRoom(dir, unpacked); err != nil {
		return nil, err
	}
	rewritten := 0
	for _, e := range ents {
		src, dst := filepath.Join(snap.images(), e.Name()), filepath.Join(cp.images(), e.Name())
		if name, ok := strings.CutSuffix(e.Name(), snapshot.PackedSuffix); ok {
			size, known := snap.packed[name]
			if !known || !packs(name) {
				return nil, fmt.Errorf("fork: the snapshot's %s is not in its manifest", e.Name())
			}
			if err := snapshot.Unpack(filepath.Join(cp.images(), name), src, size, 0o644); err != nil {
				return nil, fmt.Errorf("fork: %w", err)
			}
			continue
		}
		if !strings.HasPrefix(e.Name(), "userns-") {
			// A snapshot kept on another file system (SaveSnapshot)
			// is copied.
			err := os.Link(src, dst)
			if errors.Is(err, unix.EXDEV) {
				err = fileutil.CopyNew(src, dst, 0o644)
			}
			if err != nil {
				return nil, err
			}
			continue
		}
		if err := rewriteUserns(src, dst, snap.owner.First, owner.First); err != nil {
			return nil, fmt.Errorf("fork: %s: %w", e.Name(), err)
		}
		rewritten++
	}
	if rewritten == 0 {
		return nil, errors.New("fork: the snapshot has no user namespace image")
	}
	if snap.base != nil {
		if err := criu.ParentView(filepath.Join(cp.images(), criu.ParentLink), snap.base.dir, snap.basePairs); err != nil {
			return nil, fmt.Errorf("its base: %w", err)
		}
	}
	ext := filepath.Join(snap.dir, "ext")
	for _, m := range snap.mounts {
		if filepath.Dir(m.source) == ext {
			dst := filepath.Join(dir, "ext", filepath.Base(m.source))
			if err := copyMaskFile(m.source, dst); err != nil {
				return nil, err
			}
			m.source = dst
		}
		cp.mounts = append(cp.mounts, m)
	}
	return cp, nil
}

// copyMaskFile copies a /proc mask's copy (an empty directory, 0555, or a
// small file, 0444). A file is a hard link to the snapshot's where both
// are on one file system, as the images are (and for the same reason as
// maskStore): root's, read-only, bound read-only in each copy, its owner
// changed by none (handOverCopy).
func copyMaskFile(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if err := os.Mkdir(dst, 0o555); err != nil {
			return err
		}
		return os.Chmod(dst, 0o555)
	}
	if !fi.Mode().IsRegular() || fi.Size() > maxMaskFile {
		return fmt.Errorf("fork: unexpected mask %s", src)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().Perm() == 0o444 && st.Uid == 0 {
		err := os.Link(src, dst)
		if !errors.Is(err, unix.EXDEV) {
			return err
		}
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.WriteFile(dst, b, 0o444); err != nil {
		return err
	}
	return os.Chmod(dst, 0o444)
}

// handOverCopy gives a copy's checkpoint directory to its host root
// group, as handOver does, but for the images: hard links shared with
// the copy's siblings, whose modes stay (0644) and which only this
// directory (0750) reaches.
func handOverCopy(dir string, gid int) error {
	for _, d := range []string{dir, filepath.Join(dir, "images"), filepath.Join(dir, "ext")} {
		if err := os.Lchown(d, 0, gid); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o750); err != nil {
			return err
		}
	}
	ents, err := os.ReadDir(filepath.Join(dir, "ext"))
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(dir, "ext", e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 {
			// A mask shared with the snapshot and the siblings
			// (copyMaskFile): root's, readable by all.
			continue
		}
		if err := os.Lchown(p, 0, gid); err != nil {
			return err
		}
	}
	return nil
}

// shiftOwners moves the owner and group of every file under root from the
// host range starting at from to the one starting at to, keeping their
// modes (chown clears set-user-ID and set-group-ID bits), and the ids
// that extended attributes name: POSIX ACLs' users and groups, a file
// capability's root (cp -a copied them as the host sees them, in the
// source's range; chown drops a file capability, set again here). A file
// or attribute naming an id outside from's range fails it: the copy
// would map no such id. root is a tmpfs of the supervisor's, not yet any
// sandbox's: nothing changes it meanwhile.
func shiftOwners(root string, from, to uint32) error {
	shift := func(id uint32) (uint32, bool) {
		if id < from || id-from >= hostuid.RangeSize {
			return 0, false
		}
		return id - from + to, true
	}
	// A file of several names (hard links, which cp -a kept) is shifted
	// once: at its second name it is already the copy's.
	shifted := map[uint64]bool{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
			if shifted[st.Ino] {
				return nil
			}
			shifted[st.Ino] = true
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 && st.Uid == 0 && st.Gid == 0 {
			return nil // a whiteout of a template's writable layer, overlayfs's own
		}
		uid, ok1 := shift(st.Uid)
		gid, ok2 := shift(st.Gid)
		if !ok1 || !ok2 {
			return fmt.Errorf("fork: %s is owned by %d:%d, outside the sandbox's host range", rel, st.Uid, st.Gid)
		}
		link := st.Mode&unix.S_IFMT == unix.S_IFLNK
		var attrs map[string][]byte
		if !link {
			if attrs, err = idAttrs(p, shift); err != nil {
				return fmt.Errorf("fork: %s: %w", rel, err)
			}
		}
		if err := os.Lchown(p, int(uid), int(gid)); err != nil {
			return err
		}
		for name, v := range attrs {
			if err := unix.Lsetxattr(p, name, v, 0); err != nil {
				return fmt.Errorf("fork: %s: set %s: %w", rel, name, err)
			}
		}
		if !link && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			return unix.Fchmodat(unix.AT_FDCWD, p, st.Mode&0o7777, 0)
		}
		return nil
	})
}

// idAttrs reads the extended attributes of p that name ids (POSIX ACLs,
// a file capability) and returns them with the ids shifted.
func idAttrs(p string, shift func(uint32) (uint32, bool)) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, name := range []string{"system.posix_acl_access", "system.posix_acl_default", "security.capability"} {
		buf := make([]byte, 4096)
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.EOPNOTSUPP) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		v := buf[:n]
		if name == "security.capability" {
			err = shiftCapability(v, shift)
		} else {
			err = shiftACL(v, shift)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] = v
	}
	return out, nil
}

// shiftACL shifts the named users and groups of a POSIX ACL in its
// extended attribute's form: a version (2), then entries of a tag, the
// permissions (16 bits each) and an id (32), little-endian.
func shiftACL(v []byte, shift func(uint32) (uint32, bool)) error {
	const aclUser, aclGroup = 0x02, 0x08
	if len(v) < 4 || binary.LittleEndian.Uint32(v) != 2 || (len(v)-4)%8 != 0 {
		return errors.New("not a POSIX ACL of version 2")
	}
	for e := v[4:]; len(e) > 0; e = e[8:] {
		tag := binary.LittleEndian.Uint16(e)
		if tag != aclUser && tag != aclGroup {
			continue
		}
		id, ok := shift(binary.LittleEndian.Uint32(e[4:]))
		if !ok {
			return fmt.Errorf("names id %d, outside the sandbox's host range", binary.LittleEndian.Uint32(e[4:]))
		}
		binary.LittleEndian.PutUint32(e[4:], id)
	}
	return nil
}

// shiftCapability shifts the root id of a file capability: a sandbox's
// are of revision 3 (struct vfs_ns_cap_data, 24 bytes, the root id
// last), the kernel's form for one set in a user namespace.
func shiftCapability(v []byte, shift func(uint32) (uint32, bool)) error {
	const revisionMask, revision3 = 0xFF000000, 0x03000000
	if len(v) != 24 || binary.LittleEndian.Uint32(v)&revisionMask != revision3 {
		return errors.New("not a file capability of a user namespace (revision 3)")
	}
	id, ok := shift(binary.LittleEndian.Uint32(v[20:]))
	if !ok {
		return fmt.Errorf("its root id %d is outside the sandbox's host range", binary.LittleEndian.Uint32(v[20:]))
	}
	binary.LittleEndian.PutUint32(v[20:], id)
	return nil
}

// openFiles opens the copy's workspace and root (sandbox.FileSystem) from
// its root tmpfs, mounted at root on the host. The sandbox's code has run
// in them: nothing on the way is followed if it is a link.
//
// A template's root tmpfs is only the writable layer of its overlay: its
// files are reached through the restored init's root, as a resumed
// sandbox's are (reopenRoot), where the workspace is a mount of its own
// (a bind of the image's /home/user), which its code cannot replace.
func (c *Sandbox) openFiles(root string) error {
	flags := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	resolve := uint64(unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV)
	if c.spec.Root != nil {
		root = fmt.Sprintf("/proc/%d/root", c.init.pid)
		flags &^= unix.O_NOFOLLOW // the magic link is what is opened
		resolve &^= unix.RESOLVE_NO_XDEV
	}
	rfd, err := unix.Open(root, flags, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	wfd, err := unix.Openat2(rfd, strings.TrimPrefix(workspacePath, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: resolve,
	})
	if err != nil {
		return fmt.Errorf("fork: the copy's workspace: %w", err)
	}
	defer unix.Close(wfd)
	// The descriptors' own files, through their magic links: no path
	// the sandbox could change is looked up.
	byFD := func(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }
	uid, gid := c.userIDs()
	root0 := int(c.owner.ID(0))
	ws, err := workspace.Open(byFD(wfd), uid, gid)
	if err != nil {
		return err
	}
	asUser, err := workspace.Open(byFD(rfd), uid, gid)
	if err != nil {
		ws.Close()
		return err
	}
	asRoot, err := workspace.Open(byFD(rfd), root0, root0)
	if err != nil {
		ws.Close()
		asUser.Close()
		return err
	}
	// Under dirMu: a sandbox opened from disk is asked for its files
	// (Workspace, Root) while it resumes.
	c.dirMu.Lock()
	c.ws, c.rootAsUser, c.rootAsRoot = ws, asUser, asRoot
	c.dirMu.Unlock()
	return nil
}

// rewriteUserns copies the CRIU image src (a userns_entry) to dst with
// every extent of its uid and gid maps moved from the host range at from
// to the one at to. An extent outside from's range is refused.
//
// The image is CRIU's: two magic words, then each entry as a 32-bit
// little-endian length and a protocol buffer. userns_entry (images/
// userns.proto) is repeated uid_gid_extent uid_map = 1, gid_map = 2; an
// extent is first = 1, lower_first = 2, count = 3, all uint32.
func rewriteUserns(src, dst string, from, to uint32) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if len(b) < 12 {
		return errors.New("too short")
	}
	out := append([]byte(nil), b[:8]...)
	rest := b[8:]
	entries := 0
	for len(rest) > 0 {
		if len(rest) < 4 {
			return errors.New("truncated entry")
		}
		n := int(binary.LittleEndian.Uint32(rest))
		if n > len(rest)-4 {
			return errors.New("truncated entry")
		}
		msg, err := rewriteUsernsEntry(rest[4:4+n], from, to)
		if err != nil {
			return err
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(msg)))
		out = append(out, msg...)
		rest = rest[4+n:]
		entries++
	}
	if entries != 1 {
		return fmt.Errorf("%d entries, want 1", entries)
	}
	return os.WriteFile(dst, out, 0o644)
}

// rewriteUsernsEntry rewrites one userns_entry (see rewriteUserns).
func rewriteUsernsEntry(msg []byte, from, to uint32) ([]byte, error) {
	var out []byte
	maps := 0
	for len(msg) > 0 {
		key, n := uvarint(msg)
		if n <= 0 || key&7 != 2 || (key>>3 != 1 && key>>3 != 2) {
			return nil, fmt.Errorf("unexpected field %d (wire type %d)", key>>3, key&7)
		}
		msg = msg[n:]
		l, n := uvarint(msg)
		if n <= 0 || l > uint64(len(msg)-n) {
			return nil, errors.New("truncated extent")
		}
		ext, err := rewriteExtent(msg[n:n+int(l)], from, to)
		if err != nil {
			return nil, err
		}
		msg = msg[n+int(l):]
		out = binary.AppendUvarint(out, key)
		out = binary.AppendUvarint(out, uint64(len(ext)))
		out = append(out, ext...)
		maps++
	}
	if maps == 0 {
		return nil, errors.New("no uid or gid map")
	}
	return out, nil
}

// rewriteExtent rewrites one uid_gid_extent's lower_first.
func rewriteExtent(msg []byte, from, to uint32) ([]byte, error) {
	var f [4]uint64
	var seen [4]bool
	for len(msg) > 0 {
		key, n := uvarint(msg)
		if n <= 0 || key&7 != 0 || key>>3 < 1 || key>>3 > 3 {
			return nil, fmt.Errorf("unexpected extent field %d (wire type %d)", key>>3, key&7)
		}
		msg = msg[n:]
		v, n := uvarint(msg)
		if n <= 0 || v > 1<<32-1 {
			return nil, errors.New("bad extent value")
		}
		msg = msg[n:]
		f[key>>3], seen[key>>3] = v, true
	}
	if !seen[1] || !seen[2] || !seen[3] {
		return nil, errors.New("incomplete extent")
	}
	first, lower, count := f[1], f[2], f[3]
	if lower < uint64(from) || lower+count > uint64(from)+hostuid.RangeSize || first+count > hostuid.RangeSize {
		return nil, fmt.Errorf("extent %d %d %d is not within the sandbox's host range %d", first, lower, count, from)
	}
	lower = lower - uint64(from) + uint64(to)
	var out []byte
	for i, v := range []uint64{first, lower, count} {
		out = binary.AppendUvarint(out, uint64(i+1)<<3)
		out = binary.AppendUvarint(out, v)
	}
	return out, nil
}

func uvarint(b []byte) (uint64, int) { return binary.Uvarint(b) }

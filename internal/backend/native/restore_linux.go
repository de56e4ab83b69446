package native

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/layers"
)

// restoredTree is a sandbox's tree brought back by restore, with the
// supervisor's ends of its pipes and of its control socket.
type restoredTree struct {
	pid   int // init's, on the host: a child of the supervisor
	proc  *os.Process
	pipes map[uint64]*os.File // by the dumped pipe's inode
	ctl   *os.File
	took  time.Duration
	// layerMount is the id of the mount of a template's layers whose
	// files the tree maps ("": none).
	layerMount string
}

// kill ends the restored tree (init is PID 1 of its namespace) and reaps
// it.
func (r *restoredTree) kill() {
	r.proc.Kill()
	r.proc.Wait()
	for _, f := range r.pipes {
		f.Close()
	}
	if r.ctl != nil {
		r.ctl.Close()
	}
}

// restoreTree brings back the tree of cp as a child of this process
// (criu --restore-sibling): its namespaces anew, its processes with their
// memory, its external mounts bound from cp's sources, init's host files
// opened again, and new pipes and a new control socket in place of those
// to the host.
func restoreTree(ctx context.Context, bin string, cp *checkpoint) (_ *restoredTree, err error) {
	r := &restoredTree{pipes: map[uint64]*os.File{}}
	var give []*os.File // criu's descriptors 3, 4, ...
	defer func() {
		for _, f := range give {
			f.Close()
		}
		if err != nil {
			for _, f := range r.pipes {
				f.Close()
			}
			if r.ctl != nil {
				r.ctl.Close()
			}
		}
	}()
	// The sandbox's root tmpfs, mounted where CRIU finds it (--root);
	// a fork's copy has its own, mounted already (cp.root).
	root := cp.root
	if root == "" {
		root = filepath.Join(cp.dir, "root")
		if err := os.Mkdir(root, 0o700); err != nil {
			return nil, err
		}
		defer os.Remove(root)
		if err := mountRootOf(cp.mntns, root); err != nil {
			return nil, err
		}
		// CRIU has bound it into the restored namespace by the time it
		// returns.
		defer unix.Unmount(root, unix.MNT_DETACH)
	}
	pidfile := filepath.Join(cp.dir, "restored.pid")
	os.Remove(pidfile)
	args := []string{"restore", "--images-dir", cp.images(), "--log-file", "restore.log", "-v2",
		"--root", root, "--restore-detached", "--restore-sibling", "--pidfile", pidfile, "--empty-ns", "net"}
	vols, volArgs, err := prepareVolumes(cp)
	if err != nil {
		return nil, err
	}
	defer vols.cleanup() // after the hooks' close, deferred below
	args = append(args, volArgs...)
	hooks, err := startRestoreHooks(cp.dir, cp.userSysctls, cp.mounts)
	if err != nil {
		return nil, err
	}
	hooks.volumes = vols
	closeHooks := sync.OnceValue(hooks.close)
	defer closeHooks()
	script, err := hooks.script()
	if err != nil {
		return nil, err
	}
	args = append(args, "--action-script", script)
	if cp.hasZygoteLower() {
		// A sandbox forked from a zygote: its runner was confined with
		// Landlock by the zygote (runner/landlock.py), and so was every
		// process and thread it made. CRIU saves no Landlock domain; it
		// gives every restored thread but init's one of its own, with
		// the same rules (scripts/criu/landlock-restore.patch), before
		// the thread runs again.
		args = append(args, "--landlock-beneath-root")
	}
	args = append(args, cp.restoreArgs...)
	overlays := map[string]string{} // mount point → the restore's overlay
	for _, m := range cp.mounts {
		src := m.source
		if m.volume != "" {
			continue // volArgs
		}
		if m.lower != "" {
			if src, err = mountOverlayFor(cp, m); err != nil {
				return nil, err
			}
			defer os.Remove(src)
			defer unix.Unmount(src, unix.MNT_DETACH)
			overlays[m.mountpoint] = src
		}
		args = append(args, "--external", "mnt["+m.key+"]:"+src)
	}
	inherit := func(f *os.File, id string) {
		args = append(args, "--inherit-fd", fmt.Sprintf("fd[%d]:%s", 3+len(give), id))
		give = append(give, f)
	}
	if slices.ContainsFunc(cp.files, func(f extFile) bool { return f.under == templateUnder }) {
		src, id, err := mountLayersFor(cp.layers)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		defer src.Close()
		overlays[templateUnder] = fmt.Sprintf("/proc/self/fd/%d", src.Fd())
		r.layerMount = id
	}
	for _, f := range cp.files {
		h, err := reopenFile(f, overlays)
		if err != nil {
			// Not wrapped: a file of the host's gone is no "not found" of
			// the client's, and its path is the host's.
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			what := "a file of init's"
			if f.under != "" {
				what = f.path
			}
			return nil, fmt.Errorf("restore: reopen %s: %v", what, err)
		}
		inherit(h, f.key)
	}
	for _, p := range cp.pipes {
		rd, wr, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		if p.reader {
			r.pipes[p.ino] = wr
			inherit(rd, fmt.Sprintf("pipe:[%d]", p.ino))
		} else {
			r.pipes[p.ino] = rd
			inherit(wr, fmt.Sprintf("pipe:[%d]", p.ino))
		}
	}
	for _, s := range cp.socks {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		r.ctl = os.NewFile(uintptr(pair[0]), "control")
		inherit(os.NewFile(uintptr(pair[1]), "control (sandbox)"), fmt.Sprintf("socket:[%d]", s.ino))
	}
	start := time.Now()
	err = criu.Run(ctx, bin, args, give, cp.images(), "restore.log", hooks.actions()...)
	if herr := closeHooks(); herr != nil && err != nil {
		err = fmt.Errorf("%w (%v)", err, herr)
	}
	if verr := volumeChanged(err, cp.mounts, cp.volumes); verr != nil {
		err = verr // what the client can do; CRIU's own words are in its restore.log
	}
	if err != nil {
		reapFailedRestore(cp.group)
		// What a criu that was killed left mounted: its cgroup yard.
		unmountUnder(cp.images())
		return nil, err
	}
	r.took = time.Since(start)
	b, err := os.ReadFile(pidfile)
	if err != nil {
		return nil, fmt.Errorf("restore: no pid file: %w", err)
	}
	if r.pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return nil, fmt.Errorf("restore: pid file: %w", err)
	}
	if r.proc, err = os.FindProcess(r.pid); err != nil {
		return nil, err
	}
	return r, nil
}

// mountOverlayFor mounts on the host, under the checkpoint's directory, a
// new read-only overlay of m.lower for CRIU to bind where the sandbox had
// its own: the same files through inodes of the overlay's own
// (overlay_linux.go), mounted by the supervisor rather than by the
// sandbox's init, so locked in the restored namespace.
func mountOverlayFor(cp *checkpoint, m extMount) (string, error) {
	empty := filepath.Join(cp.dir, "empty")
	if err := os.Mkdir(empty, 0o755); err != nil && !os.IsExist(err) {
		return "", err
	}
	dst := filepath.Join(cp.dir, "overlay-"+m.key)
	lower, err := resolveLower(m.lower, cp.zygoteFiles)
	if err != nil {
		return "", fmt.Errorf("restore: %s: %w", m.mountpoint, err)
	}
	if err := mountOverlay(lower, empty, dst); err != nil {
		return "", fmt.Errorf("restore: %s: %w", m.mountpoint, err)
	}
	return dst, nil
}

// mountLayersFor mounts a template's layers as they are, read-only, as a
// detached mount (nothing of the host's tree): what a restored sandbox
// forked from the template's zygote maps its interpreter and libraries
// from. It returns the mount and its id.
func mountLayersFor(dirs []string) (*os.File, string, error) {
	if len(dirs) == 0 {
		return nil, "", errors.New("the tree maps a template's files, and the sandbox has no template")
	}
	m, err := layers.MountLayers(dirs, nil, "", "")
	if err != nil {
		return nil, "", fmt.Errorf("the template's layers: %w", err)
	}
	var stx unix.Statx_t
	if err := unix.Statx(int(m.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil || stx.Mask&unix.STATX_MNT_ID == 0 {
		m.Close()
		return nil, "", fmt.Errorf("the template's layers: no mount id (statx, Linux 5.8): %v", err)
	}
	return m, strconv.FormatUint(stx.Mnt_id, 10), nil
}

// reopenFile opens an external file of a checkpoint again: init's host
// file by its path, or a mapped file of a forked sandbox beneath the
// restore's overlay of its mount (f.under), never leaving it.
func reopenFile(f extFile, overlays map[string]string) (*os.File, error) {
	if f.under == "" {
		return os.OpenFile(f.path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	src, ok := overlays[f.under]
	rel, beneath := strings.CutPrefix(f.path, f.under+"/")
	if f.under == templateUnder {
		rel, beneath = strings.CutPrefix(f.path, "/")
	}
	if !ok || !beneath {
		return nil, errors.New("not beneath an overlay of the sandbox")
	}
	dir, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	fd, err := unix.Openat2(int(dir.Fd()), rel, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, err
	}
	h := os.NewFile(uintptr(fd), f.path)
	if st, err := h.Stat(); err != nil || !st.Mode().IsRegular() {
		h.Close()
		return nil, errors.New("not a regular file")
	}
	return h, nil
}

// reapFailedRestore reaps the root task of a restore that failed: with
// --restore-sibling it is the supervisor's child, which CRIU kills but
// cannot wait for, and each failed resume (which a client can cause at
// will) would otherwise leave a zombie holding a host pid. It is told
// apart from the supervisor's other children by what only it is: the
// first process of a PID namespace of its own (NSpid ends in 1), in the
// cgroup the tree was restored into (group) or, where it failed before
// it was moved there, still named criu; dead. The criu processes
// the supervisor runs are in the host's PID namespace and its own
// cgroup; other sandboxes' inits are in their own groups.
func reapFailedRestore(group string) {
	if group == "" {
		return
	}
	self := os.Getpid()
	for deadline := time.Now().Add(time.Second); ; time.Sleep(20 * time.Millisecond) {
		alive := false
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", self))
		for _, t := range tasks {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", self, t.Name()))
			for _, c := range strings.Fields(string(b)) {
				pid, err := strconv.Atoi(c)
				if err != nil {
					continue
				}
				switch restoreRoot(pid, group) {
				case "zombie":
					var ws unix.WaitStatus
					unix.Wait4(pid, &ws, unix.WNOHANG, nil)
				case "alive":
					// Being killed by criu, or left waiting by a criu
					// that was killed (criu.MaxRun): its PID namespace
					// ends with it. It is this process's unreaped
					// child: the pid is its own.
					unix.Kill(pid, unix.SIGKILL)
					alive = true // looked at again
				}
			}
		}
		if !alive || time.Now().After(deadline) {
			return
		}
	}
}

// restoreRoot says whether pid is the root task of a restore into group:
// "zombie", "alive", or "" if it is not.
func restoreRoot(pid int, group string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	var name, state, nspid string
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		switch k {
		case "Name":
			name = strings.TrimSpace(v)
		case "State":
			state = strings.TrimSpace(v)
		case "NSpid":
			nspid = strings.TrimSpace(v)
		}
	}
	f := strings.Fields(nspid)
	if len(f) < 2 || f[len(f)-1] != "1" {
		return ""
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	in := false
	for _, l := range strings.Split(string(cg), "\n") {
		if i := strings.LastIndexByte(l, ':'); i >= 0 && l[i+1:] == group {
			in = true
			break
		}
	}
	switch {
	case !in && name != "criu":
		// Not moved to the group yet: still CRIU's process, in the
		// supervisor's group (CRIU's own processes are in the host's
		// PID namespace, excluded above).
		return ""
	case strings.HasPrefix(state, "Z"):
		return "zombie"
	}
	return "alive"
}

// settleStops waits, up to a bound, until no process of group g has a
// SIGSTOP pending: CRIU stops again the tasks that were stopped at the
// dump by sending them SIGSTOP as the restore ends, and a caller that
// looked at once (a resumed sandbox's next execution) could find one
// still running. Seen under load on CI: a stopped `sleep` was R right
// after its resume, T a moment later.
func settleStops(g cgroups.Group) {
	if g == nil {
		return
	}
	const sigstop = 1 << (19 - 1)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		pids, err := g.Procs()
		if err != nil {
			return
		}
		pending := false
		for _, pid := range pids {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				continue
			}
			var state string
			var mask uint64
			for _, l := range strings.Split(string(b), "\n") {
				k, v, _ := strings.Cut(l, ":")
				v = strings.TrimSpace(v)
				switch k {
				case "State":
					state = v
				case "SigPnd", "ShdPnd":
					m, _ := strconv.ParseUint(v, 16, 64)
					mask |= m
				}
			}
			if mask&sigstop != 0 && !strings.HasPrefix(state, "T") {
				pending = true
				break
			}
		}
		if !pending {
			return
		}
	}
}

package native

// Checkpoint and restore (docs/snapshots.md; the design:
// docs/notes/2026-11-27-pause-resume-design.md): CRIU saves a sandbox's
// process tree (init, its runner and everything they started, with their
// namespaces; a zygote's sandbox too, zygotefiles_linux.go) and brings it back
// (restore_linux.go). What the tree holds of the host is external to it,
// and CRIU must be told about each:
//
//   - mounts whose source is not visible in the sandbox: the /dev nodes,
//     bound from a host directory removed once they are bound, restored
//     from the host's own nodes; the masks over /proc, bound from a tmpfs
//     that init unmounts (procmask_linux.go), copied at dump time into
//     the checkpoint and restored from there; the /usr overlay, whose
//     second layer was in init's scratch tmpfs, restored as a new
//     overlay. A restore gives every one its flags again.
//   - the root tmpfs (the sandbox's files), which CRIU does not save: the
//     supervisor keeps the sandbox's mount namespace, and a restore
//     mounts its root for CRIU (--root).
//   - files that init holds of the host: its own executable (init is the
//     vivarium binary re-executed) and the cgroup files that the Go
//     runtime keeps open to follow its CPU limit, reopened by the
//     supervisor; files open on the /dev nodes, reopened from the host's.
//   - pipes and the control socket to the supervisor: their other end is
//     the host's. Restored onto new pipes and a new socket pair whose
//     other ends the supervisor holds.
//   - the user namespace's budgets (budgets_linux.go), which a restore
//     sets again before any restored process runs.
//
// Only the sandbox's own tree is ever dumped: the pid is the sandbox's
// init, the supervisor's child, checked in the sandbox's cgroup. Images
// hold the sandbox's memory: root's, readable by the sandbox's host root
// group and nobody else (handOver).

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// checkpoint is a dumped sandbox: its images and what its tree held of
// the host.
type checkpoint struct {
	dir    string
	mounts []extMount
	files  []extFile
	pipes  []extPipe
	socks  []extSock
	// mntns holds the sandbox's mount namespace after its processes are
	// gone, and with it the root tmpfs (the sandbox's files), which CRIU
	// does not save: a restore mounts it again (restore_linux.go).
	mntns *os.File
	// userSysctls are the budgets of the sandbox's user namespace
	// (budgets_linux.go), which CRIU does not save: a restore sets them
	// again before any restored process runs.
	userSysctls []sysctl
	// runnerPID is the runner's host pid at dump time: the first holder
	// of its request and event pipes (extPipe.pid).
	runnerPID int
	// held are the sandbox's ends of the other pipes to the host (the
	// commands'), by inode, which the supervisor keeps while the sandbox
	// is paused (holdPipes).
	held map[uint64]*os.File
	// Took is how long criu dump ran.
	took time.Duration
	// group is the cgroup the tree is restored into (its path from the
	// hierarchies' top): a failed restore's root task is found there.
	group string
	// root, for a fork's copy, is its root tmpfs, mounted on the host for
	// the restore (else the root of mntns is), and restoreArgs what else
	// its restore tells CRIU (its cgroup).
	root        string
	restoreArgs []string
	// cgroups are the hierarchies the sandbox has a group of its own
	// in, as /proc/PID/cgroup names them ("memory", "cpu,cpuacct"; ""
	// for cgroup v2): the only ones dumped.
	cgroups []string
	// zygoteFiles is the backend's copy of a zygote's files, which the
	// overlays of a forked sandbox's checkpoint name (zygotefiles_linux.go).
	zygoteFiles string
	// volumes are the volumes the restored tree mounts, where its mounts
	// name one (extMount.volume): the restored sandbox's.
	volumes []sandbox.VolumeMount
	// tookOver is the zygote's memory a restore of the tree is charged
	// for, what its memory limit is raised by (zygotememory_linux.go).
	tookOver int64
	// layerMounts are the mounts (by id) of a template's layers as they
	// are, whose files the tree may map (Sandbox.layerMounts); layers,
	// at a restore, the template's layers those files are opened from.
	layerMounts []string
	layers      []string
}

// close lets go of the sandbox's mount namespace, and so of its files,
// and of the commands' pipes it held.
func (cp *checkpoint) close() {
	if cp.mntns != nil {
		cp.mntns.Close()
		cp.mntns = nil
	}
	for ino, f := range cp.held {
		f.Close()
		delete(cp.held, ino)
	}
}

// ownPipe reports whether p is one of init's pipes or the runner's, which
// a resume gives the Sandbox anew.
func (cp *checkpoint) ownPipe(p extPipe) bool {
	if p.init && (p.fd == fdStatus || p.fd == fdStdout || p.fd == fdStderr) {
		return true
	}
	return p.pid == cp.runnerPID && (p.reader || p.fd > 2)
}

// holdPipes takes, for every other pipe to the host (a command's stdin,
// stdout or stderr, whose other end the core gave its caller), a
// descriptor of the sandbox's end (pidfd_getfd): while the sandbox is
// paused, the host's reader of its output sees no end and the host's
// writer of its input no broken pipe; a resume joins the restored pipes
// to them (joinPipe). Each descriptor is checked to be that pipe.
func (cp *checkpoint) holdPipes() error {
	cp.held = map[uint64]*os.File{}
	for _, p := range cp.pipes {
		if cp.ownPipe(p) {
			continue
		}
		f, err := grabPipe(p.pid, p.fd, p.ino)
		if errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EBADF) {
			// The process no longer holds the pipe since the tree
			// was read: a command that ended (ESRCH), is ending with
			// its descriptors closed, or closed that one (EBADF).
			// CRIU freezes the tree as it is then, without it.
			continue
		}
		if err != nil {
			return fmt.Errorf("checkpoint: the pipe %d of process %d: %w", p.fd, p.pid, err)
		}
		cp.held[p.ino] = f
	}
	return nil
}

// grabPipe returns a descriptor of the file process pid holds at fd,
// which must be the pipe ino.
func grabPipe(pid, fd int, ino uint64) (*os.File, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pidfd)
	nfd, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(nfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Ino != ino {
		unix.Close(nfd)
		return nil, errors.New("not the pipe it was (the process changed its descriptors)")
	}
	return os.NewFile(uintptr(nfd), "pipe"), nil
}

// handOver makes the checkpoint's directory readable by the restored
// tasks and by nobody else: owned by root and by the sandbox's host root
// group (gid), directories 0750, files 0640. The tasks open images and
// mount sources first as the host's root (still their credentials just
// after they entered the new user namespace, where their capabilities do
// not reach host files), then as the sandbox's root, whose group this is.
// The sandbox's own host user may read its own memory; nobody else on
// the host can, and no process of the sandbox exists while it is paused.
// The /proc masks' copies keep their modes (0444, 0555).
func (cp *checkpoint) handOver(gid int) error {
	// The masks' files the checkpoint's are links to (maskStore): the
	// same inodes, handed over below; their directory as any other.
	if store := maskStore(cp.dir); isDir(store) {
		if err := os.Lchown(store, 0, gid); err != nil {
			return err
		}
		if err := os.Chmod(store, 0o750); err != nil {
			return err
		}
	}
	return filepath.Walk(cp.dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("checkpoint: unexpected symbolic link %s", p)
		}
		if err := os.Lchown(p, 0, gid); err != nil {
			return err
		}
		if filepath.Dir(p) == filepath.Join(cp.dir, "ext") {
			// The /proc masks, bound into the sandbox as they were:
			// readable by all there (copyMask), behind cp.dir here.
			return nil
		}
		if fi.IsDir() {
			return os.Chmod(p, 0o750)
		}
		return os.Chmod(p, 0o640)
	})
}

// isDir reports whether p is a directory (not a link to one).
func isDir(p string) bool {
	fi, err := os.Lstat(p)
	return err == nil && fi.IsDir()
}

// images is the directory of CRIU's images.
func (cp *checkpoint) images() string { return filepath.Join(cp.dir, "images") }

// extMount is a mount CRIU restores from a host path: source, or a new
// read-only overlay of the host directory lower (/usr) that a restore
// mounts.
type extMount struct {
	key, mountpoint, source string
	lower                   string
	flags                   string // its per-mount options at dump time
	// volume, for a volume's mount, is the volume's path in the spec: a
	// restore mounts that volume anew (volpause_linux.go).
	volume string
}

// extFile is a host file that init held, restored by opening it again;
// or, with under set, a file of the sandbox's own overlay at under that a
// process of a forked sandbox maps from the zygote's root (its
// interpreter and libraries), restored from the restore's overlay; or,
// with under templateUnder, a file of a template's layers (path beneath
// their root) that a process of a sandbox forked from the template's
// zygote maps, restored from the template's layers as they are.
type extFile struct {
	key, path string
	under     string
}

// templateUnder is extFile.under for a file of the template's layers.
const templateUnder = "template:"

// extPipe is a pipe whose other end is the host's.
type extPipe struct {
	ino    uint64
	reader bool // the sandbox holds its read end
	pid    int  // the first holder, on the host, and its descriptor
	fd     int
	init   bool // held by init
}

// extSock is a socket of init whose peer is the host's (the control
// socket).
type extSock struct {
	ino uint64
	fd  int
}

// maxMaskFile bounds a /proc mask's contents copied at dump time: they
// are a few hundred bytes of synthesised text.
const maxMaskFile = 64 << 10

// devNodes are the /dev nodes a sandbox gets bound from the host
// (devices_linux.go, mount_linux.go's devices); a restore binds the host's
// own.
var devNodes = func() map[string]bool {
	m := map[string]bool{}
	for _, d := range devices {
		m["/dev/"+d] = true
	}
	return m
}()

// dump saves the sandbox's process tree to dir (created, must not
// exist; see prepareDump) with CRIU at bin and ends the tree: its processes are
// stopped and their memory freed. A dump that fails leaves the sandbox
// running as it was (with a new control socket, which the Sandbox reads,
// and its budgets as before). Only classic sandboxes: a zygote's
// sandboxes share the zygote's memory and are not supported yet.
func (s *Sandbox) dump(ctx context.Context, bin, dir string) (*checkpoint, error) {
	return s.dumpTree(ctx, bin, dir, dumpOptions{})
}

// dumpOptions are what a snapshot (fork_linux.go) asks of a dump.
type dumpOptions struct {
	// leaveRunning: the tree goes on running after the dump (criu
	// --leave-running); the commands' pipes are not held, and the
	// user namespace's budget is set back whatever the outcome.
	leaveRunning bool
	// files, with leaveRunning, is a new tmpfs (mounted with
	// filesOpts) the root tmpfs's files are copied into (cp -a) while
	// the dumped tree is still frozen (CRIU's post-dump action), so
	// that they are those the images' memory saw.
	files, filesOpts string
	// filesFrom, if set, is what is copied to files instead of the
	// root: a template's sandbox's writable layer (upperDir).
	filesFrom string
	// share, if not nil, is the zygote's memory the tree shares,
	// counted by the caller as no execution ran (zygoteShare); else the
	// dump counts it.
	share *int64
}

// dumpTree is dump, with opts.
func (s *Sandbox) dumpTree(ctx context.Context, bin, dir string, opts dumpOptions) (_ *checkpoint, err error) {
	if s.init == nil || isClosed(s.dead()) {
		return nil, errors.New("checkpoint: the sandbox is not running")
	}
	pid := s.init.pid
	// The zygote's pages the tree shares: the caller's count, or one made
	// (some 20 ms with pandas) while what the tree holds of the host is
	// read; no execution runs and no command starts meanwhile (the
	// caller's locks).
	var share int64
	var shareErr error
	counted := make(chan struct{})
	if opts.share != nil {
		share = *opts.share
		close(counted)
	} else {
		go func() {
			defer close(counted)
			share, shareErr = s.zygoteShare()
		}()
	}
	defer func() { <-counted }()
	// The sandbox's user namespace, held from now on: the budgets below
	// are written through it, never through a pid that could be reused.
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: the sandbox's user namespace: %w", err)
	}
	defer userns.Close()
	// The control socket was made in the supervisor's network namespace,
	// where CRIU does not look for it: init takes one made in its own.
	if err := s.rebindControl(); err != nil {
		return nil, err
	}
	// The runner, whose pipes a resume gives the core again.
	s.mu.Lock()
	rp := s.rp
	s.mu.Unlock()
	if rp == nil {
		return nil, errors.New("checkpoint: the sandbox has no runner")
	}
	zfiles, err := s.b.zygoteFiles(false)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	vdevs, err := volumeDevs(s.spec.Volumes)
	if err != nil {
		return nil, err
	}
	cp, err := prepareDump(pid, rp.pid, dir, zfiles, vdevs, s.layerMounts)
	if err != nil {
		return nil, err
	}
	if cp.hasZygoteLower() {
		if _, err := s.b.zygoteFiles(true); err != nil {
			cp.close()
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
	}
	if !opts.leaveRunning {
		if err := cp.holdPipes(); err != nil {
			cp.close()
			return nil, err
		}
	}
	// CRIU dumps a tmpfs's files from a helper mount namespace that it
	// makes in the sandbox's user namespace, whose max_mnt_namespaces is
	// 0 (budgets_linux.go): a few for the dump, which ends the namespace
	// (a restore sets 0 again). Seccomp refuses the sandbox's own
	// processes a new namespace all the same.
	mntBudget := sysctl{"user/max_mnt_namespaces", "0"}
	for _, v := range s.cfg.Sysctls {
		if strings.HasPrefix(v.Path, "user/") {
			cp.userSysctls = append(cp.userSysctls, v)
		}
		if v.Path == mntBudget.Path {
			mntBudget = v
		}
	}
	if err := userNSSysctls(userns, []sysctl{{mntBudget.Path, strconv.Itoa(dumpMntNamespaces)}}); err != nil {
		return nil, err
	}
	dumped := false
	defer func() {
		if !dumped || opts.leaveRunning {
			// The sandbox goes on: its budget as it was.
			if rerr := userNSSysctls(userns, []sysctl{mntBudget}); rerr != nil {
				// Seccomp still refuses its processes a namespace, but
				// a sandbox is not left with a weaker confinement.
				s.kill()
				err = errors.Join(err, rerr)
			}
		}
	}()
	if cp.mntns, err = os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err != nil {
		return nil, fmt.Errorf("checkpoint: the sandbox's mount namespace: %w", err)
	}
	args := []string{"dump", "--tree", strconv.Itoa(pid), "--images-dir", cp.images(), "--log-file", "dump.log", "-v2",
		"--ext-unix-sk", "--empty-ns", "net", "--network-lock", "skip"}
	for _, m := range cp.mounts {
		args = append(args, "--external", "mnt["+m.mountpoint+"]:"+m.key)
	}
	for _, f := range cp.files {
		args = append(args, "--external", f.key)
	}
	for _, k := range cp.socks {
		// A stream socket with its peer outside the tree.
		args = append(args, "--external", fmt.Sprintf("unix[%d]", k.ino))
	}
	if s.cg != nil {
		// Only the hierarchies the sandbox has a group of its own in:
		// in the others (cgroup v1's devices, cpuset ...) its group is
		// the host's root, and CRIU would save the host's whole tree
		// of groups there, and a restore create again any of them
		// removed since (or fail, racing with its removal).
		if cp.cgroups, err = cgroupControllers(pid, s.cg.Path()); err != nil {
			cp.close()
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		for _, c := range cp.cgroups {
			if c != "" {
				args = append(args, "--cgroup-dump-controller", c)
			}
		}
	}
	if opts.leaveRunning {
		args = append(args, "--leave-running")
	}
	if opts.files != "" {
		script, cleanup, err := cp.copyFilesScript(opts.files, opts.filesOpts, opts.filesFrom)
		if err != nil {
			cp.close()
			return nil, err
		}
		defer cleanup()
		args = append(args, "--action-script", script)
	}
	// Only the sandbox's own tree: init is this process's child, so its
	// pid is its own until it is reaped, and while it lives it is in
	// the sandbox's cgroup. (Were init to die and be reaped between this
	// check and CRIU's seizing it, CRIU would be given a pid that another
	// process may take: a window of a few milliseconds, for a process
	// of the host to be forked with that very pid.)
	if isClosed(s.dead()) {
		cp.close()
		return nil, errors.New("checkpoint: the sandbox's init exited")
	}
	if s.cg != nil {
		if pids, err := s.cg.Procs(); err != nil || !slices.Contains(pids, pid) {
			cp.close()
			return nil, fmt.Errorf("checkpoint: init %d is not in the sandbox's cgroup (%v)", pid, err)
		}
	}
	<-counted
	if shareErr != nil {
		cp.close()
		return nil, fmt.Errorf("checkpoint: %w", shareErr)
	}
	cp.tookOver = s.tookOver + share
	start := time.Now()
	if err := criu.Run(ctx, bin, args, nil, cp.images(), "dump.log", "post-dump"); err != nil {
		unmountUnder(cp.images()) // what a criu that was killed left mounted
		cp.close()
		return nil, err
	}
	dumped = true
	cp.took = time.Since(start)
	if opts.leaveRunning {
		return cp, nil // its copies are handed over each (fork_linux.go)
	}
	if err := cp.handOver(int(s.owner.ID(0))); err != nil {
		cp.close()
		return nil, err
	}
	return cp, nil
}

// prepareDump makes the checkpoint directory dir (mode 0700, must not
// exist) and finds what the tree of init (pid) holds of the host, and its
// runner (pid runner in the sandbox; 0: none is looked for).
//
// dir holds images/, CRIU's images, and ext/, the copies of the /proc
// masks. Its parent must let the sandbox's host root group through (mode
// 0711): see handOver. The masks' files are hard links to copies kept in
// the parent, the sandbox's own directory (maskStore).
func prepareDump(pid, runner int, dir, zygoteFiles string, volumes map[string]string, layerMounts []string) (*checkpoint, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	cp := &checkpoint{dir: dir, zygoteFiles: zygoteFiles, layerMounts: layerMounts}
	if err := os.Mkdir(filepath.Join(dir, "ext"), 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(cp.images(), 0o700); err != nil {
		return nil, err
	}
	mnts, err := readMountinfo(pid)
	if err != nil {
		return nil, err
	}
	if err := cp.collectMounts(pid, mnts, volumes); err != nil {
		return nil, err
	}
	tree, err := processTree(pid)
	if err != nil {
		return nil, err
	}
	if runner > 0 {
		if cp.runnerPID, err = runnerHostPID(tree, runner); err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
	}
	if err := cp.collectFiles(pid, tree, mnts); err != nil {
		return nil, err
	}
	return cp, nil
}

// mountEntry is one line of /proc/PID/mountinfo.
type mountEntry struct {
	id, dev, root, point string
	flags                string // the mount's own options (ro,nosuid,...)
	fstype, options      string // after the separator: the file system's
}

func readMountinfo(pid int) ([]mountEntry, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 5 {
			continue
		}
		e := mountEntry{id: fl[0], dev: fl[2], root: unescapeMount(fl[3]), point: unescapeMount(fl[4]), flags: fl[5]}
		for i, f := range fl {
			if f == "-" && i+3 < len(fl) {
				e.fstype, e.options = fl[i+1], fl[i+3]
				break
			}
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// collectMounts finds the mounts CRIU cannot dump on its own: binds whose
// source has no mount of its file system's root in the sandbox. /dev
// nodes are restored from the host's; every other one is a /proc mask,
// copied into dir/ext. The mounts of a device of volumes (its file
// system's, by the volume's path in the spec) are the volume's.
func (cp *checkpoint) collectMounts(pid int, mnts []mountEntry, volumes map[string]string) error {
	rooted := map[string]bool{}
	templateRoot := ""
	for _, m := range mnts {
		if m.root == "/" {
			rooted[m.dev] = true
		}
		if m.point == "/" && m.fstype == "overlay" {
			templateRoot = m.dev
		}
	}
	root, err := os.Open(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		return err
	}
	defer root.Close()
	for _, m := range mnts {
		key := "m" + m.id
		if p, ok := volumes[m.dev]; ok {
			vm, err := volumeMount(key, m, p)
			if err != nil {
				return err
			}
			cp.mounts = append(cp.mounts, vm)
			continue
		}
		if m.fstype == "overlay" && m.dev == templateRoot {
			// A template's root (a restore gives it to CRIU: --root),
			// or a bind of a directory of it (/home/user, /dev/shm),
			// which CRIU binds again from there.
			continue
		}
		if m.fstype == "overlay" {
			// Its second layer is an empty directory of init's scratch
			// tmpfs, gone once init set up.
			lower, err := overlayLower(m.options, cp.zygoteFiles)
			if err != nil {
				return fmt.Errorf("checkpoint: the overlay at %s: %w", m.point, err)
			}
			cp.mounts = append(cp.mounts, extMount{key: key, mountpoint: m.point, lower: lower, flags: m.flags})
			continue
		}
		if rooted[m.dev] {
			continue
		}
		switch {
		case devNodes[m.point]:
			cp.mounts = append(cp.mounts, extMount{key: key, mountpoint: m.point, source: m.point, flags: m.flags})
		case strings.HasPrefix(m.point, "/proc/"):
			src := filepath.Join(cp.dir, "ext", key)
			if err := copyMask(int(root.Fd()), m.point, src, maskStore(cp.dir)); err != nil {
				return fmt.Errorf("checkpoint: copy the mask over %s: %w", m.point, err)
			}
			cp.mounts = append(cp.mounts, extMount{key: key, mountpoint: m.point, source: src, flags: m.flags})
		default:
			return fmt.Errorf("checkpoint: the mount at %s (root %s) has no source CRIU can reach", m.point, m.root)
		}
	}
	return nil
}

// overlayLower returns the host directory a sandbox's read-only overlay
// shows (its first lower layer), from the overlay's mount options: one
// directory of the host's root, as mount_linux.go makes them for a classic
// sandbox, and nothing else.
func overlayLower(options, zygoteFiles string) (string, error) {
	for _, o := range strings.Split(options, ",") {
		v, ok := strings.CutPrefix(o, "lowerdir=")
		if !ok {
			continue
		}
		first, _, _ := strings.Cut(v, ":")
		if lower, ok := zygoteLower(first); ok {
			return lower, nil // a forked sandbox's
		}
		if rel, ok := strings.CutPrefix(first, zygoteFiles+"/"); ok && zygoteFiles != "" {
			if lower, ok := zygoteLower("/" + rel); ok && strings.HasPrefix(lower, zygoteLowerPrefix) {
				return lower, nil // a restored forked sandbox's
			}
		}
		name := strings.TrimPrefix(first, "/")
		if !strings.HasPrefix(first, "/") || name == "" || strings.ContainsAny(name, "/\\") || name == ".." || name == "." {
			return "", fmt.Errorf("lower layer %q is not a directory of the host's root", first)
		}
		return first, nil
	}
	return "", errors.New("no lower layer")
}

// copyMask copies what the sandbox sees at point (a mask: an empty
// directory or a small file) to dst. The path is resolved inside the
// sandbox's root without following symbolic links, and only a directory
// or a regular file of at most maxMaskFile bytes is taken. A file is a
// hard link to the copy of the same bytes in store, made there the first
// time.
func copyMask(rootFD int, point, dst, store string) error {
	fd, err := unix.Openat2(rootFD, strings.TrimPrefix(point, "/"), &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), point)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.IsDir() {
		return os.Mkdir(dst, 0o555)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("not a file nor a directory (%v)", st.Mode())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxMaskFile+1))
	if err != nil {
		return err
	}
	if len(b) > maxMaskFile {
		return fmt.Errorf("over %d bytes", maxMaskFile)
	}
	return storedMask(store, b, dst)
}

// maskStore is where the checkpoints in dir's parent (a sandbox's, or a
// snapshot's) keep the /proc masks' files, each once: a sandbox's masks do
// not change, and each checkpoint's are hard links to them. A new inode
// of a busy ext4 costs far more than its bytes (the allocator passes
// over the inodes freed in the last seconds, and pausing and forking
// sandboxes free many): the 20 or so files a pause wrote took some 20 ms
// of CPU on this project's shared machine. The store goes with the
// directory (removeCheckpoints, removeSnapshot); it is made root's, 0700,
// and handed over with a pause's checkpoint as the rest (handOver); its
// files are root's, 0444, as bound in the sandbox.
func maskStore(dir string) string { return filepath.Join(filepath.Dir(dir), "masks") }

// storedMask makes dst a hard link to the file of store holding b (made
// there if it is not, named by its SHA-256).
func storedMask(store string, b []byte, dst string) error {
	sum := sha256.Sum256(b)
	kept := filepath.Join(store, hex.EncodeToString(sum[:]))
	if err := os.Link(kept, dst); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Mkdir(store, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	// Written under another name and renamed: a kept file is whole.
	tmp, err := os.CreateTemp(store, "new-")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Chmod(0o444)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), kept)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Link(kept, dst)
}

// processTree lists pid and its descendants.
func processTree(pid int) ([]int, error) {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", out[i]))
		if err != nil {
			if i > 0 && gone(err) {
				continue // it exited meanwhile: CRIU finds the tree as it is
			}
			return nil, err
		}
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", out[i], t.Name()))
			if err != nil {
				continue
			}
			for _, c := range strings.Fields(string(b)) {
				if n, err := strconv.Atoi(c); err == nil {
					out = append(out, n)
				}
			}
		}
	}
	return out, nil
}

// unmountUnder detaches every mount of this mount namespace below dir
// (and at it), the deepest first, as many times as mounts are stacked
// there: what a criu that was killed left (its cgroup yard), or what a
// server that crashed left under its checkpoints.
func unmountUnder(dir string) {
	dir = filepath.Clean(dir)
	for range 8 { // stacked mounts: one layer a round
		mnts, err := readMountinfo(os.Getpid())
		if err != nil {
			return
		}
		var under []string
		for _, m := range mnts {
			if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
				under = append(under, m.point)
			}
		}
		if len(under) == 0 {
			return
		}
		slices.SortFunc(under, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
		for _, p := range under {
			unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		}
	}
}

// dumpDescriptors is how many descriptors CRIU's parasite opens in each
// process it saves (a memfd for its code, and its control socket).
const dumpDescriptors = 2

// descriptorsLeft refuses a process with too few descriptors left under
// its RLIMIT_NOFILE (open of them open) for CRIU's parasite to open its
// own (code that opened files until EMFILE): the dump would fail halfway,
// said by CRIU as "Can't create memfd in victim". The process could close
// some, or raise its soft limit; the server does not change the
// sandbox's limits behind its back.
func descriptorsLeft(pid, open int) error {
	limit, ok := openFilesLimit(pid)
	if !ok || open+dumpDescriptors <= limit {
		return nil // or it exited meanwhile: CRIU finds the tree as it is
	}
	comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return fmt.Errorf("%w: a process of the sandbox (%s) has %d files open, with %d allowed (RLIMIT_NOFILE): "+
		"saving it needs %d more; close some of its files first",
		sandbox.ErrBusy, strings.TrimSpace(string(comm)), open, limit, dumpDescriptors)
}

// openFilesLimit reads process pid's soft RLIMIT_NOFILE from
// /proc/PID/limits (prlimit(2) on another user's process needs
// CAP_SYS_RESOURCE, which a host's root may lack).
func openFilesLimit(pid int) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "Max open files"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, err := strconv.Atoi(f[0])
				return n, err == nil
			}
		}
	}
	return 0, false
}

// collectFiles finds what the tree holds of the host: pipes with one end
// outside, init's control socket, files of init on mounts the sandbox
// does not have (its executable, the Go runtime's cgroup files), and
// files open on the /dev nodes (reopened from the host's node of that
// name, whatever the sandbox did to the path).
// A process other than init holding a file of a host mount is refused:
// only init is trusted to, and reopening what a sandboxed process names
// would open host files on its say; so is one without descriptors to
// spare for CRIU (descriptorsLeft).
func (cp *checkpoint) collectFiles(initPID int, tree []int, mnts []mountEntry) error {
	inNS := map[string]bool{}
	// The /dev nodes bound from a directory since removed: CRIU takes
	// their files for deleted ones, which it would re-create beside
	// them. They are external files instead, the host's node reopened.
	devNode := map[string]string{}
	overlayDev := map[string]string{} // the overlays' file systems → mount points
	for _, m := range mnts {
		inNS[m.id] = true
		if m.fstype == "overlay" && m.root == "/" {
			overlayDev[m.dev] = m.point
		}
		if devNodes[m.point] && strings.HasSuffix(m.root, "//deleted") {
			devNode[m.id] = m.point
		}
	}
	type pipeEnds struct {
		readers, writers int
		first            extPipe
	}
	pipes := map[uint64]*pipeEnds{}
	var order []uint64
	sockets := map[string]int{} // the sandbox's sockets' inodes → a process holding it
	seenFile := map[string]bool{}
	addFile := func(pid int, mntID string, st *unix.Stat_t, path string, mapped bool) error {
		ino := st.Ino
		under := ""
		if node := devNode[mntID]; node != "" {
			path = node // the host's node of that name, not what the sandbox says
		} else if !inNS[mntID] && isHostNode(path, st) {
			// A /dev node a restore reopened from the host's (a second
			// pause): the same again.
		} else if inNS[mntID] {
			return nil
		} else if pid != initPID && slices.Contains(cp.layerMounts, mntID) {
			// A sandbox forked from a template's zygote maps its
			// interpreter and libraries from the template's layers as
			// they are, through the zygote's root (or, restored, the
			// restore's): a restore maps the same path of the layers,
			// beneath their root, never a file of the host's.
			if !mapped || st.Mode&unix.S_IFMT != unix.S_IFREG || !filepath.IsAbs(path) || filepath.Clean(path) != path {
				return fmt.Errorf("checkpoint: process %d of the sandbox holds %s, a file outside it", pid, path)
			}
			under = templateUnder
		} else if pid != initPID {
			// A forked sandbox's process maps its interpreter and
			// libraries from the zygote's root (path is the zygote's),
			// or, restored, from the restore's overlay of one of its
			// own (of the same file system: path is beneath that
			// overlay, which is no longer mounted on the host). A
			// restore maps the same path of the sandbox's own overlay,
			// never a file of the host's.
			if point, ok := overlayDev[fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))]; ok {
				path = point + path
			}
			if under = cp.overlayOf(path); !mapped || under == "" || st.Mode&unix.S_IFMT != unix.S_IFREG {
				return fmt.Errorf("checkpoint: process %d of the sandbox holds %s, a file outside it", pid, path)
			}
		}
		id, _ := strconv.Atoi(mntID)
		key := fmt.Sprintf("file[%x:%x]", id, ino)
		if !seenFile[key] {
			seenFile[key] = true
			cp.files = append(cp.files, extFile{key: key, path: path, under: under})
		}
		return nil
	}
	for _, pid := range tree {
		fdDir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(fdDir)
		if err != nil {
			if pid != initPID && gone(err) {
				continue // it exited meanwhile
			}
			return err
		}
		if err := descriptorsLeft(pid, len(ents)); err != nil {
			return err
		}
		for _, e := range ents {
			fd, _ := strconv.Atoi(e.Name())
			link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
			if err != nil {
				continue
			}
			info, err := readFdinfo(pid, fd)
			if err != nil {
				continue
			}
			switch {
			case strings.HasPrefix(link, "pipe:["):
				ino, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "pipe:["), "]"), 10, 64)
				p := pipes[ino]
				if p == nil {
					p = &pipeEnds{first: extPipe{ino: ino, pid: pid, fd: fd, init: pid == initPID}}
					pipes[ino] = p
					order = append(order, ino)
				} else if pid == cp.runnerPID && !p.first.init {
					// The runner's own, which a process it forked (a
					// daemon of the sandbox's code) holds too, and may
					// come first in the tree: a restore gives the runner
					// its pipes back by their holder (adopt).
					p.first.pid, p.first.fd = pid, fd
				}
				if info.flags&unix.O_ACCMODE == unix.O_WRONLY {
					p.writers++
				} else {
					p.readers++
				}
			case strings.HasPrefix(link, "socket:[") && pid == initPID && fd == fdControl:
				ino, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 64)
				cp.socks = append(cp.socks, extSock{ino: ino, fd: fd})
			case strings.HasPrefix(link, "socket:["):
				sockets[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = pid
			case sandboxMemory(link):
				// A memfd or a SysV shared memory segment: the sandbox's
				// own memory, which CRIU saves with it.
			case strings.HasPrefix(link, "/"):
				var st unix.Stat_t
				if err := unix.Stat(filepath.Join(fdDir, e.Name()), &st); err != nil {
					if gone(err) {
						continue // closed, or its process exited, meanwhile
					}
					return err
				}
				if err := addFile(pid, info.mntID, &st, link, false); err != nil {
					return err
				}
			}
		}
		// The executable and other mapped files.
		maps, err := os.ReadDir(fmt.Sprintf("/proc/%d/map_files", pid))
		if err != nil {
			if pid != initPID && gone(err) {
				continue
			}
			return err
		}
		seen := map[string]bool{}
		for _, e := range maps {
			p := fmt.Sprintf("/proc/%d/map_files/%s", pid, e.Name())
			link, err := os.Readlink(p)
			if err != nil || seen[link] || !strings.HasPrefix(link, "/") || sandboxMemory(link) {
				continue
			}
			seen[link] = true
			f, err := os.Open(p)
			if err != nil {
				continue
			}
			var st unix.Stat_t
			err = unix.Fstat(int(f.Fd()), &st)
			info, ierr := readFdinfo(os.Getpid(), int(f.Fd()))
			f.Close()
			if err != nil || ierr != nil {
				return fmt.Errorf("checkpoint: inspect %s of process %d: %w", link, pid, errors.Join(err, ierr))
			}
			if sharedAnonymous(link, &st) {
				continue
			}
			if err := addFile(pid, info.mntID, &st, link, true); err != nil {
				return err
			}
		}
	}
	if err := connectedTCP(initPID, sockets); err != nil {
		return err
	}
	for _, ino := range order {
		p := pipes[ino]
		if p.readers > 0 && p.writers > 0 {
			continue // both ends in the sandbox: CRIU restores it whole
		}
		e := p.first
		e.reader = p.readers > 0
		cp.pipes = append(cp.pipes, e)
	}
	return nil
}

// hasZygoteLower reports whether an overlay of cp is of a zygote's files.
func (cp *checkpoint) hasZygoteLower() bool {
	for _, m := range cp.mounts {
		if strings.HasPrefix(m.lower, zygoteLowerPrefix) {
			return true
		}
	}
	return false
}

// overlayOf returns the mount point of the read-only overlay (of cp's
// external mounts) that path is beneath, or "".
func (cp *checkpoint) overlayOf(path string) string {
	best := ""
	for _, m := range cp.mounts {
		if m.lower != "" && strings.HasPrefix(path, m.mountpoint+"/") && len(m.mountpoint) > len(best) {
			best = m.mountpoint
		}
	}
	return best
}

// connectedTCP refuses a dump of a sandbox whose processes hold a TCP
// socket that is neither listening nor closed (sockets: inode → holder):
// CRIU does not keep established connections, and would fail saying so in
// its own words. The sandbox's TCP sockets are read from its network
// namespace's tables, through init.
func connectedTCP(initPID int, sockets map[string]int) error {
	if len(sockets) == 0 {
		return nil
	}
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", initPID, table))
		if err != nil {
			if gone(err) {
				continue
			}
			return fmt.Errorf("checkpoint: the sandbox's TCP sockets: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 {
				continue
			}
			// st: 0A is LISTEN, 07 CLOSE (a socket never connected).
			pid, held := sockets[f[9]]
			if !held || f[3] == "0A" || f[3] == "07" {
				continue
			}
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			return fmt.Errorf("%w: a process of the sandbox (%s) has a TCP connection open, which a pause, a fork or "+
				"a snapshot cannot keep (CRIU restores no established connection): close it first",
				sandbox.ErrCannotKeep, strings.TrimSpace(string(comm)))
		}
	}
	return nil
}

// gone reports whether err says a process, or a descriptor, is no more.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH)
}

// sharedAnonymous reports whether a mapping is shared anonymous memory
// (mmap MAP_SHARED|MAP_ANONYMOUS): the kernel names it "/dev/zero
// (deleted)", a regular file of its internal shmem mount, never the
// /dev/zero character device. CRIU saves it with the process.
func sharedAnonymous(link string, st *unix.Stat_t) bool {
	return link == "/dev/zero (deleted)" && st.Mode&unix.S_IFMT == unix.S_IFREG
}

// sandboxMemory reports whether a descriptor's or mapping's link names
// memory of the sandbox's own rather than a file: a memfd, or a SysV
// shared memory segment of its IPC namespace.
func sandboxMemory(link string) bool {
	return strings.HasPrefix(link, "/memfd:") || strings.HasPrefix(link, "/SYSV")
}

// isHostNode reports whether st, a file a process holds at path, is the
// host's node of that name among the sandbox's /dev nodes: a character
// device of the same numbers.
func isHostNode(path string, st *unix.Stat_t) bool {
	if !devNodes[path] || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return false
	}
	var host unix.Stat_t
	return unix.Stat(path, &host) == nil && host.Mode&unix.S_IFMT == unix.S_IFCHR && host.Rdev == st.Rdev
}

type fdinfo struct {
	flags int
	mntID string
}

func readFdinfo(pid, fd int) (fdinfo, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
	if err != nil {
		return fdinfo{}, err
	}
	var fi fdinfo
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "flags":
			n, _ := strconv.ParseInt(v, 8, 64)
			fi.flags = int(n)
		case "mnt_id":
			fi.mntID = v
		}
	}
	return fi, nil
}

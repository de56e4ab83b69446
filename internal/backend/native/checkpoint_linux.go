package native

// A prototype of checkpoint and restore (issue 15, docs/snapshots.md):
// CRIU saves a classic sandbox's process tree (init, its runner and
// everything they started, with their namespaces) to an images directory
// and brings it back. What the tree holds of the host is external to it,
// and CRIU must be told about each:
//
//   - mounts whose source is not visible in the sandbox: the /dev nodes
//     bound from a host directory that is gone once they are bound, and
//     the masks over /proc, bound from a tmpfs that init unmounts once
//     bound (procmask_linux.go). Dumped as external mounts; restored
//     from the host's own /dev nodes and from copies of the masks made
//     at dump time in the images directory.
//   - files that init holds of the host: its own executable (init is the
//     vivarium binary re-executed) and the cgroup files that the Go
//     runtime keeps open to follow its CPU limit. Dumped as external
//     files; restored from the same host files, opened by the supervisor.
//   - pipes and the control socket to the supervisor: their other end is
//     the host's. Restored onto new pipes and a new socket pair whose
//     other ends the supervisor holds.
//
// Only the sandbox's own tree is ever dumped: the pid is the sandbox's
// init, whose pidfd or child handle the supervisor holds. Images hold the
// sandbox's memory: the directory is the supervisor's, mode 0700.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
)

// checkpoint is a dumped sandbox: its images and what its tree held of
// the host.
type checkpoint struct {
	dir    string
	mounts []extMount
	files  []extFile
	pipes  []extPipe
	socks  []extSock
	// Took is how long criu dump ran.
	took time.Duration
}

// extMount is a mount CRIU restores from a host path.
type extMount struct {
	key, mountpoint, source string
}

// extFile is a host file that init held, restored by opening it again.
type extFile struct {
	key, path string
}

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
// (devices_linux.go); a restore binds the host's own.
var devNodes = map[string]bool{"/dev/null": true, "/dev/zero": true, "/dev/full": true, "/dev/random": true, "/dev/urandom": true}

// dump saves the sandbox's process tree to dir (created, mode 0700, must
// not exist) with CRIU at bin and ends the tree: its processes are
// stopped and their memory freed. Only classic sandboxes: a zygote's
// sandboxes share the zygote's memory and are not supported yet.
func (s *Sandbox) dump(ctx context.Context, bin, dir string) (*checkpoint, error) {
	if s.z != nil {
		return nil, errors.New("checkpoint: sandboxes forked from a zygote are not supported yet")
	}
	if s.init == nil || isClosed(s.initDone) {
		return nil, errors.New("checkpoint: the sandbox is not running")
	}
	pid := s.init.pid
	// The control socket was made in the supervisor's network namespace,
	// where CRIU does not look for it: init takes one made in its own.
	hostEnd, err := s.rebindControl()
	if err != nil {
		return nil, err
	}
	defer hostEnd.Close()
	cp, err := prepareDump(pid, dir)
	if err != nil {
		return nil, err
	}
	// CRIU dumps a tmpfs's files from a helper mount namespace that it
	// makes in the sandbox's user namespace, whose max_mnt_namespaces is
	// 0 (budgets_linux.go): a few for the dump, 0 again after it (a dump
	// that fails leaves the sandbox running). Seccomp refuses the
	// sandbox's own processes a new namespace all the same.
	if err := userNSSysctls(pid, []sysctl{{"user/max_mnt_namespaces", strconv.Itoa(dumpMntNamespaces)}}); err != nil {
		return nil, err
	}
	defer userNSSysctls(pid, []sysctl{{"user/max_mnt_namespaces", "0"}})
	args := []string{"dump", "--tree", strconv.Itoa(pid), "--images-dir", dir, "--log-file", "dump.log", "-v4",
		"--ext-unix-sk", "--shell-job"}
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
	start := time.Now()
	if err := criu.Run(ctx, bin, args, nil, dir, "dump.log"); err != nil {
		return nil, err
	}
	cp.took = time.Since(start)
	return cp, nil
}

// prepareDump makes the images directory dir (mode 0700, must not
// exist) and finds what the tree of init (pid) holds of the host.
func prepareDump(pid int, dir string) (*checkpoint, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(filepath.Join(dir, "ext"), 0o700); err != nil {
		return nil, err
	}
	cp := &checkpoint{dir: dir}
	mnts, err := readMountinfo(pid)
	if err != nil {
		return nil, err
	}
	if err := cp.collectMounts(pid, mnts); err != nil {
		return nil, err
	}
	tree, err := processTree(pid)
	if err != nil {
		return nil, err
	}
	if err := cp.collectFiles(pid, tree, mnts); err != nil {
		return nil, err
	}
	return cp, nil
}

// rebindControl gives init a new control socket, made in the sandbox's
// network namespace (opRebind), and returns the supervisor's end. It
// returns once init holds the new socket as its control socket. Messages
// init sends after that go to the new socket, which the Sandbox does not
// read: for the prototype, the dump follows at once.
func (s *Sandbox) rebindControl() (*os.File, error) {
	type result struct {
		pair [2]int
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer home.Close()
		var r result
		if r.err = unix.Setns(int(s.netns.f.Fd()), unix.CLONE_NEWNET); r.err == nil {
			r.pair, r.err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		}
		if serr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); serr != nil {
			if r.err == nil {
				unix.Close(r.pair[0])
				unix.Close(r.pair[1])
			}
			ch <- result{err: fmt.Errorf("return to the supervisor's network namespace: %w", serr)}
			select {} // never run anything else on this thread
		}
		runtime.UnlockOSThread()
		ch <- r
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("checkpoint: a control socket in the sandbox: %w", r.err)
	}
	host := os.NewFile(uintptr(r.pair[0]), "control")
	var st unix.Stat_t
	err := unix.Fstat(r.pair[1], &st)
	if err == nil {
		s.sendMu.Lock()
		err = sendCtl(s.ctl, ctlMsg{Op: opRebind}, r.pair[1])
		s.sendMu.Unlock()
	}
	unix.Close(r.pair[1])
	if err != nil {
		host.Close()
		return nil, fmt.Errorf("checkpoint: rebind init's control socket: %w", err)
	}
	want := fmt.Sprintf("socket:[%d]", st.Ino)
	for delay, waited := 100*time.Microsecond, time.Duration(0); ; delay = min(2*delay, 10*time.Millisecond) {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", s.init.pid, fdControl)); l == want {
			return host, nil
		}
		if waited > 5*time.Second {
			host.Close()
			return nil, errors.New("checkpoint: init did not take its new control socket")
		}
		time.Sleep(delay)
		waited += delay
	}
}

// dumpMntNamespaces is how many mount namespaces CRIU may make in the
// sandbox's user namespace while it dumps: one at a time, per tmpfs.
const dumpMntNamespaces = 4

// userNSSysctls writes values (paths under /proc/sys/user) in the user
// namespace of pid: the per-user-namespace budgets, which only a process
// with CAP_SYS_RESOURCE in that namespace can set. A Go process cannot
// enter a user namespace (it has threads), and a program that nsenter
// starts loses its capabilities at exec (host root is not root of the
// sandbox's namespace), so a single-threaded python3 does it itself:
// setns, then writes, without an exec in between. It keeps its host
// credentials and makes itself undumpable first, so that no process of
// the sandbox may trace it (nor can one see it: it is in the host's PID
// namespace).
func userNSSysctls(pid int, values []sysctl) error {
	var args []string
	for _, v := range values {
		if !strings.HasPrefix(v.Path, "user/") || strings.Contains(v.Path, "..") {
			return fmt.Errorf("checkpoint: %s is not a user namespace sysctl", v.Path)
		}
		if _, err := strconv.ParseInt(v.Value, 10, 64); err != nil {
			return fmt.Errorf("checkpoint: sysctl %s: %q is not a number", v.Path, v.Value)
		}
		args = append(args, v.Path, v.Value)
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return fmt.Errorf("checkpoint: the sandbox's user namespace: %w", err)
	}
	defer ns.Close()
	cmd := exec.Command("/usr/bin/python3", append([]string{"-I", "-S", "-c", userNSSysctlScript}, args...)...)
	cmd.ExtraFiles = []*os.File{ns} // fd 3
	cmd.Env = []string{}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("checkpoint: set %v in the sandbox's user namespace: %w: %s", values, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// userNSSysctlScript: argv is path, value, path, value ...; fd 3 is the
// user namespace.
const userNSSysctlScript = `
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE, CLONE_NEWUSER = 4, 0x10000000
if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.setns(3, CLONE_NEWUSER) != 0:
    sys.exit("setns: errno %d" % ctypes.get_errno())
a = sys.argv[1:]
for path, value in zip(a[::2], a[1::2]):
    with open("/proc/sys/" + path, "w") as f:
        f.write(value)
`

// mountEntry is one line of /proc/PID/mountinfo.
type mountEntry struct {
	id, dev, root, point string
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
		out = append(out, mountEntry{id: fl[0], dev: fl[2], root: unescapeMount(fl[3]), point: unescapeMount(fl[4])})
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
// copied into dir/ext.
func (cp *checkpoint) collectMounts(pid int, mnts []mountEntry) error {
	rooted := map[string]bool{}
	for _, m := range mnts {
		if m.root == "/" {
			rooted[m.dev] = true
		}
	}
	root, err := os.Open(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		return err
	}
	defer root.Close()
	for _, m := range mnts {
		if rooted[m.dev] {
			continue
		}
		key := "m" + m.id
		switch {
		case devNodes[m.point]:
			cp.mounts = append(cp.mounts, extMount{key: key, mountpoint: m.point, source: m.point})
		case strings.HasPrefix(m.point, "/proc/"):
			src := filepath.Join(cp.dir, "ext", key)
			if err := copyMask(int(root.Fd()), m.point, src); err != nil {
				return fmt.Errorf("checkpoint: copy the mask over %s: %w", m.point, err)
			}
			cp.mounts = append(cp.mounts, extMount{key: key, mountpoint: m.point, source: src})
		default:
			return fmt.Errorf("checkpoint: the mount at %s (root %s) has no source CRIU can reach", m.point, m.root)
		}
	}
	return nil
}

// copyMask copies what the sandbox sees at point (a mask: an empty
// directory or a small file) to dst. The path is resolved inside the
// sandbox's root without following symbolic links, and only a directory
// or a regular file of at most maxMaskFile bytes is taken.
func copyMask(rootFD int, point, dst string) error {
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
	return os.WriteFile(dst, b, 0o444)
}

// processTree lists pid and its descendants.
func processTree(pid int) ([]int, error) {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", out[i]))
		if err != nil {
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

// collectFiles finds what the tree holds of the host: pipes with one end
// outside, init's control socket, and files of init on mounts the
// sandbox does not have (its executable, the Go runtime's cgroup files).
// A process other than init holding a file of a host mount is refused:
// only init is trusted to, and reopening what a sandboxed process names
// would open host files on its say.
func (cp *checkpoint) collectFiles(initPID int, tree []int, mnts []mountEntry) error {
	inNS := map[string]bool{}
	for _, m := range mnts {
		inNS[m.id] = true
	}
	type pipeEnds struct {
		readers, writers int
		first            extPipe
	}
	pipes := map[uint64]*pipeEnds{}
	var order []uint64
	seenFile := map[string]bool{}
	addFile := func(pid int, mntID string, ino uint64, path string) error {
		if inNS[mntID] {
			return nil
		}
		if pid != initPID {
			return fmt.Errorf("checkpoint: process %d of the sandbox holds %s, a file outside it", pid, path)
		}
		id, _ := strconv.Atoi(mntID)
		key := fmt.Sprintf("file[%x:%x]", id, ino)
		if !seenFile[key] {
			seenFile[key] = true
			cp.files = append(cp.files, extFile{key: key, path: path})
		}
		return nil
	}
	for _, pid := range tree {
		fdDir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(fdDir)
		if err != nil {
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
				}
				if info.flags&unix.O_ACCMODE == unix.O_WRONLY {
					p.writers++
				} else {
					p.readers++
				}
			case strings.HasPrefix(link, "socket:[") && pid == initPID && fd == fdControl:
				ino, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]"), 10, 64)
				cp.socks = append(cp.socks, extSock{ino: ino, fd: fd})
			case strings.HasPrefix(link, "/"):
				var st unix.Stat_t
				if err := unix.Stat(filepath.Join(fdDir, e.Name()), &st); err != nil {
					return err
				}
				if err := addFile(pid, info.mntID, st.Ino, link); err != nil {
					return err
				}
			}
		}
		// The executable and other mapped files.
		maps, err := os.ReadDir(fmt.Sprintf("/proc/%d/map_files", pid))
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, e := range maps {
			p := fmt.Sprintf("/proc/%d/map_files/%s", pid, e.Name())
			link, err := os.Readlink(p)
			if err != nil || seen[link] || !strings.HasPrefix(link, "/") {
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
			if err := addFile(pid, info.mntID, st.Ino, link); err != nil {
				return err
			}
		}
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

// restoredTree is a sandbox's tree brought back by restore, with the
// supervisor's ends of its pipes and of its control socket.
type restoredTree struct {
	pid   int // init's, on the host: a child of the supervisor
	proc  *os.Process
	pipes map[uint64]*os.File // by the dumped pipe's inode
	ctl   *os.File
	took  time.Duration
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
	pidfile := filepath.Join(cp.dir, "restored.pid")
	os.Remove(pidfile)
	args := []string{"restore", "--images-dir", cp.dir, "--log-file", "restore.log", "-v4",
		"--restore-detached", "--restore-sibling", "--shell-job", "--pidfile", pidfile}
	for _, m := range cp.mounts {
		args = append(args, "--external", "mnt["+m.key+"]:"+m.source)
	}
	inherit := func(f *os.File, id string) {
		args = append(args, "--inherit-fd", fmt.Sprintf("fd[%d]:%s", 3+len(give), id))
		give = append(give, f)
	}
	for _, f := range cp.files {
		h, err := os.OpenFile(f.path, os.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("restore: reopen %s: %w", f.path, err)
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
	if err := criu.Run(ctx, bin, args, give, cp.dir, "restore.log"); err != nil {
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

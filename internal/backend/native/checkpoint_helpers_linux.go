package native

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// rebindControl gives init a new control socket, made in the sandbox's
// network namespace (opRebind), where CRIU finds it. The Sandbox sends
// and reads on the new socket from then on (the old one's reader ends
// quietly once init let it go), whether the dump that follows succeeds
// or not. It returns once init holds the new socket as its control
// socket.
func (s *Sandbox) rebindControl() error {
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
		return fmt.Errorf("checkpoint: a control socket in the sandbox: %w", r.err)
	}
	var st unix.Stat_t
	err := unix.Fstat(r.pair[1], &st)
	if err == nil {
		// Under sendMu: the old socket's reader, which sees its end once
		// init has swapped, finds it replaced; nothing is sent between.
		s.sendMu.Lock()
		if err = sendCtl(s.ctl, ctlMsg{Op: opRebind}, r.pair[1]); err == nil {
			s.ctl = r.pair[0]
			s.ctlDone = make(chan struct{})
			go s.readControl(s.ctl, s.ctlDone)
		}
		s.sendMu.Unlock()
	}
	unix.Close(r.pair[1])
	if err != nil {
		unix.Close(r.pair[0])
		return fmt.Errorf("checkpoint: rebind init's control socket: %w", err)
	}
	want := fmt.Sprintf("socket:[%d]", st.Ino)
	for delay, waited := 100*time.Microsecond, time.Duration(0); ; delay = min(2*delay, 10*time.Millisecond) {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", s.init.pid, fdControl)); l == want {
			return nil
		}
		if waited > 5*time.Second {
			return errors.New("checkpoint: init did not take its new control socket")
		}
		time.Sleep(delay)
		waited += delay
	}
}

// dumpMntNamespaces is how many mount namespaces CRIU may make in the
// sandbox's user namespace while it dumps: one at a time, per tmpfs.
const dumpMntNamespaces = 4

// userNSSysctls writes values (paths under /proc/sys/user) in the user
// namespace ns: the per-user-namespace budgets, which only a process
// with CAP_SYS_RESOURCE in that namespace can set. A Go process cannot
// enter a user namespace (it has threads), and a program that nsenter
// starts loses its capabilities at exec (host root is not root of the
// sandbox's namespace), so a single-threaded python3 does it itself:
// setns, then writes, without an exec in between. It keeps its host
// credentials and makes itself undumpable first, so that no process of
// the sandbox may trace it (nor can one see it: it is in the host's PID
// namespace).
func userNSSysctls(ns *os.File, values []sysctl) error {
	args, err := userSysctlArgs(values)
	if err != nil {
		return err
	}
	cmd := exec.Command("/usr/bin/python3", append([]string{"-I", "-S", "-c", userNSSysctlScript}, args...)...)
	cmd.ExtraFiles = []*os.File{ns} // fd 3
	cmd.Env = []string{}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("checkpoint: set %v in the sandbox's user namespace: %w: %s", values, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// userSysctlArgs checks values (user namespace sysctls, numbers) and
// returns them as userNSSysctlScript's arguments.
func userSysctlArgs(values []sysctl) ([]string, error) {
	var args []string
	for _, v := range values {
		name, ok := strings.CutPrefix(v.Path, "user/")
		if !ok || name == "" || strings.ContainsAny(name, "/.") {
			return nil, fmt.Errorf("checkpoint: %s is not a user namespace sysctl", v.Path)
		}
		if _, err := strconv.ParseInt(v.Value, 10, 64); err != nil {
			return nil, fmt.Errorf("checkpoint: sysctl %s: %q is not a number", v.Path, v.Value)
		}
		args = append(args, v.Path, v.Value)
	}
	return args, nil
}

// actionScript writes, in dir, an action script for criu restore, and
// returns its path. Once CRIU has made the namespaces
// (post-setup-namespaces), it sets values in the restored user namespace;
// once the tree is restored and before it runs (pre-resume), it remounts
// each of mounts with the flags it had (CRIU restores binds of one source
// as binds of the first, without their own flags: most /proc masks came
// back read-write, without nosuid, nodev or noexec). Flags are only
// added: ro, nosuid, nodev, noexec.
func actionScript(dir string, values []sysctl, mounts []extMount) (string, error) {
	args, err := userSysctlArgs(values)
	if err != nil {
		return "", err
	}
	budgets := filepath.Join(dir, "budgets.py")
	if err := os.WriteFile(budgets, []byte(restoredNSScript), 0o600); err != nil {
		return "", err
	}
	remount := filepath.Join(dir, "remount.py")
	if err := os.WriteFile(remount, []byte(remountScript), 0o600); err != nil {
		return "", err
	}
	// Every argument is a checked sysctl name or number, a mount point
	// read from the sandbox's mountinfo at dump time, or a path of the
	// supervisor's; each is quoted.
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	script := "#!/bin/sh\n" +
		"# Vivarium: what CRIU does not restore of a sandbox.\n" +
		"case \"$CRTOOLS_SCRIPT_ACTION\" in\n" +
		"post-setup-namespaces)\n\texec /usr/bin/python3 -I -S " + quote(budgets)
	for _, a := range args {
		script += " " + quote(a)
	}
	script += " 3</proc/\"$CRTOOLS_INIT_PID\"/ns/user 4</proc/\"$CRTOOLS_INIT_PID\"/ns/net ;;\n" +
		"pre-resume)\n\texec /usr/bin/python3 -I -S " + quote(remount)
	for _, m := range mounts {
		script += " " + quote(m.mountpoint) + " " + quote(m.flags)
	}
	script += " 3</proc/\"$CRTOOLS_INIT_PID\"/ns/mnt ;;\nesac\n"
	p := filepath.Join(dir, "actions.sh")
	if err := os.WriteFile(p, []byte(script), 0o700); err != nil {
		return "", err
	}
	return p, nil
}

// remountScript: argv is mount point, flags (mountinfo's per-mount
// options), ...; fd 3 is the restored mount namespace, whose processes
// have not run yet.
const remountScript = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 0x20000, 1, 2, 4, 8, 32, 4096
known = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
if libc.prctl(4, 0, 0, 0, 0) != 0 or libc.setns(3, CLONE_NEWNS) != 0:
    sys.exit("setns: " + os.strerror(ctypes.get_errno()))
a = sys.argv[1:]
for point, opts in zip(a[::2], a[1::2]):
    flags = 0
    for o in opts.split(","):
        flags |= known.get(o, 0)
    if flags and libc.mount(None, point.encode(), None, MS_BIND | MS_REMOUNT | flags, None) != 0:
        sys.exit("remount %s %s: %s" % (point, opts, os.strerror(ctypes.get_errno())))
`

// restoredNSScript: as userNSSysctlScript, and first brings the loopback
// of the network namespace at fd 4 up: the namespace is made empty
// (criu --empty-ns net), as a sandbox's was before init brought its
// loopback up (a loopback and nothing else), before any socket of the
// sandbox is restored in it.
const restoredNSScript = `
import ctypes, fcntl, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE, CLONE_NEWUSER, CLONE_NEWNET = 4, 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1
if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 or libc.setns(4, CLONE_NEWNET) != 0:
    sys.exit("setns net: errno %d" % ctypes.get_errno())
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh", b"lo", 0)))[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))
if libc.setns(3, CLONE_NEWUSER) != 0:
    sys.exit("setns user: errno %d" % ctypes.get_errno())
a = sys.argv[1:]
for path, value in zip(a[::2], a[1::2]):
    with open("/proc/sys/" + path, "w") as f:
        f.write(value)
`

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

// mountRootOf mounts the root of the mount namespace ns (the sandbox's
// root tmpfs, alone, without what is mounted on it) at target, on the
// host. Entering a mount namespace takes a process without threads: a
// python3 helper clones the mount there (open_tree), comes back, and
// mounts the clone (move_mount). The namespace has no process left in it
// by then: the sandbox's tree is dumped and gone.
func mountRootOf(ns *os.File, target string) error {
	home, err := os.Open("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	defer home.Close()
	cmd := exec.Command("/usr/bin/python3", "-I", "-S", "-c", mountRootScript, target)
	cmd.ExtraFiles = []*os.File{ns, home} // fds 3 and 4
	cmd.Env = []string{}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("restore: mount the sandbox's root: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// mountRootScript: fd 3 is the sandbox's mount namespace, fd 4 the
// supervisor's, argv[1] the target. x86_64 and arm64 share the syscall
// numbers of open_tree (428) and move_mount (429).
const mountRootScript = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, OPEN_TREE_CLONE, O_CLOEXEC, MOVE_MOUNT_F_EMPTY_PATH = 0x20000, 1, 0o2000000, 4
AT_FDCWD = -100
def fail(what):
    sys.exit("%s: %s" % (what, os.strerror(ctypes.get_errno())))
if libc.prctl(4, 0, 0, 0, 0) != 0:
    fail("prctl")
if libc.setns(3, CLONE_NEWNS) != 0:
    fail("setns into the sandbox")
t = libc.syscall(428, AT_FDCWD, b"/", OPEN_TREE_CLONE | O_CLOEXEC)
if t < 0:
    fail("open_tree")
if libc.setns(4, CLONE_NEWNS) != 0:
    fail("setns back")
if libc.syscall(429, t, b"", AT_FDCWD, sys.argv[1].encode(), MOVE_MOUNT_F_EMPTY_PATH) != 0:
    fail("move_mount")
`

package native

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
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
// enter a user namespace (it has threads): nsenter (util-linux) enters
// it, becomes root there (uid 0 of the sandbox's namespace, which maps
// it), and runs a shell that writes them. The shell is in the host's PID
// namespace, where no process of the sandbox can see it, and only runs
// setSysctlsScript.
func userNSSysctls(ns *os.File, values []sysctl) error {
	args, err := userSysctlArgs(values)
	if err != nil {
		return err
	}
	bin, err := nsenter()
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, append([]string{"--user=/proc/self/fd/3", "--", "/bin/sh", "-c", setSysctlsScript, "sh"}, args...)...)
	cmd.ExtraFiles = []*os.File{ns} // fd 3
	cmd.Env = []string{}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("checkpoint: set %v in the sandbox's user namespace: %w: %s", values, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setSysctlsScript: its arguments are path, value, path, value ...
// (userSysctlArgs checked them).
const setSysctlsScript = `while [ $# -gt 1 ]; do printf '%s' "$2" > "/proc/sys/$1" || exit 1; shift 2; done`

// Nsenter returns the path of util-linux's nsenter, which pausing a
// sandbox needs, or an error that says it is missing.
func Nsenter() (string, error) { return nsenter() }

// nsenter is util-linux's nsenter, found once.
var nsenter = sync.OnceValues(func() (string, error) {
	for _, p := range []string{"/usr/bin/nsenter", "/bin/nsenter", "/usr/sbin/nsenter"} {
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("checkpoint: nsenter (util-linux) is not installed: pausing a sandbox needs it to set the budgets of its user namespace")
})

// inNamespace runs fn on the namespace worker, a thread that has entered
// the namespace ns of the given kind (unix.CLONE_NEWNS or CLONE_NEWNET)
// for fn and leaves it after. Entering a mount namespace takes a thread
// whose root and working directory are its own (unshare CLONE_FS), which
// a thread of a Go program can have, unlike a user namespace, which takes
// a process without threads.
//
// The worker is one thread, locked to its goroutine for good, that never
// ends: a thread that ends sends its children their parent-death signal,
// and a restored tree's init is a child of the thread that started CRIU
// (--restore-sibling), with the SIGKILL its supervisor set restored. A
// thread locked for one job and let go would be such a thread now and
// then, and kill a sandbox that was just restored.
func inNamespace(ns *os.File, kind int, fn func() error) error {
	nsWorkerOnce.Do(func() { go nsWorker() })
	j := nsJob{ns: ns, kind: kind, fn: fn, done: make(chan error, 1)}
	nsJobs <- j
	return <-j.done
}

type nsJob struct {
	ns   *os.File
	kind int
	fn   func() error
	done chan error
}

var (
	nsJobs       = make(chan nsJob)
	nsWorkerOnce sync.Once
)

// nsWorker takes inNamespace's jobs, one at a time, on its own thread.
func nsWorker() {
	runtime.LockOSThread() // for good: see inNamespace
	var home map[int]*os.File
	err := unix.Unshare(unix.CLONE_FS)
	if err == nil {
		home = map[int]*os.File{}
		for kind, name := range map[int]string{unix.CLONE_NEWNS: "mnt", unix.CLONE_NEWNET: "net"} {
			if home[kind], err = os.Open("/proc/thread-self/ns/" + name); err != nil {
				break
			}
		}
	}
	if err != nil {
		err = fmt.Errorf("the namespace worker: %w", err)
		for j := range nsJobs {
			j.done <- err
		}
	}
	for j := range nsJobs {
		back, ok := home[j.kind]
		if !ok {
			j.done <- fmt.Errorf("the namespace worker: namespace kind %#x", j.kind)
			continue
		}
		if err := unix.Setns(int(j.ns.Fd()), j.kind); err != nil {
			j.done <- fmt.Errorf("setns: %w", err)
			continue
		}
		err := j.fn()
		if berr := unix.Setns(int(back.Fd()), j.kind); berr != nil {
			// Left in a sandbox's namespace: this thread takes no
			// other job, and is kept (it must not end).
			j.done <- errors.Join(err, fmt.Errorf("the namespace worker could not return to the supervisor's namespace: %w", berr))
			go nsWorker()
			select {}
		}
		j.done <- err
	}
}

// userSysctlArgs checks values (user namespace sysctls, numbers) and
// returns them as setSysctlsScript's arguments.
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

// restoreHooks does, while CRIU restores a tree, what CRIU does not
// restore of a sandbox. CRIU runs an action script at each step; the
// script (hooks.script) passes two of them to this process through FIFOs
// in the checkpoint's directory, and waits for the answer:
//
//   - post-setup-namespaces, once CRIU has made the namespaces and before
//     any socket is restored in them: bring the loopback of the restored
//     network namespace up (it is made empty, criu --empty-ns net, as a
//     sandbox's was before init brought its loopback up), and set the
//     user namespace's budgets (userNSSysctls);
//   - setup-namespaces, only where the tree mounts volumes: once CRIU
//     has made the user namespace and before it mounts anything, mount
//     the volumes idmapped by that namespace for CRIU to bind
//     (restoreVolumes.attach);
//   - pre-resume, once the tree is restored and before it runs: remount
//     each of mounts with the flags it had (CRIU restores binds of one
//     source as binds of the first, without their own flags: most /proc
//     masks came back read-write, without nosuid, nodev or noexec). Flags
//     are only added: ro, nosuid, nodev, noexec.
//
// Both are done here, on threads that enter the restored namespaces
// (inNamespace), rather than by a helper program that CRIU would start
// at each step: a python3 helper cost a resume some 30 ms.
type restoreHooks struct {
	dir      string
	req, ans *os.File // the FIFOs, held open read-write: the script never waits for this side to open them
	sysctls  []sysctl
	mounts   []extMount
	volumes  *restoreVolumes // nil: none
	done     chan struct{}
	err      error // the first hook that failed, once done is closed
}

// hookActions are the steps of a restore at which the action script may
// have something to do (actions says at which it has).
var hookActions = []string{"setup-namespaces", "post-setup-namespaces", "pre-resume"}

// actions are the steps of this restore at which the action script has
// something to do: CRIU runs it at no other.
func (h *restoreHooks) actions() []string {
	if h.volumes == nil {
		return hookActions[1:]
	}
	return hookActions
}

// startRestoreHooks makes the FIFOs and the action script in a directory
// of their own under dir (the copies of a fork are restored at once from
// one checkpoint directory) and starts serving them. Callers close the
// hooks once CRIU has returned.
func startRestoreHooks(dir string, sysctls []sysctl, mounts []extMount) (*restoreHooks, error) {
	if _, err := userSysctlArgs(sysctls); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(dir, "hooks-")
	if err != nil {
		return nil, err
	}
	h := &restoreHooks{dir: dir, sysctls: sysctls, mounts: mounts, done: make(chan struct{})}
	for _, f := range []struct {
		name string
		to   **os.File
	}{{"hook.req", &h.req}, {"hook.ans", &h.ans}} {
		p := filepath.Join(dir, f.name)
		os.Remove(p)
		if err = unix.Mkfifo(p, 0o600); err != nil {
			break
		}
		if *f.to, err = os.OpenFile(p, os.O_RDWR, 0); err != nil {
			break
		}
	}
	if err != nil {
		h.closeFiles()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("restore: the action script's FIFOs: %w", err)
	}
	go h.serve()
	return h, nil
}

// script writes the action script and returns its path. Its FIFOs'
// paths are the supervisor's own; the action names are CRIU's.
func (h *restoreHooks) script() (string, error) {
	quote := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	script := "#!/bin/sh\n" +
		"# Vivarium: what CRIU does not restore of a sandbox is done by its supervisor (restoreHooks).\n" +
		"case \"$CRTOOLS_SCRIPT_ACTION\" in\n" +
		strings.Join(hookActions, "|") + ")\n" +
		"\texec 3>" + quote(h.req.Name()) + " 4<" + quote(h.ans.Name()) + " || exit 1\n" +
		"\techo \"$CRTOOLS_SCRIPT_ACTION $CRTOOLS_INIT_PID\" >&3\n" +
		"\tread -r answer <&4 || exit 1\n" +
		"\t[ \"$answer\" = ok ] || { echo \"$answer\" >&2; exit 1; } ;;\n" +
		"esac\n"
	p := filepath.Join(h.dir, "actions.sh")
	if err := os.WriteFile(p, []byte(script), 0o700); err != nil {
		return "", err
	}
	return p, nil
}

// serve answers the script's requests, one line each ("ACTION PID"),
// until the FIFOs are closed.
func (h *restoreHooks) serve() {
	defer close(h.done)
	rd := bufio.NewReader(h.req)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return
		}
		herr := h.run(strings.TrimSpace(line))
		answer := "ok"
		if herr != nil {
			if h.err == nil {
				h.err = herr
			}
			answer = "vivarium: " + strings.ReplaceAll(herr.Error(), "\n", " ")
		}
		if _, err := io.WriteString(h.ans, answer+"\n"); err != nil {
			return
		}
	}
}

// run does one hook. pid is the restored tree's root, CRIU's child: its
// processes do not run until pre-resume has been answered.
func (h *restoreHooks) run(line string) error {
	action, p, _ := strings.Cut(line, " ")
	pid, err := strconv.Atoi(p)
	if err != nil || pid <= 0 {
		return fmt.Errorf("restore hook: bad request %q", line)
	}
	ns := func(kind string) (*os.File, error) {
		return os.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, kind))
	}
	switch action {
	case "setup-namespaces":
		if h.volumes == nil {
			return nil
		}
		return h.volumes.attach(pid)
	case "post-setup-namespaces":
		net, err := ns("net")
		if err != nil {
			return err
		}
		defer net.Close()
		if err := inNamespace(net, unix.CLONE_NEWNET, loopbackUp); err != nil {
			return fmt.Errorf("restore: the restored network namespace: %w", err)
		}
		if len(h.sysctls) == 0 {
			return nil
		}
		user, err := ns("user")
		if err != nil {
			return err
		}
		defer user.Close()
		return userNSSysctls(user, h.sysctls)
	case "pre-resume":
		mnt, err := ns("mnt")
		if err != nil {
			return err
		}
		defer mnt.Close()
		return inNamespace(mnt, unix.CLONE_NEWNS, func() error {
			for _, m := range h.mounts {
				if err := remountFlags(m.mountpoint, m.flags); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return fmt.Errorf("restore hook: unknown action %q", action)
}

// remountFlags adds to the bind mount at point the flags among ro,
// nosuid, nodev and noexec that opts (mountinfo's per-mount options)
// name.
func remountFlags(point, opts string) error {
	known := map[string]uintptr{"ro": unix.MS_RDONLY, "nosuid": unix.MS_NOSUID, "nodev": unix.MS_NODEV, "noexec": unix.MS_NOEXEC}
	var flags uintptr
	for _, o := range strings.Split(opts, ",") {
		flags |= known[o]
	}
	if flags == 0 {
		return nil
	}
	if err := remount(point, flags); err != nil {
		return fmt.Errorf("restore: remount %s %s: %w", point, opts, err)
	}
	return nil
}

// close stops serving, once CRIU has returned, and says which hook
// failed, if one did.
func (h *restoreHooks) close() error {
	h.closeFiles()
	<-h.done
	os.RemoveAll(h.dir)
	return h.err
}

func (h *restoreHooks) closeFiles() {
	for _, f := range []*os.File{h.req, h.ans} {
		if f != nil {
			f.Close()
		}
	}
}

// mountRootOf mounts the root of the mount namespace ns (the sandbox's
// root tmpfs, alone, without what is mounted on it) at target, on the
// host: a thread that entered ns clones the mount (open_tree), and the
// clone is mounted from the supervisor's namespace (move_mount).
func mountRootOf(ns *os.File, target string) error {
	tree := -1
	err := inNamespace(ns, unix.CLONE_NEWNS, func() (err error) {
		tree, err = unix.OpenTree(unix.AT_FDCWD, "/", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		return err
	})
	if err != nil {
		return fmt.Errorf("restore: clone the sandbox's root: %w", err)
	}
	defer unix.Close(tree)
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("restore: mount the sandbox's root at %s: %w", target, err)
	}
	return nil
}

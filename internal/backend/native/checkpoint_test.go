package native

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"golang.org/x/sys/unix"
)

// requireCRIU returns a criu binary that passes `criu check`, or skips.
func requireCRIU(t testing.TB) string {
	t.Helper()
	testutil.RequireRoot(t)
	bin, err := criu.Find()
	if err != nil {
		t.Skipf("checkpoint/restore cannot be tested here: %v", err)
	}
	if _, err := criu.Check(context.Background(), bin); err != nil {
		t.Skipf("checkpoint/restore cannot be tested here: %v", err)
	}
	return bin
}

// checkpointSandbox starts a classic persistent sandbox holding x = 41,
// on a backend of the test's own, closed when the test ends.
func checkpointSandbox(t *testing.T) *Sandbox {
	t.Helper()
	testutil.RequirePython(t)
	if testutil.ZygoteMode() {
		t.Skip("checkpoint is of classic sandboxes only, tested in the classic run")
	}
	b, err := New(Config{CgroupParent: "vivarium-native-criu-test", UIDBase: DefaultUIDBase + 27<<24, UIDRanges: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	sbx, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	s := sbx.(*Sandbox)
	t.Cleanup(func() { s.Close() })
	// Python state, a file in the workspace, an open file and a child
	// process.
	code := "x = 41\nopen('kept.txt', 'w').write('kept')\nf = open('open.txt', 'w+')\nf.write('abc')\n" +
		"import subprocess\nchild = subprocess.Popen(['sleep', '600'])"
	if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: code}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%s: %+v %v", code, res, err)
	}
	return s
}

// TestCheckpointExternals checks what a dump tells CRIU about a real
// sandbox's ties to the host: the /proc masks copied as the sandbox sees
// them, the /dev nodes mapped to the host's, init's executable as an
// external file, the runner's request and event pipes and init's control
// socket as external ends.
func TestCheckpointExternals(t *testing.T) {
	testutil.RequireRoot(t)
	s := checkpointSandbox(t)
	ctx := context.Background()
	res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "print(open('/proc/sys/kernel/random/boot_id').read().strip())"}, nil)
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%+v %v", res, err)
	}
	bootID := strings.TrimSpace(res.Stdout)
	dir := filepath.Join(t.TempDir(), "images")
	cp, err := prepareDump(s.init.pid, 0, dir, "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "ext")} {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v", d, st.Mode(), err)
		}
	}
	mounts := map[string]extMount{}
	for _, m := range cp.mounts {
		mounts[m.mountpoint] = m
	}
	for node := range devNodes {
		if m, ok := mounts[node]; !ok || m.source != node {
			t.Errorf("%s: %+v", node, m)
		}
	}
	if m, ok := mounts["/proc/sys/kernel/random/boot_id"]; !ok {
		t.Error("the boot_id mask is not an external mount")
	} else if b, err := os.ReadFile(m.source); err != nil || strings.TrimSpace(string(b)) != bootID {
		t.Errorf("boot_id copied as %q (%v), the sandbox reads %q", b, err, bootID)
	}
	if m, ok := mounts["/proc/keys"]; !ok {
		t.Error("the /proc/keys mask is not an external mount")
	} else if b, err := os.ReadFile(m.source); err != nil || len(b) != 0 {
		t.Errorf("/proc/keys copied as %q (%v)", b, err)
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", s.init.pid))
	found := false
	for _, f := range cp.files {
		found = found || f.path == exe
	}
	if !found {
		t.Errorf("init's executable %s is not an external file: %+v", exe, cp.files)
	}
	var runnerR, runnerW int
	for _, p := range cp.pipes {
		if !p.init && p.reader {
			runnerR++
		}
		if !p.init && !p.reader && p.fd > 2 {
			runnerW++
		}
	}
	if runnerR != 1 || runnerW != 1 {
		t.Errorf("the runner's pipes: %d read, %d written, want one each: %+v", runnerR, runnerW, cp.pipes)
	}
	if len(cp.socks) != 1 || cp.socks[0].fd != fdControl {
		t.Errorf("init's control socket: %+v", cp.socks)
	}
}

// TestCheckpointRestorePython dumps a classic persistent sandbox that
// holds x = 41 (its processes end, their memory is freed), restores its
// tree, and asks the restored runner for x + 1 over the new pipes. The
// restored tree is not yet the Sandbox's again (docs/snapshots.md): the
// test speaks the runner's protocol itself.
func TestCheckpointRestorePython(t *testing.T) {
	bin := requireCRIU(t)
	s := checkpointSandbox(t)
	ctx := context.Background()
	tree, err := processTree(s.init.pid)
	if err != nil {
		t.Fatal(err)
	}
	rss := treeRSS(tree)
	memBefore := cgroupMemory(s)
	cwdBefore, err := s.Execute(ctx, sandbox.ExecRequest{Code: "import os; print(os.getcwd())"}, nil)
	if err != nil || cwdBefore.Status != sandbox.StatusOK {
		t.Fatalf("%+v %v", cwdBefore, err)
	}
	t.Logf("working directory before the dump: %s", cwdBefore.Stdout)
	mountsBefore, err := s.Execute(ctx, sandbox.ExecRequest{Code: "print(" + mountsCode + ")"}, nil)
	if err != nil || mountsBefore.Status != sandbox.StatusOK {
		t.Fatalf("%+v %v", mountsBefore, err)
	}
	budget := map[string]string{}
	for _, name := range budgetFiles {
		res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "print(" + readCode(name) + ")"}, nil)
		if err != nil || res.Status != sandbox.StatusOK {
			t.Fatalf("%+v %v", res, err)
		}
		budget[name] = strings.TrimSpace(res.Stdout)
	}
	if !strings.HasPrefix(budget["unshare"], "(-1, ") {
		t.Fatalf("unshare(CLONE_NEWUSER) in the sandbox: %s", budget["unshare"])
	}

	// The parent lets the sandbox's host root through, as a data
	// directory's checkpoints directory will (handOver).
	parent, err := os.MkdirTemp("", "vivarium-checkpoint-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(parent)
	if err := os.Chmod(parent, 0o711); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "checkpoint")
	if d := os.Getenv("VIVARIUM_CHECKPOINT_KEEP"); d != "" {
		os.RemoveAll(d)
		dir = d
	}
	cp, err := s.dump(ctx, bin, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.close()
	// Stopped: init exited (its wait returned), and no process of the
	// tree is left.
	select {
	case <-s.initDone:
	case <-time.After(10 * time.Second):
		t.Fatal("init still running after the dump")
	}
	for _, pid := range tree {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); !strings.Contains(string(st), ") Z") {
				t.Errorf("process %d of the dumped tree still runs", pid)
			}
		}
	}
	// Images hold the sandbox's memory: root's, readable by the
	// sandbox's host root group, by nobody else.
	gid := s.owner.ID(0)
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Error(err)
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		mask := filepath.Dir(p) == filepath.Join(dir, "ext") // the /proc masks: readable by all, behind dir
		if (!mask && fi.Mode().Perm()&0o007 != 0) || fi.Mode().Perm()&0o022 != 0 || st.Uid != 0 || st.Gid != gid {
			t.Errorf("%s: %v, owner %d:%d", p, fi.Mode(), st.Uid, st.Gid)
		}
		return nil
	})
	t.Logf("dump: %v, %d processes, %d KiB resident before, images %d KiB; external: %d mounts, %d files, %d pipes, %d sockets",
		cp.took.Round(time.Millisecond), len(tree), rss>>10, fileutil.DirSize(dir)>>10, len(cp.mounts), len(cp.files), len(cp.pipes), len(cp.socks))
	t.Logf("the sandbox's cgroup holds %d KiB before the dump, %d KiB after (its files, in its root tmpfs, stay)",
		memBefore>>10, cgroupMemory(s)>>10)

	r, err := restoreTree(ctx, bin, cp)
	if err != nil {
		t.Fatal(err)
	}
	defer r.kill()
	t.Logf("restore: %v, init is host pid %d", r.took.Round(time.Millisecond), r.pid)

	req, events := restoredRunnerPipes(t, cp, r)
	start := time.Now()
	if got := execRestored(t, req, events, "x + 1"); got != "42" {
		t.Fatalf("x + 1 after restore: %q", got)
	}
	t.Logf("x + 1 = 42, %v after the restore", time.Since(start).Round(time.Millisecond))

	for code, want := range map[string]string{
		"open('kept.txt').read()":            "kept",
		"f.seek(0); f.read()":                "abc",
		"child.poll() is None and child.pid": "",
		"import os; os.getcwd()":             strings.TrimSpace(cwdBefore.Stdout),
	} {
		got := execRestored(t, req, events, code)
		if want == "" && (got == "False" || got == "") || want != "" && got != want {
			t.Errorf("%s after restore: %q", code, got)
		}
	}

	// Restored, it is still the same sandbox: in its cgroup, its host
	// user, with the budgets of its user namespace.
	pids, err := s.cg.Procs()
	if err != nil || !slices.Contains(pids, r.pid) {
		t.Errorf("restored init %d is not in the sandbox's cgroup: %v %v", r.pid, pids, err)
	}
	if got := execRestored(t, req, events, "import os; os.getuid(), os.getgid()"); got != "(1000, 1000)" {
		t.Errorf("the runner's user after restore: %s", got)
	}
	// The same mounts, with the same flags: the /proc masks, read-only
	// /usr and /dev, nosuid and noexec where they were.
	if got := execRestored(t, req, events, mountsCode); got != strings.TrimSpace(mountsBefore.Stdout) {
		t.Errorf("mounts after restore:\n%s\nbefore:\n%s", got, mountsBefore.Stdout)
	}
	if got := execRestored(t, req, events, "len(open('/proc/keys').read())"); got != "0" {
		t.Errorf("/proc/keys after restore: %q", got)
	}
	for _, name := range budgetFiles {
		code := readCode(name)
		if got := execRestored(t, req, events, code); got != strings.TrimSpace(budget[name]) {
			t.Errorf("%s after restore: %s, before: %s", name, got, budget[name])
		}
	}
}

// restoredRunnerPipes returns the supervisor's ends of a restored runner's
// request pipe (the one it reads) and event pipe (the one it writes that
// is not its stdout or stderr).
func restoredRunnerPipes(t *testing.T, cp *checkpoint, r *restoredTree) (req, events *os.File) {
	t.Helper()
	for _, p := range cp.pipes {
		switch {
		case p.init:
		case p.reader:
			req = r.pipes[p.ino]
		case p.fd > 2:
			events = r.pipes[p.ino]
		}
	}
	if req == nil || events == nil {
		t.Fatalf("the runner's pipes were not among the external ones: %+v", cp.pipes)
	}
	return req, events
}

// A pause whose dump fails (here criu itself) leaves the sandbox running
// as it was, unpaused: init on its new control socket, which the Sandbox
// reads, the runner with its state, its user namespace's budget of mount
// namespaces as before the dump raised it.
func TestCheckpointFailedDump(t *testing.T) {
	testutil.RequireRoot(t)
	s := checkpointSandbox(t)
	ctx := context.Background()
	fake := filepath.Join(t.TempDir(), "criu")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'Error (criu/cr-dump.c:1): refused' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.b.criuBin = fake
	s.b.cfg.CheckpointDir = checkpointRoot(t)
	err := s.Pause(ctx)
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("pause with a failing criu: %v", err)
	}
	if s.Paused() {
		t.Fatal("paused after a failed dump")
	}
	for code, want := range map[string]string{
		"x + 1":                "42",
		"f.seek(0); f.read()":  "abc",
		"child.poll() is None": "True",
		readCode("/proc/sys/user/max_mnt_namespaces"): "0",
	} {
		if got := execText(t, s, code); got != want {
			t.Errorf("%s after a failed dump: %q, want %q", code, got, want)
		}
	}
	// Init hears the Sandbox on the new socket: a command starts.
	p, err := s.Start(ctx, sandbox.Command{Argv: []string{"echo", "started"}})
	if err != nil {
		t.Fatalf("start a command after a failed dump: %v", err)
	}
	if out, _ := io.ReadAll(p.Stdout()); strings.TrimSpace(string(out)) != "started" || p.ExitCode() != 0 {
		t.Errorf("command after a failed dump: %q, exit %d", out, p.ExitCode())
	}
	// The sandbox's masks' files (maskStore) stay for its next pause.
	if entries, _ := os.ReadDir(filepath.Join(s.b.cfg.CheckpointDir, s.id)); len(entries) != 0 &&
		(len(entries) != 1 || entries[0].Name() != "masks") {
		t.Errorf("a failed dump left %v", entries)
	}
}

// execText runs code in s and returns the text of its result (a string's
// quotes taken off), failing the test on any error.
func execText(t *testing.T, s *Sandbox, code string) string {
	t.Helper()
	res, err := s.Execute(context.Background(), sandbox.ExecRequest{Code: code}, nil)
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%s: %+v %v", code, res, err)
	}
	var got string
	for _, r := range res.Results {
		if r.IsMainResult {
			got = r.Text
		}
	}
	if got == "" {
		got = strings.TrimSpace(res.Stdout)
	}
	if len(got) >= 2 && (got[0] == '\'' || got[0] == '"') && got[len(got)-1] == got[0] {
		got = got[1 : len(got)-1]
	}
	return got
}

// checkpointRoot is a directory for a backend's checkpoints that lets the
// sandboxes' host roots through (0711), removed when the test ends.
func checkpointRoot(t testing.TB) string {
	t.Helper()
	parent, err := os.MkdirTemp("", "vivarium-pause-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o711); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(parent, "checkpoints")
}

// mountsCode lists the sandbox's mounts as it sees them: mount point and
// its flags, in order. (The file systems differ: the restored /proc masks
// are files of the checkpoint, the /dev nodes the host's own.)
const mountsCode = `' '.join(sorted(f[4] + ':' + f[5] for f in (l.split() for l in open('/proc/self/mountinfo'))))`

// budgetFiles are what a sandbox reads of its confinement (its
// capabilities, no_new_privs and seccomp mode in /proc/self/status) and
// of its kernel budgets (the user and IPC namespaces' sysctls, its
// rlimits), and what an unshare(CLONE_NEWUSER) gets: the same after a
// restore. /proc/self/status is read from the
// runner both times (pid, memory and counters filtered out).
var budgetFiles = []string{"/proc/self/status", "unshare", "/proc/sys/user/max_mnt_namespaces", "/proc/sys/user/max_user_namespaces",
	"/proc/sys/user/max_inotify_instances", "/proc/sys/user/max_inotify_watches", "/proc/sys/kernel/shmmni",
	"/proc/sys/fs/mqueue/queues_max", "/proc/self/limits"}

// readCode is an expression of what the sandbox reads in name: its
// words, or for /proc/self/status its lines about confinement.
func readCode(name string) string {
	if name == "unshare" { // refused by seccomp: the same error both times
		return "(lambda c: (c.CDLL(None, use_errno=True).unshare(0x10000000), c.get_errno()))(__import__('ctypes'))"
	}
	if name == "/proc/self/status" {
		return "' '.join(' '.join(l.split()) for l in open('/proc/self/status') if l.startswith(('Cap', 'NoNewPrivs', 'Seccomp', 'Uid', 'Gid', 'Groups')))"
	}
	return fmt.Sprintf("' '.join(open('%s').read().split())", name)
}

// execRestored runs code in a restored runner, speaking its protocol on
// its request and event pipes, and returns the text of its result.
func execRestored(t *testing.T, req, events *os.File, code string) string {
	t.Helper()
	if err := runner.WriteFrame(req, runner.Request{Type: "execute", Code: code}); err != nil {
		t.Fatal(err)
	}
	events.SetReadDeadline(time.Now().Add(30 * time.Second))
	fr := runner.NewFrameReader(events, 1<<20)
	var got string
	for {
		ev, err := fr.Next()
		if err != nil {
			t.Fatalf("reading the restored runner's events: %v", err)
		}
		switch ev.Type {
		case "result":
			// text/plain is the result's repr, as a JSON string.
			if err := json.Unmarshal(ev.Data["text/plain"], &got); err != nil {
				t.Fatalf("%s: result %s: %v", code, ev.Data["text/plain"], err)
			}
			if len(got) >= 2 && (got[0] == '\'' || got[0] == '"') && got[len(got)-1] == got[0] {
				got = got[1 : len(got)-1]
			}
			// The runner waits for the supervisor's ack of a result.
			if err := runner.WriteFrame(req, runner.Request{Type: "ack"}); err != nil {
				t.Fatal(err)
			}
		case "error":
			t.Fatalf("%s: %s: %s", code, ev.Name, ev.Value)
		}
		if ev.ExitCode != nil || ev.Type == "done" {
			return got
		}
	}
}

// cgroupMemory reads the memory charged to the sandbox's cgroup (v1 or
// v2), or -1.
func cgroupMemory(s *Sandbox) int64 {
	if s.cg == nil {
		return -1
	}
	for _, p := range []string{"/sys/fs/cgroup/memory" + s.cg.Path() + "/memory.usage_in_bytes", "/sys/fs/cgroup" + s.cg.Path() + "/memory.current"} {
		if b, err := os.ReadFile(p); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return n
		}
	}
	return -1
}

// treeRSS adds up the resident memory of pids.
func treeRSS(pids []int) int64 {
	var total int64
	for _, pid := range pids {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
		var size, res int64
		fmt.Sscan(string(b), &size, &res)
		total += res * int64(os.Getpagesize())
	}
	return total
}

// TestHoldPipes: a command's end of a pipe to the host is held while its
// sandbox is paused. A command that no longer holds it since the tree was
// read (it ended: ESRCH, reaped or not; it closed the descriptor or is
// exiting with its descriptors closed: EBADF) is skipped: CI once failed
// a pause on a command that raced it. A descriptor that is now another
// file is refused.
func TestHoldPipes(t *testing.T) {
	start := func(t *testing.T, argv ...string) (*exec.Cmd, extPipe) {
		t.Helper()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.ExtraFiles = []*os.File{r} // its descriptor 3
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			w.Close()
			cmd.Process.Kill()
			cmd.Wait()
		})
		var st unix.Stat_t
		if err := unix.Fstat(int(w.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		return cmd, extPipe{ino: st.Ino, reader: true, pid: cmd.Process.Pid, fd: 3}
	}
	waitFor := func(what string, done func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !done(); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("%s: not after 10 s", what)
			}
		}
	}
	_, livePipe := start(t, "sleep", "60")
	zombie, zombiePipe := start(t, "sleep", "60")
	if err := zombie.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor("a zombie", func() bool { return procState(zombie.Process.Pid) == "Z" })
	reaped, reapedPipe := start(t, "sleep", "60")
	reaped.Process.Kill()
	reaped.Wait()
	closer, closedPipe := start(t, "sh", "-c", "exec 3<&-; sleep 60")
	waitFor("descriptor 3 closed", func() bool {
		_, err := os.Lstat(fmt.Sprintf("/proc/%d/fd/3", closer.Process.Pid))
		return os.IsNotExist(err)
	})

	cp := &checkpoint{pipes: []extPipe{livePipe, zombiePipe, reapedPipe, closedPipe}}
	if err := cp.holdPipes(); err != nil {
		t.Fatalf("holdPipes: %v", err)
	}
	if len(cp.held) != 1 || cp.held[livePipe.ino] == nil {
		t.Errorf("held %v, want only the live command's pipe %d", cp.held, livePipe.ino)
	}
	cp.close()
	if len(cp.held) != 0 {
		t.Errorf("close left %v held", cp.held)
	}

	other := livePipe
	other.ino++
	cp = &checkpoint{pipes: []extPipe{other}}
	if err := cp.holdPipes(); err == nil {
		cp.close()
		t.Errorf("holdPipes took a descriptor that is not the pipe it was")
	}
}

// procState is the state field of /proc/PID/stat ("Z" for a zombie; ""
// if it is gone). It follows the last ')': a command's name may hold one.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
}

// unmountUnder leaves nothing mounted below a directory: nested mounts,
// and mounts stacked on one point.
func TestUnmountUnder(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	a := filepath.Join(dir, "a")
	if err := os.Mkdir(a, 0o700); err != nil {
		t.Fatal(err)
	}
	for range 2 { // stacked
		if err := unix.Mount("tmpfs", a, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(a, "b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", filepath.Join(a, "b"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	if err := unix.Mount("tmpfs", outside, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(outside, unix.MNT_DETACH)
	mountedUnder := func(d string) (n int) {
		mnts, err := readMountinfo(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mnts {
			if m.point == d || strings.HasPrefix(m.point, d+"/") {
				n++
			}
		}
		return n
	}
	if n := mountedUnder(dir); n != 3 {
		t.Fatalf("%d mounts under the directory before, want 3", n)
	}
	unmountUnder(dir)
	if n := mountedUnder(dir); n != 0 {
		t.Fatalf("%d mounts left under the directory", n)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if n := mountedUnder(outside); n != 1 {
		t.Fatal("a mount outside the directory was detached")
	}
}

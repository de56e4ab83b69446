package native

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The fork tests' cgroup parent and host users, apart from the others'.
const (
	forkCgroupParent = "vivarium-native-fork-test"
	forkUIDBase      = DefaultUIDBase + 31<<24
)

func forkBackend(t *testing.T, logger ...*slog.Logger) (*Backend, string) {
	t.Helper()
	bin := requireCRIU(t)
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	if testutil.ZygoteMode() {
		t.Skip("fork is of classic sandboxes only, tested in the classic run")
	}
	cfg := Config{CgroupParent: forkCgroupParent, UIDBase: forkUIDBase, UIDRanges: 16, CheckpointDir: checkpointRoot(t)}
	if len(logger) > 0 {
		cfg.Logger = logger[0]
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	b.criuBin = bin
	return b, b.cfg.CheckpointDir
}

// limitedSandbox makes a sandbox of spec on a fork backend, closed with
// the test.
func limitedSandbox(t *testing.T, spec sandbox.Spec) *Sandbox {
	t.Helper()
	b, _ := forkBackend(t)
	sbx, err := b.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	s := sbx.(*Sandbox)
	t.Cleanup(func() { s.Close() })
	return s
}

// forkSource is a running sandbox with x = 41, random imported, a file in
// its workspace and another in its root, and its working directory
// changed.
func forkSource(t *testing.T, b *Backend) *Sandbox {
	t.Helper()
	sbx, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	s := sbx.(*Sandbox)
	t.Cleanup(func() { s.Close() })
	execText(t, s, "x = 41\nimport random, os\nopen('source.txt', 'w').write('from the source')\n"+
		"os.makedirs('sub', exist_ok=True)\nopen('/tmp/root-file', 'w').write('in the root')\nos.chdir('sub')")
	return s
}

// nsOf reads the namespaces, uid and gid maps and cgroup of host pid.
func nsOf(t *testing.T, pid int) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, ns := range []string{"user", "mnt", "pid", "net", "ipc", "uts", "cgroup"} {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil {
			t.Fatal(err)
		}
		m[ns] = l
	}
	for _, f := range []string{"uid_map", "gid_map", "cgroup"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
		if err != nil {
			t.Fatal(err)
		}
		m[f] = strings.Join(strings.Fields(string(b)), " ")
	}
	return m
}

// aclCode writes acl.txt with an ACL that names user 1234, and defines
// acl_users, which lists the users a file's ACL names.
const aclCode = `import os, struct
open('/workspace/acl.txt', 'w').write('acl')
ents = [(1, 6, 0xffffffff), (2, 4, 1234), (4, 4, 0xffffffff), (0x10, 4, 0xffffffff), (0x20, 4, 0xffffffff)]
os.setxattr('/workspace/acl.txt', 'system.posix_acl_access', struct.pack('<I', 2) + b''.join(struct.pack('<HHI', *e) for e in ents))
def acl_users(p):
    v = os.getxattr(p, 'system.posix_acl_access')
    return [struct.unpack_from('<HHI', v, 4 + 8*i)[2] for i in range((len(v) - 4) // 8) if struct.unpack_from('<HHI', v, 4 + 8*i)[0] == 2]`

// TestFork forks a sandbox into three: each copy has the source's
// variables, files and working directory, writes its own files unseen by
// the others, is its own host user, cgroup and namespaces, and draws its
// own random numbers; the source goes on. Closing them all leaves nothing.
func TestFork(t *testing.T) {
	b, cpRoot := forkBackend(t)
	ctx := context.Background()
	s := forkSource(t, b)
	srcNS := nsOf(t, s.init.pid)
	// An ACL naming a user (1234), whose id is in the sandbox's host
	// range, and an extended attribute.
	execText(t, s, aclCode+"\nimport os\nos.setxattr('/workspace/acl.txt', 'user.note', b'kept')")

	start := time.Now()
	sbxs, err := s.Fork(ctx, 3, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Fork(3): %v", time.Since(start))
	copies := make([]*Sandbox, len(sbxs))
	for i, c := range sbxs {
		copies[i] = c.(*Sandbox)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			for _, c := range copies {
				c.Close()
			}
		}
	})
	seen := map[string]string{"source": strings.Join([]string{srcNS["uid_map"], srcNS["cgroup"]}, "|")}
	for k, v := range srcNS {
		seen["source "+k] = v
	}
	draws := map[string]bool{}
	for i, c := range copies {
		if got := execText(t, c, "x + 1"); got != "42" {
			t.Fatalf("copy %d: x + 1 = %q", i, got)
		}
		if got := execText(t, c, "open('../source.txt').read()"); got != "from the source" {
			t.Fatalf("copy %d: source.txt: %q", i, got)
		}
		if got := execText(t, c, "open('/tmp/root-file').read()"); got != "in the root" {
			t.Fatalf("copy %d: /tmp/root-file: %q", i, got)
		}
		if got := execText(t, c, "os.getcwd()"); got != "/workspace/sub" {
			t.Fatalf("copy %d: cwd %q", i, got)
		}
		execText(t, c, fmt.Sprintf("open('/workspace/copy%d.txt', 'w').write('copy %d')", i, i))
		// Through the host's view of its workspace too.
		if _, _, err := c.Workspace().OpenFile(fmt.Sprintf("copy%d.txt", i)); err != nil {
			t.Fatalf("copy %d: its workspace from the host: %v", i, err)
		}
		draws[execText(t, c, "random.random()")] = true

		ns := nsOf(t, c.init.pid)
		if want := fmt.Sprintf("0 %d 65536", c.owner.First); ns["uid_map"] != want || ns["gid_map"] != want {
			t.Fatalf("copy %d: uid_map %q gid_map %q, want %q", i, ns["uid_map"], ns["gid_map"], want)
		}
		if c.owner.First == s.owner.First {
			t.Fatalf("copy %d has the source's host user", i)
		}
		if !strings.Contains(ns["cgroup"], c.cg.Path()) {
			t.Fatalf("copy %d: cgroup %q, want %s", i, ns["cgroup"], c.cg.Path())
		}
		for k, v := range ns {
			key := k + " " + v
			if prev, ok := seen[key]; ok {
				t.Fatalf("copy %d shares its %s (%s) with %s", i, k, v, prev)
			}
			seen[key] = fmt.Sprintf("copy %d", i)
		}
		// The source's files are the copy's host user's, seen from
		// inside and from the host.
		if got := execText(t, c, "os.stat('/workspace/source.txt').st_uid, os.stat('/tmp').st_uid"); got != "(1000, 0)" {
			t.Fatalf("copy %d: owners inside: %s", i, got)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(fmt.Sprintf("/proc/%d/root/workspace/source.txt", c.init.pid), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != c.owner.ID(SandboxUID) || st.Gid != c.owner.ID(SandboxGID) {
			t.Fatalf("copy %d: source.txt is %d:%d on the host, want %d", i, st.Uid, st.Gid, c.owner.ID(SandboxUID))
		}
		if got := execText(t, c, "acl_users('/workspace/acl.txt'), os.getxattr('/workspace/acl.txt', 'user.note')"); got != "([1234], b'kept')" {
			t.Fatalf("copy %d: the ACL's users and the attribute: %s", i, got)
		}
		// Its limits are the source's (the pids limit, less what each
		// one's init has: fitPids).
		compared := 0
		for _, f := range []string{"memory/%s/memory.limit_in_bytes", "pids/%s/pids.max", "memory%s/memory.max", "%s/pids.max"} {
			src, err1 := os.ReadFile(filepath.Join("/sys/fs/cgroup", fmt.Sprintf(f, s.cg.Path())))
			cp, err2 := os.ReadFile(filepath.Join("/sys/fs/cgroup", fmt.Sprintf(f, c.cg.Path())))
			if strings.HasSuffix(f, "pids.max") {
				src, cp = codePids(src, s), codePids(cp, c)
			}
			if err1 == nil && (err2 != nil || string(src) != string(cp)) {
				t.Fatalf("copy %d: %s is %q, the source's %q (%v)", i, f, cp, src, err2)
			}
			if err1 == nil {
				compared++
			}
		}
		if compared != 2 {
			t.Fatalf("copy %d: %d of the cgroup's limits compared", i, compared)
		}
		for _, name := range budgetFiles {
			if got, want := execText(t, c, readCode(name)), execText(t, s, readCode(name)); got != want {
				t.Fatalf("copy %d: %s is %s, the source's %s", i, name, got, want)
			}
		}
	}
	if len(draws) != len(copies) {
		t.Fatalf("the copies drew the same random numbers: %v", draws)
	}
	// Each copy's file is its own.
	for i, c := range copies {
		for j := range copies {
			want := "False"
			if i == j {
				want = "True"
			}
			if got := execText(t, c, fmt.Sprintf("os.path.exists('/workspace/copy%d.txt')", j)); got != want {
				t.Fatalf("copy %d sees copy%d.txt: %s", i, j, got)
			}
		}
	}
	if got := execText(t, s, "[os.path.exists('/workspace/copy%d.txt' % i) for i in range(3)], x, os.getcwd()"); got != "([False, False, False], 41, '/workspace/sub')" {
		t.Fatalf("the source after the fork: %s", got)
	}

	// Close leaves nothing: processes, cgroups, mounts, directories.
	var pids []int
	var cgs []string
	for _, c := range copies {
		tree, err := processTree(c.init.pid)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, tree...)
		cgs = append(cgs, c.cg.Path())
	}
	for _, c := range copies {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	closed = true
	for _, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			t.Errorf("process %d of a copy still runs", pid)
		}
	}
	for _, cg := range cgs {
		for _, h := range []string{"memory", "pids", "cpuacct", "freezer", "cpu", "blkio", "unified"} {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", h, cg)); err == nil {
				t.Errorf("cgroup %s still there in %s", cg, h)
			}
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), cpRoot) {
		t.Errorf("mounts left under %s:\n%s", cpRoot, mi)
	}
	if ents, _ := os.ReadDir(cpRoot); len(ents) != 0 {
		t.Errorf("left in the checkpoints: %v", ents)
	}
	if got := execText(t, s, "x + 1"); got != "42" {
		t.Fatalf("the source after its copies closed: %s", got)
	}
}

// TestForkSameRandomState keeps the random state when asked to; the
// copies go on when the source is closed.
func TestForkSameRandomState(t *testing.T) {
	b, _ := forkBackend(t)
	s := forkSource(t, b)
	sbxs, err := s.Fork(context.Background(), 2, sandbox.ForkOptions{SameRandomState: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range sbxs {
		defer c.Close()
	}
	want := execText(t, s, "random.random()")
	for i, c := range sbxs {
		if got := execText(t, c.(*Sandbox), "random.random()"); got != want {
			t.Fatalf("copy %d drew %s, the source %s", i, got, want)
		}
	}
	// The copies need nothing of the source's.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i, c := range sbxs {
		if got := execText(t, c.(*Sandbox), "x + 1, open('/workspace/source.txt').read()"); got != "(42, 'from the source')" {
			t.Fatalf("copy %d after the source closed: %s", i, got)
		}
	}
}

// TestForkRefused: a paused sandbox, a bad count.
func TestForkRefused(t *testing.T) {
	b, _ := forkBackend(t)
	s := forkSource(t, b)
	ctx := context.Background()
	if _, err := s.Fork(ctx, 0, sandbox.ForkOptions{}); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Fatalf("Fork(0): %v", err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Fork(ctx, 1, sandbox.ForkOptions{}); !errors.Is(err, sandbox.ErrPaused) {
		t.Fatalf("Fork of a paused sandbox: %v", err)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	sbxs, err := s.Fork(ctx, 1, sandbox.ForkOptions{})
	if err != nil {
		t.Fatalf("Fork of a resumed sandbox: %v", err)
	}
	defer sbxs[0].Close()
	if got := execText(t, sbxs[0].(*Sandbox), "x + 1"); got != "42" {
		t.Fatalf("the copy of a resumed sandbox: x + 1 = %s", got)
	}
}

// TestForkTiming measures a fork into 1 and into 10 copies of an idle
// sandbox and of one that imported pandas (the goal: 10 ready in
// 1 s); the backend's debug log says where the time went.
func TestForkTiming(t *testing.T) {
	b, _ := forkBackend(t, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	for _, tc := range []struct{ name, code string }{
		{"idle", ""},
		{"pandas", "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})"},
	} {
		s := forkSource(t, b)
		if tc.code != "" {
			execText(t, s, tc.code)
		}
		for _, n := range []int{1, 10} {
			start := time.Now()
			sbxs, err := s.Fork(context.Background(), n, sandbox.ForkOptions{})
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range sbxs {
				if got := execText(t, c.(*Sandbox), "x + 1"); got != "42" {
					t.Fatalf("x + 1 = %s", got)
				}
			}
			t.Logf("%s: Fork(%d): %d ms; the source's cgroup holds %d KiB, a copy's %d KiB", tc.name, n,
				took.Milliseconds(), cgroupMemory(s)>>10, cgroupMemory(sbxs[0].(*Sandbox))>>10)
			for _, c := range sbxs {
				c.Close()
			}
		}
		s.Close()
	}
}

// testWriter writes a log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestForkNumpyAndCommands: numpy's global generator is reseeded in each
// copy; a command running in the source goes on there, and the copies
// work, paused and resumed, and forked again.
func TestForkNumpyAndCommands(t *testing.T) {
	b, _ := forkBackend(t)
	s := forkSource(t, b)
	ctx := context.Background()
	if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "import numpy as np\nnp.random.seed(1)"}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Skipf("numpy: %+v %v", res, err)
	}
	p, err := s.Start(ctx, sandbox.Command{Argv: []string{"sh", "-c", "read x; echo got $x"}})
	if err != nil {
		t.Fatal(err)
	}
	sbxs, err := s.Fork(ctx, 2, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range sbxs {
		defer c.Close()
	}
	c0, c1 := sbxs[0].(*Sandbox), sbxs[1].(*Sandbox)
	a, b1 := execText(t, c0, "np.random.random()"), execText(t, c1, "np.random.random()")
	if a == b1 || a == execText(t, s, "np.random.random()") {
		t.Fatalf("numpy draws: copies %s %s", a, b1)
	}
	// The source's command still reads its input.
	if _, err := io.WriteString(p.Stdin(), "it\n"); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout())
	if string(out) != "got it\n" {
		t.Fatalf("the source's command printed %q", out)
	}
	// A copy pauses and resumes, and forks.
	pauseResume(t, c0)
	if got := execText(t, c0, "x + 1"); got != "42" {
		t.Fatalf("the resumed copy: %s", got)
	}
	grand, err := c0.Fork(ctx, 1, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer grand[0].Close()
	g := grand[0].(*Sandbox)
	if got := execText(t, g, "x + 1, open('/workspace/source.txt').read()"); got != "(42, 'from the source')" {
		t.Fatalf("the copy's copy: %s", got)
	}
	if want := fmt.Sprintf("0 %d 65536", g.owner.First); nsOf(t, g.init.pid)["uid_map"] != want {
		t.Fatalf("the copy's copy's uid_map: %s", nsOf(t, g.init.pid)["uid_map"])
	}
}

// TestForkFailed: a fork that cannot make every copy (the pool of host
// users runs out) makes none, leaves nothing behind, and the source goes
// on.
func TestForkFailed(t *testing.T) {
	b, cpRoot := forkBackend(t)
	s := forkSource(t, b)
	before, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup/memory", forkCgroupParent))
	if _, err := s.Fork(context.Background(), 16, sandbox.ForkOptions{}); err == nil || !strings.Contains(err.Error(), "host uid range") {
		t.Fatalf("Fork(16) with 15 host users free: %v", err)
	}
	if _, _, _, inUse, err := b.UIDPool(); err != nil || inUse != 1 {
		t.Fatalf("host users in use after the failed fork: %d %v", inUse, err)
	}
	after, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup/memory", forkCgroupParent))
	if len(after) != len(before) {
		t.Fatalf("cgroups before the fork %d, after %d", len(before), len(after))
	}
	if ents, _ := os.ReadDir(cpRoot); len(ents) != 0 {
		t.Fatalf("checkpoints left: %v", ents)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), cpRoot) {
		t.Fatalf("mounts left under %s", cpRoot)
	}
	if got := execText(t, s, "x + 1"); got != "42" {
		t.Fatalf("the source after a failed fork: %s", got)
	}
}

// TestForkContexts: a copy has the source's code contexts, with their
// state, and they are its own from then on.
func TestForkContexts(t *testing.T) {
	b, _ := forkBackend(t)
	s := forkSource(t, b)
	cc, err := s.CreateContext("python", "")
	if err != nil {
		t.Fatal(err)
	}
	run := func(sb *Sandbox, code string) string {
		t.Helper()
		res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: code, Context: cc.ID}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != sandbox.StatusOK {
			t.Fatalf("%q in context %s: %s %s", code, cc.ID, res.Status, res.Stderr)
		}
		return strings.TrimSpace(res.Stdout)
	}
	run(s, "y = 'in the context'")
	sbxs, err := s.Fork(context.Background(), 1, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := sbxs[0].(*Sandbox)
	defer c.Close()
	if got := len(c.Contexts()); got != len(s.Contexts()) {
		t.Fatalf("the copy has %d contexts, the source %d", got, len(s.Contexts()))
	}
	if got := run(c, "print(y)"); got != "in the context" {
		t.Fatalf("the context in the copy: %q", got)
	}
	run(c, "y = 'changed in the copy'")
	if got := run(s, "print(y)"); got != "in the context" {
		t.Fatalf("the source's context after the copy's changed: %q", got)
	}
	if err := c.RemoveContext(cc.ID); err != nil {
		t.Fatal(err)
	}
	if got := run(s, "print(y)"); got != "in the context" {
		t.Fatalf("the source's context after the copy removed its own: %q", got)
	}
}

// codePids is a pids.max's value less the threads s's init has: what the
// sandbox's code may have.
func codePids(max []byte, s *Sandbox) []byte {
	n, err := strconv.Atoi(strings.TrimSpace(string(max)))
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", s.init.pid))
	if err != nil || len(tasks) == 0 {
		return max
	}
	return []byte(strconv.Itoa(n - len(tasks)))
}

// TestForkUnderMemoryPressure forks a sandbox that holds most of its
// memory limit (a numpy array of 224 of its 256 MiB): each copy is
// restored under the same limit, so the fork either makes copies that
// hold the array, or is refused whole, leaving nothing behind; the source
// goes on either way. A fork whose copies would not fit in the host's
// available memory is refused (ErrNoRoom) before anything is dumped.
func TestForkUnderMemoryPressure(t *testing.T) {
	s := limitedSandbox(t, sandbox.Spec{Limits: sandbox.Limits{Memory: 256 << 20}})
	execText(t, s, "import numpy as np\na = np.ones(224 << 20 >> 3)\nint(a.sum())")
	before, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup/memory", forkCgroupParent))
	copies, err := s.Fork(context.Background(), 2, sandbox.ForkOptions{})
	t.Logf("Fork(2) of a sandbox holding 224 of its 256 MiB: %d copies, %v", len(copies), err)
	if err == nil {
		for _, c := range copies {
			if got := execText(t, c.(*Sandbox), "int(a.sum())"); got != fmt.Sprint(224<<20>>3) {
				t.Errorf("a copy's array: %s", got)
			}
			c.Close()
		}
	} else {
		after, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup/memory", forkCgroupParent))
		if len(after) != len(before) {
			t.Errorf("cgroups before the refused fork %d, after %d", len(before), len(after))
		}
	}
	if got := execText(t, s, "int(a.sum())"); got != fmt.Sprint(224<<20>>3) {
		t.Fatalf("the source after the fork: %s", got)
	}

	// A host with 1 GiB available (of 4): four copies of 230-odd MiB
	// would leave it less than its reserve.
	real := hostMemory
	hostMemory = func() (int64, int64, error) { return 1 << 30, 4 << 30, nil }
	defer func() { hostMemory = real }()
	before, _ = os.ReadDir(filepath.Join("/sys/fs/cgroup/memory", forkCgroupParent))
	if _, err := s.Fork(context.Background(), 4, sandbox.ForkOptions{}); !errors.Is(err, sandbox.ErrNoRoom) {
		t.Fatalf("Fork(4) of 230 MiB on a host with 1 GiB available: %v", err)
	} else {
		t.Logf("refused: %v", err)
	}
	if after, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup/memory", forkCgroupParent)); len(after) != len(before) {
		t.Errorf("cgroups before the refused fork %d, after %d", len(before), len(after))
	}
	if copies, err := s.Fork(context.Background(), 1, sandbox.ForkOptions{}); err != nil {
		t.Fatalf("Fork(1), which fits: %v", err)
	} else {
		copies[0].Close()
	}
}

// TestForkMemoryFull forks a sandbox whose /dev/shm holds its whole
// memory limit (what a filled tmpfs costs is memory): a copy restored under
// the same limit would be killed halfway through, which left criu waiting
// for it. The fork is refused up front (ErrNoRoom), and the source goes on.
func TestForkMemoryFull(t *testing.T) {
	s := limitedSandbox(t, sandbox.Spec{Limits: sandbox.Limits{Memory: 256 << 20}})
	res, err := s.Execute(context.Background(), sandbox.ExecRequest{Code: `f = open("/dev/shm/fill", "wb")
while True: f.write(b"x" * (1 << 20))`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("filling /dev/shm: %s", res.Status)
	done := make(chan error, 1)
	go func() {
		copies, err := s.Fork(context.Background(), 1, sandbox.ForkOptions{})
		for _, c := range copies {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, sandbox.ErrNoRoom) {
			t.Fatalf("fork of a sandbox at its memory limit: %v", err)
		}
		t.Logf("refused: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the fork of a sandbox at its memory limit did not end within 2 minutes")
	}
	if got := execText(t, s, `import os; os.remove("/dev/shm/fill"); 6 * 7`); got != "42" {
		t.Fatalf("the source after the fork: %q", got)
	}
}

// TestForkMasksShared: a fork's copies share the snapshot's /proc masks'
// files (copyMaskFile), root's and read-only: no copy writes one, each
// reads the source's, and one stays whole when its siblings and the
// source are gone.
func TestForkMasksShared(t *testing.T) {
	const bootID = "open('/proc/sys/kernel/random/boot_id').read().strip()"
	b, _ := forkBackend(t)
	s := forkSource(t, b)
	id := execText(t, s, bootID)
	copies, err := s.Fork(context.Background(), 2, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer copies[1].Close()
	c0, c1 := copies[0].(*Sandbox), copies[1].(*Sandbox)
	m0 := maskFiles(t, filepath.Join(c0.lastCheckpoint, "ext"))
	m1 := maskFiles(t, filepath.Join(c1.lastCheckpoint, "ext"))
	if !slices.Equal(slices.Sorted(maps.Keys(m0)), slices.Sorted(maps.Keys(m1))) {
		t.Errorf("the copies' masks are not the same files: %v, %v", m0, m1)
	}
	for _, name := range m0 {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(c0.lastCheckpoint, "ext", name), &st); err != nil || st.Gid != 0 {
			t.Errorf("the copies' mask %s: group %d (%v), want root's: no copy's group may reach it", name, st.Gid, err)
		}
	}
	for _, c := range []*Sandbox{c0, c1} {
		if got := execText(t, c, bootID); got != id {
			t.Errorf("a copy's boot id %s, the source's %s", got, id)
		}
		got := execText(t, c, "try:\n  open('/proc/sys/kernel/random/boot_id', 'w').write('x')\n  r = 'written'\n"+
			"except OSError as e:\n  r = type(e).__name__\nr")
		if got == "written" {
			t.Fatal("a copy wrote a mask it shares with its siblings")
		}
	}
	c0.Close()
	s.Close()
	if got := execText(t, c1, bootID); got != id {
		t.Errorf("the last copy's boot id %s, the source's %s", got, id)
	}
}

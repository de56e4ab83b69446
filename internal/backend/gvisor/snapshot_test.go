package gvisor_test

import (
	"context"
	"errors"
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

	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// snapshotState is what the snapshot tests' source holds: pandas and a
// DataFrame, a variable, a file written and one held open, a background
// process, and a second code context.
const snapshotState = "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})\n" + lightState

// lightState is snapshotState without pandas, for the tests about what
// holds a saved sandbox rather than what it holds.
const lightState = "import random, subprocess, sys\nx = 41\n" +
	"open('kept.txt', 'w').write('kept')\n" +
	"f = open('open.txt', 'w+')\nf.write('abc')\nf.flush()\n" +
	"child = subprocess.Popen(['sleep', '600'])"

// memoryGroups are the sandboxes' groups in the memory hierarchy.
func memoryGroups() []string {
	var out []string
	for _, g := range testutil.CgroupsUnder(pauseCgroupParent) {
		if strings.HasPrefix(g, "/sys/fs/cgroup/memory/") {
			out = append(out, g)
		}
	}
	return out
}

// checkState fails unless s holds what snapshotState (or lightState) made,
// and y in context cc when not empty: one execution, as each takes a
// while in gVisor.
func checkState(t *testing.T, s sandbox.Sandbox, cc string) {
	t.Helper()
	code := "import os\n[x + 1, open('kept.txt').read(), (f.seek(0), f.read())[1], child.poll(), os.kill(child.pid, 0), " +
		"'pd' in globals() and (int(df.a.sum()), 'pandas' in sys.modules)]"
	const light = "[42, 'kept', 'abc', None, None, False]"
	const heavy = "[42, 'kept', 'abc', None, None, (499500, True)]"
	if got := execValue(t, s, code); got != light && got != heavy {
		t.Errorf("%s: x + 1, kept.txt, open.txt, the background process, pandas: %s, want %s or %s", s.ID(), got, light, heavy)
	}
	if cc != "" {
		res, err := s.Execute(context.Background(), sandbox.ExecRequest{Code: "y", Context: cc}, nil)
		if err != nil || res.Status != sandbox.StatusOK || len(res.Results) == 0 || res.Results[0].Text != "7" {
			t.Errorf("%s: y in its context: %+v %v", s.ID(), res, err)
		}
	}
}

// TestSnapshot saves a running gVisor sandbox (pandas state, files, a
// background process, a code context) and makes sandboxes of it: each
// has the state, files and process as saved, an id, container and cgroup
// of its own and the snapshot's limits; the source goes on unaffected,
// and what it writes after is not in the copies. Random generators are
// reseeded unless asked not to be. A damaged or missing image is refused
// clearly. Then the source is forked (checkFork), and nothing is left.
func TestSnapshot(t *testing.T) {
	dir := t.TempDir()
	cps := filepath.Join(t.TempDir(), "checkpoints")
	b := pauseBackend(t, gvisor.Config{StateDir: dir, CheckpointDir: cps})
	ctx := context.Background()
	const memLimit = 400 << 20
	src, err := b.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{Memory: memLimit}})
	if err != nil {
		t.Fatal(err)
	}
	var closers []sandbox.Sandbox
	closers = append(closers, src)
	defer func() {
		for _, s := range closers {
			s.Close()
		}
	}()
	sn, ok := src.(sandbox.Snapshotter)
	if !ok {
		t.Fatal("a gvisor sandbox is not a sandbox.Snapshotter")
	}
	if err := sn.SnapshotSupported(); err != nil {
		t.Fatal(err)
	}
	execValue(t, src, snapshotState)
	cc, err := src.(sandbox.ContextKeeper).CreateContext("python", "")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := src.Execute(ctx, sandbox.ExecRequest{Code: "y = 7", Context: cc.ID}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("y = 7 in a context: %+v %v", res, err)
	}
	// The backend's first checkpoint probes runsc first: not measured.
	if _, err := sn.SaveSnapshot(ctx, filepath.Join(t.TempDir(), "warm")); err != nil {
		t.Fatal(err)
	}

	// Not while a command runs; the sandbox goes on.
	cmd, err := src.Start(ctx, sandbox.Command{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sn.SaveSnapshot(ctx, filepath.Join(t.TempDir(), "busy")); !errors.Is(err, sandbox.ErrBusy) {
		t.Errorf("SaveSnapshot while a command runs: %v", err)
	}
	cmd.Signal(syscall.SIGKILL)
	<-cmd.Done()

	snaps := t.TempDir()
	snap := filepath.Join(snaps, "snap")
	start := time.Now()
	size, err := sn.SaveSnapshot(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %v, %.1f MiB", time.Since(start).Round(time.Millisecond), float64(size)/(1<<20))
	if size <= 0 || size != fileutil.DirSize(snap) {
		t.Errorf("SaveSnapshot says %d bytes, the directory holds %d", size, fileutil.DirSize(snap))
	}
	if _, err := sn.SaveSnapshot(ctx, snap); err == nil {
		t.Error("a snapshot over an existing directory was made")
	}
	// The source goes on as it was, its background process too.
	checkState(t, src, cc.ID)
	execValue(t, src, "open('after.txt', 'w').write('source only'); x = 100")
	srcNext := execValue(t, src, "random.random()")

	// A sandbox of it: the state as saved, its own everything.
	r := sandbox.Backend(b).(sandbox.SnapshotRestorer)
	start = time.Now()
	c, err := r.CreateFromSnapshot(ctx, snap, sandbox.FromSnapshot{Tenant: ""})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore from the snapshot: %v", time.Since(start).Round(time.Millisecond))
	closers = append(closers, c)
	if c.ID() == src.ID() {
		t.Fatalf("the restored sandbox has the source's id %s", c.ID())
	}
	checkState(t, c, cc.ID)
	if got := execValue(t, c, "import os; os.path.exists('after.txt')"); got != "False" {
		t.Errorf("a file the source wrote after the snapshot is in the restored sandbox: %s", got)
	}
	if got := execValue(t, src, "x"); got != "100" {
		t.Errorf("the source's x after a restore of its snapshot: %s", got)
	}
	if got := execValue(t, c, "random.random()"); got == srcNext {
		t.Errorf("the restored sandbox's random generator was not reseeded: %s, as the source's", got)
	}
	// Files written in it stay its own.
	execValue(t, c, "open('kept.txt', 'w').write('changed in the copy')")
	if got := execValue(t, src, "open('kept.txt').read()"); got != "'kept'" {
		t.Errorf("the source's kept.txt after the copy wrote its own: %s", got)
	}
	if out, code := runCommand(t, c, "sh", "-c", "echo hello from $(id -u)"); code != 0 || out != "hello from 1000\n" {
		t.Errorf("a command in the restored sandbox: %q, exit %d", out, code)
	}
	// Kept random state, when asked.
	same, err := r.CreateFromSnapshot(ctx, snap, sandbox.FromSnapshot{SameRandomState: true})
	if err != nil {
		t.Fatal(err)
	}
	closers = append(closers, same)
	if got := execValue(t, same, "random.random()"); got != srcNext {
		t.Errorf("SameRandomState: %s, the source's next was %s", got, srcNext)
	}
	// Each its own container and cgroup, with the snapshot's limits.
	if got := containers(t, dir); len(got) != 3 {
		t.Errorf("runsc's containers: %v, want 3", got)
	}
	groups := memoryGroups()
	if len(groups) != 3 {
		t.Errorf("memory groups: %v, want 3", groups)
	}
	for _, g := range groups {
		b, _ := os.ReadFile(filepath.Join(g, "memory.limit_in_bytes"))
		if strings.TrimSpace(string(b)) != "419430400" {
			t.Errorf("%s: limit %s, want %d", g, b, memLimit)
		}
	}

	// A damaged or missing image, a link for the workspace.
	broken := func(name string, damage func(image string)) string {
		t.Helper()
		d := filepath.Join(snaps, name)
		if out, err := exec.Command("cp", "-a", snap, d).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
		damage(d)
		return d
	}
	for _, c := range []struct {
		name, want string
		damage     func(dir string)
	}{
		{"image missing", "its image checkpoint.img is missing", func(d string) { os.Remove(filepath.Join(d, "image", "checkpoint.img")) }},
		{"image truncated", "its image checkpoint.img is damaged", func(d string) { os.Truncate(filepath.Join(d, "image", "checkpoint.img"), 1000) }},
		// Not one a sandbox can make (the disk's top is not reachable
		// from inside), but a link there would be bound into the copy.
		{"workspace a link", "workspace is not a directory", func(d string) {
			ws := filepath.Join(d, "files", "workspace")
			if err := os.RemoveAll(ws); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/etc", ws); err != nil {
				t.Fatal(err)
			}
		}},
		{"image changed", "restored container", func(d string) {
			f, err := os.OpenFile(filepath.Join(d, "image", "checkpoint.img"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fi, _ := f.Stat()
			junk := make([]byte, 4096)
			for i := range junk {
				junk[i] = byte(i * 7)
			}
			f.WriteAt(junk, fi.Size()/2)
		}},
	} {
		d := broken(c.name, c.damage)
		_, err := r.CreateFromSnapshot(ctx, d, sandbox.FromSnapshot{})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("a snapshot's %s: %v, want an error saying %q", c.name, err, c.want)
		} else {
			t.Logf("a snapshot's %s: %v", c.name, err)
		}
	}
	if got := containers(t, dir); len(got) != 3 {
		t.Errorf("after the failed restores, runsc's containers: %v, want 3", got)
	}

	for _, s := range closers[1:] {
		if err := s.Close(); err != nil {
			t.Errorf("close %s: %v", s.ID(), err)
		}
	}
	closers = closers[:1]

	execValue(t, src, "x = 41; open('kept.txt', 'w').write('kept'); import numpy as np")
	t.Run("Fork", func(t *testing.T) { checkFork(t, src, dir, cps) })
	if err := src.Close(); err != nil {
		t.Errorf("close the source: %v", err)
	}
	closers = nil
	requireNothingLeft(t, b, dir, cps)
}

// checkFork forks src, which holds snapshotState and numpy, into 3: each
// copy has the source's state, files and background process, and is a
// sandbox of its own (id, container, cgroup); their random generators
// (Python's, numpy's) differ; what one writes is not seen by a sibling or
// the source, nor what the source writes by them. The source goes on
// once they are closed. src must be the backend's one sandbox.
func checkFork(t *testing.T, src sandbox.Sandbox, dir, cps string) {
	ctx := context.Background()
	f, ok := src.(sandbox.Forker)
	if !ok {
		t.Fatal("a gvisor sandbox is not a sandbox.Forker")
	}
	if err := f.ForkSupported(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Fork(ctx, 0, sandbox.ForkOptions{}); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("a fork into 0: %v", err)
	}
	start := time.Now()
	copies, err := f.Fork(ctx, 3, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork into 3: %v", time.Since(start).Round(time.Millisecond))
	defer func() {
		for _, c := range copies {
			c.Close()
		}
	}()
	if len(copies) != 3 {
		t.Fatalf("%d copies", len(copies))
	}
	if left, _ := filepath.Glob(filepath.Join(cps, "fork-*")); len(left) > 0 {
		t.Errorf("the fork's snapshot is left in the checkpoint directory: %v", left)
	}
	all := append([]sandbox.Sandbox{src}, copies...)
	ids := map[string]bool{}
	randoms, nps := map[string]bool{}, map[string]bool{}
	for _, c := range all {
		ids[c.ID()] = true
		checkState(t, c, "")
		randoms[execValue(t, c, "random.random()")] = true
		nps[execValue(t, c, "float(np.random.random())")] = true
		execValue(t, c, "open('mine.txt', 'w').write('"+c.ID()+"')")
	}
	if len(ids) != 4 {
		t.Errorf("ids: %v", ids)
	}
	if len(randoms) != 4 || len(nps) != 4 {
		t.Errorf("random numbers drawn in the source and 3 copies: %v and numpy's %v, want 4 different each", randoms, nps)
	}
	for _, c := range all {
		if got := execValue(t, c, "open('mine.txt').read()"); got != "'"+c.ID()+"'" {
			t.Errorf("%s reads its mine.txt as %s", c.ID(), got)
		}
		// The copies' own workspaces, from the host.
		r, _, err := c.Workspace().OpenFile("mine.txt")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(r)
		r.Close()
		if string(got) != c.ID() {
			t.Errorf("%s's workspace holds %q", c.ID(), got)
		}
	}
	if got := containers(t, dir); len(got) != 4 {
		t.Errorf("runsc's containers: %v, want 4", got)
	}
	groups := memoryGroups()
	if len(groups) != 4 || len(slices.Compact(slices.Sorted(slices.Values(groups)))) != 4 {
		t.Errorf("memory groups: %v, want 4", groups)
	}
	// An execution over its timeout that ignores SIGINT: the copy's
	// agent ends its runner and starts another, in the copy's cgroup,
	// its limits kept.
	limit := func(s sandbox.Sandbox) string {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", pauseCgroupParent, s.ID(), "memory.limit_in_bytes"))
		if err != nil {
			t.Errorf("%s's memory group: %v", s.ID(), err)
		}
		return strings.TrimSpace(string(b))
	}
	res, err := copies[0].Execute(ctx, sandbox.ExecRequest{Code: "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
		Timeout: 2 * time.Second}, nil)
	if err != nil || res.Status != sandbox.StatusTimeout {
		t.Errorf("an execution over its timeout in a copy: %+v %v", res, err)
	}
	if got := execValue(t, copies[0], "1 + 1"); got != "2" {
		t.Errorf("the copy after a timeout: %s", got)
	}
	if a, b := limit(copies[0]), limit(src); a != b || a == "" {
		t.Errorf("the copy's memory limit after its container was killed: %s, the source's %s", a, b)
	}
	// Copies close on their own; the source goes on.
	for _, c := range copies {
		if err := c.Close(); err != nil {
			t.Errorf("close a copy: %v", err)
		}
	}
	if got := execValue(t, src, "x + 1"); got != "42" {
		t.Errorf("the source after its copies closed: %s", got)
	}
}

// TestPersistPaused writes a paused gVisor sandbox down (PersistPaused),
// lets go of everything it holds (ReleasePaused: no cgroup, container,
// disk or checkpoint left; its files answer ErrPaused) and resumes it
// from disk with its state, files and background process; then, paused
// and written down again, another backend (a restarted server) opens it
// (OpenPaused) and resumes it. Then nothing of either is left.
func TestPersistPaused(t *testing.T) {
	dir := t.TempDir()
	cps := filepath.Join(t.TempDir(), "checkpoints")
	b := pauseBackend(t, gvisor.Config{StateDir: dir, CheckpointDir: cps})
	ctx := context.Background()
	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			sb.Close()
		}
	}()
	execValue(t, sb, lightState)
	p := sb.(sandbox.Pauser)
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	// A paused sandbox is neither saved nor forked.
	if _, err := sb.(sandbox.Snapshotter).SaveSnapshot(ctx, filepath.Join(t.TempDir(), "s")); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("SaveSnapshot of a paused sandbox: %v", err)
	}
	if _, err := sb.(sandbox.Forker).Fork(ctx, 1, sandbox.ForkOptions{}); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("Fork of a paused sandbox: %v", err)
	}
	kept := t.TempDir()
	data := filepath.Join(kept, "data")
	start := time.Now()
	size, err := sb.(sandbox.PausePersister).PersistPaused(ctx, data)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("written down: %v, %.1f MiB", time.Since(start).Round(time.Millisecond), float64(size)/(1<<20))
	if err := sb.(sandbox.PausedReleaser).ReleasePaused(data); err != nil {
		t.Fatal(err)
	}
	if left := testutilGroups(); len(left) > 0 {
		t.Errorf("cgroups of the released sandbox: %v", left)
	}
	if left := containers(t, dir); len(left) > 0 {
		t.Errorf("containers of the released sandbox: %v", left)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "sandboxes")); len(entries) > 0 {
		t.Errorf("the released sandbox's directory: %v", entries)
	}
	if image := fileutil.DirSize(cps); image != 0 {
		t.Errorf("the released sandbox's checkpoint is still there (%d bytes)", image)
	}
	if _, _, err := sb.Workspace().OpenFile("kept.txt"); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("a released sandbox's file: %v", err)
	}
	start = time.Now()
	if err := p.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("resumed from disk: %v", time.Since(start).Round(time.Millisecond))
	checkState(t, sb, "")
	execValue(t, sb, "x = 43")

	// Paused and written down again; the server goes (its backend
	// closes the sandbox: the kept directory stays); another opens it.
	if err := p.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	data2 := filepath.Join(kept, "data2")
	if _, err := sb.(sandbox.PausePersister).PersistPaused(ctx, data2); err != nil {
		t.Fatal(err)
	}
	if err := sb.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true

	dir2 := t.TempDir()
	cps2 := filepath.Join(t.TempDir(), "checkpoints")
	b2 := pauseBackend(t, gvisor.Config{StateDir: dir2, CheckpointDir: cps2})
	o, err := sandbox.Backend(b2).(sandbox.PausedOpener).OpenPaused(ctx, data2, sandbox.FromSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	op := o.(sandbox.Pauser)
	if !op.Paused() {
		t.Fatal("an opened sandbox is not paused")
	}
	if err := op.PauseSupported(); err != nil {
		t.Errorf("PauseSupported of an opened sandbox: %v", err)
	}
	if _, err := o.Execute(ctx, sandbox.ExecRequest{Code: "x"}, nil); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("Execute in an opened sandbox: %v", err)
	}
	if _, _, err := o.Workspace().OpenFile("kept.txt"); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("an opened sandbox's file: %v", err)
	}
	if left := testutilGroups(); len(left) > 0 {
		t.Errorf("cgroups of the opened sandbox: %v", left)
	}
	start = time.Now()
	if err := op.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("opened and resumed: %v", time.Since(start).Round(time.Millisecond))
	if got := execValue(t, o, "x"); got != "43" {
		t.Errorf("x in the reopened sandbox: %s", got)
	}
	execValue(t, o, "x = 41")
	checkState(t, o, "")
	// It pauses and resumes as any sandbox.
	if err := op.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := op.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	checkState(t, o, "")
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	requireNothingLeft(t, b, dir, cps)
	requireNothingLeft(t, b2, dir2, cps2)
}

func testutilGroups() []string { return testutil.CgroupsUnder(pauseCgroupParent) }

// BenchmarkSnapshot saves a sandbox that imported pandas and holds a
// DataFrame (snapshot-ms: SaveSnapshot, the source stopped, its disk
// copied and the source restored), makes a sandbox of it
// (restore-ms: CreateFromSnapshot, reseed included, until it answers),
// and forks it into 3 (fork3-ms: all three answering); snapshot-MiB is
// the snapshot's size.
func BenchmarkSnapshot(b *testing.B) {
	cps := b.TempDir()
	be := pauseBackend(b, gvisor.Config{StateDir: b.TempDir(), CheckpointDir: cps})
	ctx := context.Background()
	src, err := be.Create(ctx, sandbox.Spec{})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	if res, err := src.Execute(ctx, sandbox.ExecRequest{Code: "import pandas as pd\ndf = pd.DataFrame({'a': range(1000)})"}, nil); err != nil || res.Status != sandbox.StatusOK {
		b.Skipf("pandas: %+v %v", res, err)
	}
	// The backend's first checkpoint probes runsc first: not measured.
	if _, err := src.(sandbox.Snapshotter).SaveSnapshot(ctx, filepath.Join(b.TempDir(), "warm")); err != nil {
		b.Fatal(err)
	}
	snaps := b.TempDir()
	var save, restore, fork time.Duration
	var size int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dir := filepath.Join(snaps, strconv.Itoa(i))
		start := time.Now()
		n, err := src.(sandbox.Snapshotter).SaveSnapshot(ctx, dir)
		if err != nil {
			b.Fatal(err)
		}
		save += time.Since(start)
		size += n
		start = time.Now()
		c, err := sandbox.Backend(be).(sandbox.SnapshotRestorer).CreateFromSnapshot(ctx, dir, sandbox.FromSnapshot{})
		if err != nil {
			b.Fatal(err)
		}
		restore += time.Since(start)
		c.Close()
		start = time.Now()
		copies, err := src.(sandbox.Forker).Fork(ctx, 3, sandbox.ForkOptions{})
		if err != nil {
			b.Fatal(err)
		}
		fork += time.Since(start)
		for _, c := range copies {
			c.Close()
		}
		os.RemoveAll(dir)
	}
	n := float64(b.N)
	b.ReportMetric(float64(save.Milliseconds())/n, "snapshot-ms")
	b.ReportMetric(float64(restore.Milliseconds())/n, "restore-ms")
	b.ReportMetric(float64(fork.Milliseconds())/n, "fork3-ms")
	b.ReportMetric(float64(size)/n/(1<<20), "snapshot-MiB")
}

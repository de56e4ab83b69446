package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Cgroup parents and host users of the snapshot tests' own.
const (
	snapCgroupParent = "vivarium-native-snapshot-test"
	snapUIDBase      = DefaultUIDBase + 34<<24
)

// stateSource is a sandbox of a new pause backend (parent, uidBase, CRIU
// at bin) holding Python state: x, a module, a file, a working directory
// and a seeded random generator. It closes when the test ends.
func stateSource(t *testing.T, bin, parent string, uidBase uint32) *Sandbox {
	t.Helper()
	b := pauseBackend(t, parent, uidBase)
	b.criuBin = bin
	sbx, err := b.Create(context.Background(), sandbox.Spec{Limits: sandbox.Limits{Memory: 256 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	s := sbx.(*Sandbox)
	t.Cleanup(func() { s.Close() })
	execText(t, s, "import decimal, random, os\nx = 41\nopen('kept.txt', 'w').write('kept')\nos.makedirs('sub', exist_ok=True)\nos.chdir('sub')\nrandom.seed(7)\n1")
	return s
}

// TestSnapshot saves a running sandbox holding Python state, a module, a
// file, a second code context and a random generator's state; the source
// goes on. A second backend (a restarted server) makes two sandboxes of
// the snapshot: each has the state as it was saved, its own host user,
// and the source's later changes are in none of them; by default their
// random futures differ. A snapshot made on another kernel is refused,
// saying so.
func TestSnapshot(t *testing.T) {
	bin := requireCRIU(t)
	s := stateSource(t, bin, snapCgroupParent, snapUIDBase)
	ctx := context.Background()
	cc, err := s.CreateContext("python", "")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := s.Execute(ctx, sandbox.ExecRequest{Code: "y = 'other'", Context: cc.ID}, nil); err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("%+v %v", res, err)
	}
	if err := s.SnapshotSupported(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	start := time.Now()
	size, err := s.SaveSnapshot(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: %d KiB, saved in %v", size>>10, time.Since(start).Round(time.Millisecond))
	// Its pages are not packed: a snapshot is made to start sandboxes
	// fast (a paused sandbox kept on disk is packed: TestReleasePaused).
	if packed, _ := filepath.Glob(filepath.Join(dir, "images", "pages-*.img.zst")); len(packed) != 0 {
		t.Fatalf("a snapshot's pages are packed: %v", packed)
	}
	if _, err := s.SaveSnapshot(ctx, dir); err == nil {
		t.Fatal("a snapshot over an existing one")
	}
	srcGroup := s.cg.Path() + "/"
	// The source goes on, and what it does after is not in the snapshot.
	execText(t, s, "x += 1\nopen('/workspace/later.txt', 'w').write('later')\nx")
	s.Close()

	b2 := pauseBackend(t, snapCgroupParent+"-2", snapUIDBase+8<<16)
	b2.criuBin = bin
	var owners []uint32
	var randoms []string
	for i := range 2 {
		start := time.Now()
		got, err := b2.CreateFromSnapshot(ctx, dir, sandbox.FromSnapshot{Tenant: ""})
		if err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
		t.Logf("sandbox %d of the snapshot in %v", i, time.Since(start).Round(time.Millisecond))
		c := got.(*Sandbox)
		defer c.Close()
		if v := execText(t, c, "x, decimal.Decimal('1.5'), open('/workspace/kept.txt').read(), os.getcwd(), os.path.exists('/workspace/later.txt')"); v != "(41, Decimal('1.5'), 'kept', '/workspace/sub', False)" {
			t.Fatalf("copy %d: %s", i, v)
		}
		res, err := c.Execute(ctx, sandbox.ExecRequest{Code: "y", Context: cc.ID}, nil)
		if err != nil || res.Status != sandbox.StatusOK || len(res.Results) == 0 || res.Results[0].Text != "'other'" {
			t.Fatalf("copy %d: the second context: %+v %v", i, res, err)
		}
		// init holds no file of the source's cgroup (gone), only its own.
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", c.init.pid))
		for _, fd := range fds {
			l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", c.init.pid, fd.Name()))
			if strings.Contains(l, srcGroup) {
				t.Fatalf("copy %d: init holds %s, of the source's cgroup", i, l)
			}
		}
		owners = append(owners, c.owner.First)
		randoms = append(randoms, execText(t, c, "random.random()"))
	}
	if owners[0] == owners[1] || owners[0] == s.owner.First {
		t.Fatalf("host users: source %d, copies %v", s.owner.First, owners)
	}
	if randoms[0] == randoms[1] {
		t.Fatalf("the copies share a random future: %v", randoms)
	}

	// A snapshot of another kernel.
	m, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	json.Unmarshal(m, &doc)
	doc["kernel"] = "2.6.32-other"
	m, _ = json.Marshal(doc)
	os.WriteFile(filepath.Join(dir, "manifest.json"), m, 0o600)
	if _, err := b2.CreateFromSnapshot(ctx, dir, sandbox.FromSnapshot{}); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("a snapshot of another kernel: %v", err)
	}
}

// TestPersistPaused writes a paused sandbox down; a second backend (a
// restarted server) opens it paused, holding nothing: calls and files say
// it is paused; its resume brings back its variables, module, files,
// working directory and random generator's state.
func TestPersistPaused(t *testing.T) {
	bin := requireCRIU(t)
	s := stateSource(t, bin, snapCgroupParent+"-p", snapUIDBase+24<<16)
	ctx := context.Background()
	if _, err := s.PersistPaused(ctx, filepath.Join(t.TempDir(), "early")); err == nil {
		t.Fatal("a running sandbox persisted")
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "paused")
	start := time.Now()
	size, err := s.PersistPaused(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("persisted: %d KiB in %v", size>>10, time.Since(start).Round(time.Millisecond))
	// The sandbox's own resume does not need it.
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	want := execText(t, s, "x, open('/workspace/kept.txt').read(), os.getcwd(), random.random()")
	s.Close()

	b2 := pauseBackend(t, snapCgroupParent+"-p2", snapUIDBase+32<<16)
	b2.criuBin = bin
	got, err := b2.OpenPaused(ctx, dir, sandbox.FromSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	o := got.(*Sandbox)
	defer o.Close()
	if !o.Paused() || o.PauseSupported() != nil {
		t.Fatalf("opened: paused %v, %v", o.Paused(), o.PauseSupported())
	}
	if _, err := o.Execute(ctx, sandbox.ExecRequest{Code: "x"}, nil); !errors.Is(err, sandbox.ErrPaused) {
		t.Fatalf("an execution in an opened sandbox: %v", err)
	}
	if _, err := o.Workspace().List(10); !errors.Is(err, sandbox.ErrPaused) {
		t.Fatalf("the files of an opened sandbox: %v", err)
	}
	if _, err := o.Usage(); err == nil {
		t.Fatal("an opened sandbox has a cgroup")
	}
	t.Logf("resumed from disk in %v", testutil.Resume(t, o).Round(time.Millisecond))
	if v := execText(t, o, "x, open('/workspace/kept.txt').read(), os.getcwd(), random.random()"); v != want {
		t.Fatalf("resumed from disk: %s, want %s", v, want)
	}
	if ws, err := o.Workspace().List(10); err != nil || len(ws) == 0 {
		t.Fatalf("the files after the resume: %v %v", ws, err)
	}
	// It pauses and resumes as any sandbox.
	pauseResume(t, o)
	if v := execText(t, o, "x + 1"); v != "42" {
		t.Fatalf("after a second pause: %s", v)
	}
}

// TestReleasePaused: a paused sandbox written down (PersistPaused) and
// released holds nothing of the host any more (host user, cgroup,
// checkpoint, files' memory), its pages are packed on disk, and its
// resume brings it back from that directory as it was, in a host user
// and cgroup of its own; it then pauses and resumes again. A sandbox
// whose commands run is not released.
func TestReleasePaused(t *testing.T) {
	bin := requireCRIU(t)
	s := stateSource(t, bin, snapCgroupParent+"-r", snapUIDBase+40<<16)
	ctx := context.Background()
	want := execText(t, s, "x, open('/workspace/kept.txt').read(), os.getcwd(), random.random()")
	execText(t, s, "random.seed(7)\n1")
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "paused")
	if _, err := s.PersistPaused(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if packed, _ := filepath.Glob(filepath.Join(dir, "images", "pages-*.img.zst")); len(packed) == 0 {
		t.Fatal("a kept paused sandbox's pages are not packed")
	}
	group := filepath.Join("/sys/fs/cgroup/memory", s.cg.Path())
	if _, err := os.Stat(group); err != nil {
		t.Skipf("no memory cgroup at %s: %v", group, err)
	}
	checkpoints := filepath.Join(s.b.cfg.CheckpointDir, s.id)
	_, _, _, inUse, _ := s.b.UIDPool()
	if err := s.ReleasePaused(dir); err != nil {
		t.Fatal(err)
	}
	_, _, _, released, _ := s.b.UIDPool()
	if released != inUse-1 {
		t.Errorf("host users in use: %d before the release, %d after", inUse, released)
	}
	if _, err := os.Stat(group); !os.IsNotExist(err) {
		t.Errorf("the released sandbox's cgroup %s: %v", group, err)
	}
	if _, err := os.Stat(checkpoints); !os.IsNotExist(err) {
		t.Errorf("the released sandbox's checkpoints %s: %v", checkpoints, err)
	}
	if _, err := s.Workspace().List(10); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("the files of a released sandbox: %v", err)
	}
	if !s.Paused() {
		t.Fatal("a released sandbox is not paused")
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := execText(t, s, "x, open('/workspace/kept.txt').read(), os.getcwd(), random.random()"); got != want {
		t.Fatalf("resumed after its release: %s, want %s", got, want)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", s.cg.Path())); err != nil {
		t.Fatalf("the resumed sandbox's cgroup: %v", err)
	}
	pauseResume(t, s)
	if v := execText(t, s, "x + 1"); v != "42" {
		t.Fatalf("after a second pause: %s", v)
	}

	// A command that runs across the pause keeps the sandbox in memory.
	if _, err := s.Start(ctx, sandbox.Command{Argv: []string{"sleep", "30"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	dir2 := filepath.Join(t.TempDir(), "paused2")
	if _, err := s.PersistPaused(ctx, dir2); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleasePaused(dir2); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("the release of a sandbox whose command runs: %v", err)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
}

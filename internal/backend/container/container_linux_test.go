package container

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// newBackend is a backend of rt whose state and checkpoints are in a
// directory of the test's. As root, its sandboxes' disks are tmpfs
// mounts, as in a server; otherwise (the fast tier) a disk is a plain
// directory, and the sandbox user is the test's.
func newBackend(t *testing.T, rt Runtime) *Backend {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{Runtime: rt, StateDir: filepath.Join(dir, "state"), CheckpointDir: filepath.Join(dir, "checkpoints"),
		UID: 1000, GID: 1000}
	if os.Geteuid() != 0 {
		cfg.UID, cfg.GID = os.Getuid(), os.Getgid()
		mount, unmount := mountDisk, unmountDisk
		mountDisk = func(string, string) error { return nil }
		unmountDisk = func(string) error { return nil }
		t.Cleanup(func() { mountDisk, unmountDisk = mount, unmount })
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// smallSpec fits any test machine: a pause checks that the checkpoint
// disk has room for the memory limit.
var smallSpec = sandbox.Spec{Limits: sandbox.Limits{Memory: 64 << 20, Disk: 16 << 20}}

// create makes a sandbox of b.
func create(t *testing.T, b *Backend) *Sandbox {
	t.Helper()
	sb, err := b.Create(context.Background(), smallSpec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return sb.(*Sandbox)
}

// started is a backend of rt and a sandbox of it that holds x = 41 and
// the file notes.txt ("kept").
func started(t *testing.T, rt Runtime) (*Backend, *Sandbox) {
	t.Helper()
	b := newBackend(t, rt)
	s := create(t, b)
	run(t, s, "x = 41")
	writeFile(t, s, "notes.txt", "kept")
	return b, s
}

// run executes code in s and returns its main result's text, or the name
// of its error.
func run(t *testing.T, s sandbox.Sandbox, code string) string {
	t.Helper()
	res, err := s.Execute(context.Background(), sandbox.ExecRequest{Code: code}, nil)
	if err != nil {
		t.Fatalf("%q: %v", code, err)
	}
	if res.Error != nil {
		return res.Error.Name
	}
	if len(res.Results) == 0 {
		return ""
	}
	return res.Results[0].Text
}

func writeFile(t *testing.T, s sandbox.Sandbox, name, body string) {
	t.Helper()
	if err := s.Workspace().WriteFile(name, strings.NewReader(body), 1<<20); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, s sandbox.Sandbox, name string) string {
	t.Helper()
	f, _, err := s.Workspace().OpenFile(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// entries lists dir's entries' names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// mountedUnder lists the mounts of this process below dir; none without
// root, whose sandboxes' disks are not mounts.
func mountedUnder(dir string) []string {
	var out []string
	for _, m := range testutil.Mounts() {
		if strings.HasPrefix(m, dir+"/") {
			out = append(out, m)
		}
	}
	return out
}

// disks is how many sandboxes' disks are mounted below dir: n as root,
// none otherwise.
func disks(n int) int {
	if os.Geteuid() != 0 {
		return 0
	}
	return n
}

// egressStub is a network policy's proxy that serves nothing.
type egressStub struct{}

func (egressStub) Serve(l net.Listener) error { return l.Close() }
func (egressStub) ServeConn(c net.Conn)       { c.Close() }
func (egressStub) Close() error               { return nil }

// A container backend has no way out and mounts no volume: a spec that
// asks for either is refused before anything is made.
func TestCreateRefusesWhatItCannotGive(t *testing.T) {
	b := newBackend(t, newFakeRuntime())
	for what, spec := range map[string]sandbox.Spec{
		"network access": {Egress: egressStub{}},
		"a volume": {Volumes: []sandbox.VolumeMount{{Path: "/mnt/data", Name: "data",
			Mount: func() (int, error) { return -1, errors.New("not mounted") }}}},
	} {
		if _, err := b.Create(context.Background(), spec); !errors.Is(err, sandbox.ErrUnsupported) ||
			!strings.Contains(err.Error(), "fake backend") {
			t.Errorf("%s: %v", what, err)
		}
	}
	if _, err := b.Create(context.Background(), sandbox.Spec{Python: "python3"}); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("a relative python: %v", err)
	}
	if names := entries(t, b.cfg.StateDir); len(names) != 0 {
		t.Errorf("a refused spec left %v", names)
	}
}

// A sandbox is configured, runs code through its agent, keeps files on
// its disk, and leaves nothing once closed.
func TestCreateRunsCodeAndCloses(t *testing.T) {
	rt := newFakeRuntime()
	b := newBackend(t, rt)
	s := create(t, b)
	cfg := <-rt.configs
	if cfg.Python != sandbox.DefaultPython || cfg.Workspace != "/workspace" || cfg.UID != b.cfg.UID ||
		!slices.Contains(cfg.RunnerArgs, RunnerDir+"/"+runner.ScriptName) || !slices.Contains(cfg.RunnerArgs, "--persistent") {
		t.Errorf("the agent's configuration: %+v", cfg)
	}
	if got := run(t, s, "x = 41"); got != "" {
		t.Errorf("an assignment gave %q", got)
	}
	if got := run(t, s, "x"); got != "41" {
		t.Errorf("x = %q, want 41", got)
	}
	if got := run(t, s, "y"); got != "NameError" {
		t.Errorf("an unknown name: %q", got)
	}
	writeFile(t, s, "notes.txt", "kept")
	if got := readFile(t, s, "notes.txt"); got != "kept" {
		t.Errorf("the workspace's file: %q", got)
	}
	if fi, err := os.Stat(filepath.Join(s.disk.Workspace, "notes.txt")); err != nil || fi.Size() != 4 {
		t.Errorf("the file on the sandbox's disk: %v %v", fi, err)
	}
	if m := mountedUnder(b.cfg.StateDir); len(m) != disks(1) {
		t.Errorf("mounts of the sandbox: %v, want its disk", m)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if names := entries(t, b.cfg.StateDir); len(names) != 0 {
		t.Errorf("a closed sandbox left %v", names)
	}
	if m := mountedUnder(b.cfg.StateDir); len(m) != 0 {
		t.Errorf("a closed sandbox left mounted %v", m)
	}
	if _, err := s.Execute(context.Background(), sandbox.ExecRequest{Code: "x"}, nil); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("an execution after Close: %v", err)
	}
}

// A persistent sandbox whose container dies gets a new one on the same
// disk: its files are kept, its state is not, and the result says so.
func TestDeadContainerIsReplacedKeepingFiles(t *testing.T) {
	rt := newFakeRuntime()
	_, s := started(t, rt)
	res, err := s.Execute(context.Background(), sandbox.ExecRequest{Code: "crash"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.StateLost {
		t.Errorf("the crash's result does not say the state is lost: %+v", res)
	}
	if got := run(t, s, "x"); got != "NameError" {
		t.Errorf("x in the new container: %q", got)
	}
	if got := readFile(t, s, "notes.txt"); got != "kept" {
		t.Errorf("the file after the new container: %q", got)
	}
	if n := rt.launches.Load(); n != 2 {
		t.Errorf("%d containers launched, want 2", n)
	}
}

// Sweep removes what a crashed supervisor left: sandboxes' state
// directories and paused sandboxes' checkpoints.
func TestSweepRemovesLeftovers(t *testing.T) {
	b := newBackend(t, newFakeRuntime())
	for _, d := range []string{filepath.Join(b.cfg.StateDir, "old1", "disk"), filepath.Join(b.cfg.CheckpointDir, "old2", "1")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	got, err := b.Sweep()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"checkpoint old2", "old1"}) {
		t.Errorf("swept %q", got)
	}
	if n := len(entries(t, b.cfg.StateDir)) + len(entries(t, b.cfg.CheckpointDir)); n != 0 {
		t.Errorf("%d entries left", n)
	}
}

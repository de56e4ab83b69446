package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// filesBackend makes sandboxes of a host directory each, a root with a
// home in it, whose files are reached through workspace.Dirs as the
// native backend's are (sandbox.FileSystem): what a pause without memory
// keeps is tested here without namespaces. As root, the sandbox's root
// and user are two host users, as they are in a native sandbox. Its
// sandboxes are no Pausers: a pause without memory needs none.
type filesBackend struct {
	dir              string
	rootUID, userUID int // -1: the caller's
	made             chan *filesSandbox
	boots            *atomic.Int64
}

func newFilesBackend(t *testing.T) filesBackend {
	b := filesBackend{dir: t.TempDir(), rootUID: -1, userUID: -1, made: make(chan *filesSandbox, 16),
		boots: new(atomic.Int64)}
	if os.Geteuid() == 0 {
		b.rootUID, b.userUID = 54321, 54322
	}
	return b
}

func (filesBackend) Name() string { return "files" }

func (b filesBackend) Create(_ context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	dir, err := os.MkdirTemp(b.dir, "sb")
	if err != nil {
		return nil, err
	}
	// A new sandbox's own files: root's /etc and /tmp, the user's home.
	for _, p := range []string{"etc", "tmp", "home"} {
		if err := os.Mkdir(filepath.Join(dir, p), 0o755); err != nil {
			return nil, err
		}
	}
	os.WriteFile(filepath.Join(dir, "etc", "motd"), []byte("welcome\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0\n"), 0o644)
	os.Chmod(dir, 0o755)
	os.Chmod(filepath.Join(dir, "tmp"), 0o777)
	chown := func(uid int, paths ...string) {
		for _, p := range paths {
			os.Lchown(filepath.Join(dir, p), uid, uid)
		}
	}
	chown(b.rootUID, ".", "etc", "tmp", "etc/motd", "etc/passwd")
	chown(b.userUID, "home")
	s := &filesSandbox{dir: dir, spec: spec, boot: b.boots.Add(1)}
	open := func(p string, uid int) *workspace.Dir {
		d, err := workspace.Open(filepath.Join(dir, p), uid, uid)
		if err != nil {
			panic(err)
		}
		return d
	}
	s.root, s.user, s.home = open(".", b.rootUID), open(".", b.userUID), open("home", b.userUID)
	b.made <- s
	return s, nil
}

type filesSandbox struct {
	idleSandbox
	dir              string
	spec             sandbox.Spec
	boot             int64 // which sandbox the backend made: a new one at each start
	root, user, home *workspace.Dir
}

var _ sandbox.FileSystem = (*filesSandbox)(nil)

func (s *filesSandbox) Workspace() sandbox.Workspace { return s.home }

func (s *filesSandbox) Root(user string) (sandbox.Workspace, error) {
	if user == sandbox.UserRoot {
		return s.root, nil
	}
	return s.user, nil
}

func (s *filesSandbox) Execute(context.Context, sandbox.ExecRequest, sandbox.Sink) (*sandbox.Result, error) {
	return &sandbox.Result{Status: sandbox.StatusOK, Stdout: fmt.Sprint("boot ", s.boot)}, nil
}

// Close frees the sandbox's files, as a native sandbox's end frees its
// memory: nothing of them is left to a resume but what was kept.
func (s *filesSandbox) Close() error {
	s.idleSandbox.Close()
	for _, d := range []*workspace.Dir{s.root, s.user, s.home} {
		d.Close()
	}
	return os.RemoveAll(s.dir)
}

func filesService(t *testing.T, b filesBackend, paused string, now func() time.Time) *Service {
	t.Helper()
	return New(Config{Backend: b, PausedDir: paused, SnapshotKey: bytes.Repeat([]byte{1}, snapshot.KeySize), Now: now})
}

// writeTree gives the sandbox files of every kind a pause without memory
// keeps, and some it does not, as its root and its user make them.
func writeTree(t *testing.T, sb *filesSandbox) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	u, r := sb.user, sb.root
	must(u.WriteFile("home/notes.txt", strings.NewReader("kept"), 100))
	must(u.Chmod("home/notes.txt", 0o640))
	must(u.SetFileMetadata("home/notes.txt", map[string]string{"k": "v"}))
	must(u.WriteFile("home/bin/run.sh", strings.NewReader("#!/bin/sh\n"), 100))
	must(u.Chmod("home/bin/run.sh", 0o755))
	must(u.Symlink("notes.txt", "home/link"))
	must(u.Symlink("/usr/bin/python3", "home/bin/python"))
	must(u.Mkdir("home/empty"))
	must(u.Chmod("home/empty", 0o700))
	must(u.WriteFile("tmp/cache/x", strings.NewReader("in /tmp"), 100))
	must(r.WriteFile("etc/passwd", strings.NewReader("root:x:0:0\nuser:x:1000:1000\n"), 100))
	// A file of the new sandbox's own that this one made a directory.
	must(r.Remove("etc/motd"))
	must(r.Mkdir("etc/motd"))
	must(r.WriteFile("etc/motd/today", strings.NewReader("hi"), 100))
	// A directory of root's the user may not write in.
	must(r.Mkdir("opt/app"))
	must(r.Chmod("opt/app", 0o755))
	must(unix.Mkfifo(filepath.Join(sb.dir, "home", "fifo"), 0o644)) // not kept
}

// checkTree checks what writeTree wrote, in a new sandbox.
func checkTree(t *testing.T, b filesBackend, sb *filesSandbox) {
	t.Helper()
	type want struct {
		mode    os.FileMode
		content string // a file's; a link's target
		uid     int
	}
	for name, w := range map[string]want{
		"home/notes.txt":   {0o640, "kept", b.userUID},
		"home/bin":         {os.ModeDir | 0o755, "", b.userUID},
		"home/bin/run.sh":  {0o755, "#!/bin/sh\n", b.userUID},
		"home/link":        {os.ModeSymlink, "notes.txt", b.userUID},
		"home/bin/python":  {os.ModeSymlink, "/usr/bin/python3", b.userUID},
		"home/empty":       {os.ModeDir | 0o700, "", b.userUID},
		"tmp/cache/x":      {0o644, "in /tmp", b.userUID},
		"etc/passwd":       {0o644, "root:x:0:0\nuser:x:1000:1000\n", b.rootUID},
		"etc/motd":         {os.ModeDir | 0o755, "", b.rootUID},
		"etc/motd/today":   {0o644, "hi", b.rootUID},
		"opt/app":          {os.ModeDir | 0o755, "", b.rootUID},
		"home/missing.txt": {},
	} {
		p := filepath.Join(sb.dir, name)
		fi, err := os.Lstat(p)
		if w == (want{}) {
			if !os.IsNotExist(err) {
				t.Errorf("%s: %v, want nothing there", name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		mode := fi.Mode() & (os.ModeType | os.ModePerm)
		if fi.Mode()&os.ModeSymlink != 0 {
			mode = os.ModeSymlink
		}
		if mode != w.mode {
			t.Errorf("%s: mode %v, want %v", name, mode, w.mode)
		}
		var got string
		switch {
		case mode == os.ModeSymlink:
			got, _ = os.Readlink(p)
		case mode.IsRegular():
			buf, _ := os.ReadFile(p)
			got = string(buf)
		}
		if got != w.content {
			t.Errorf("%s: %q, want %q", name, got, w.content)
		}
		if uid := int(fi.Sys().(*syscall.Stat_t).Uid); w.uid >= 0 && uid != w.uid {
			t.Errorf("%s: owned by %d, want %d", name, uid, w.uid)
		}
	}
	if md, err := sb.user.FileMetadata("home/notes.txt"); err != nil || !maps.Equal(md, map[string]string{"k": "v"}) {
		t.Errorf("home/notes.txt's metadata: %v (%v)", md, err)
	}
	if _, err := os.Lstat(filepath.Join(sb.dir, "home", "fifo")); !os.IsNotExist(err) {
		t.Errorf("a FIFO was kept: %v", err)
	}
}

// A pause without memory keeps the sandbox's files on the server's disk
// and ends everything else: the sandbox is closed, every call says it is
// paused, its memory is free. A resume makes a new sandbox of the same
// spec, under the same id, with the files as they were: contents, modes,
// links, metadata, and whose they are. It is kept across a restart of
// the server as any paused sandbox is, and needs no pausable sandbox.
func TestPauseFiles(t *testing.T) {
	b := newFilesBackend(t)
	paused := t.TempDir()
	ctx := context.Background()
	svc := filesService(t, b, paused, nil)
	info, err := svc.Create(ctx, CreateRequest{Owner: "o", Env: map[string]string{"FOO": "bar"}, Home: sandbox.HomeUser,
		IDEnv: []string{"SANDBOX_ID"}})
	if err != nil {
		t.Fatal(err)
	}
	first := <-b.made
	writeTree(t, first)
	if _, err := svc.Pause(ctx, "o", info.ID); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Fatalf("a pause with memory of a sandbox that cannot: %v", err)
	}
	got, err := svc.PauseFiles(ctx, "o", info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != "paused" {
		t.Fatalf("state %q after a pause without memory", got.State)
	}
	if _, err := os.Stat(first.dir); !os.IsNotExist(err) {
		t.Fatalf("the paused sandbox was not closed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(paused, info.ID, snapshot.SignatureFile)); err != nil {
		t.Fatalf("kept on disk: %v", err)
	}
	for what, err := range map[string]error{
		"pause": func() error { _, err := svc.Pause(ctx, "o", info.ID); return err }(),
		"again": func() error { _, err := svc.PauseFiles(ctx, "o", info.ID); return err }(),
		"execute": func() error {
			_, err := svc.Execute(ctx, "o", info.ID, sandbox.ExecRequest{Code: "1"}, nil)
			return err
		}(),
		"fork":    func() error { _, err := svc.Fork(ctx, "o", info.ID, 1, sandbox.ForkOptions{}); return err }(),
		"context": func() error { _, err := svc.CreateContext("o", info.ID, "python", ""); return err }(),
		"port": func() error {
			_, d, err := svc.portDialer("o", info.ID, 8000)
			if err == nil {
				_, err = d.DialPort(ctx, 8000)
			}
			return err
		}(),
	} {
		if !errors.Is(err, sandbox.ErrPaused) {
			t.Errorf("%s of a sandbox paused without memory: %v, want it paused", what, err)
		}
	}
	ws, done, err := svc.Workspace("o", info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.OpenFile("notes.txt"); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("a file of the paused sandbox: %v, want it paused", err)
	}
	done()

	// A restart of the server: it lists the sandbox again, paused.
	svc.Close()
	svc = filesService(t, b, paused, nil)
	defer svc.Close()
	if got, err := svc.Info("o", info.ID); err != nil || got.State != "paused" {
		t.Fatalf("after a restart: %+v, %v", got, err)
	}
	if _, err := svc.Resume(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	second := <-b.made
	if second.boot == first.boot {
		t.Fatal("the resume did not make a new sandbox")
	}
	if _, hasID := second.spec.Env["SANDBOX_ID"]; second.spec.Env["FOO"] != "bar" || hasID || second.spec.Home != sandbox.HomeUser {
		t.Errorf("the new sandbox's spec: %+v", second.spec)
	}
	checkTree(t, b, second)
	res, err := svc.Execute(ctx, "o", info.ID, sandbox.ExecRequest{Code: "1"}, nil)
	if err != nil || res.Stdout != fmt.Sprint("boot ", second.boot) {
		t.Fatalf("an execution after the resume: %+v, %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(paused, info.ID)); !os.IsNotExist(err) {
		t.Errorf("what was kept is still there after the resume: %v", err)
	}
	// Paused and resumed again, in the same server.
	if _, err := svc.PauseFiles(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Resume(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	checkTree(t, b, <-b.made)
	// What was kept gone from the server's disk: the resume fails as the
	// server's own failure (no missing file of the client's), and the
	// sandbox stays paused.
	if _, err := svc.PauseFiles(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(paused, info.ID, "data", filesArchive))
	if _, err := svc.Resume(ctx, "o", info.ID); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a resume without its files: %v", err)
	}
	if got, _ := svc.Info("o", info.ID); got.State != "paused" {
		t.Fatalf("state %q after a failed resume", got.State)
	}
	// A delete of a paused one forgets what was kept.
	if err := svc.Delete("o", info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(paused, info.ID)); !os.IsNotExist(err) {
		t.Errorf("what was kept of a deleted sandbox is still there: %v", err)
	}
}

// The timeout of a sandbox made with PauseFilesOnly pauses it without its
// memory, and a call resumes it where it was made with AutoResume.
func TestPauseFilesOnTimeout(t *testing.T) {
	b := newFilesBackend(t)
	c := newClock()
	svc := filesService(t, b, t.TempDir(), c.now)
	defer svc.Close()
	ctx := context.Background()
	info, err := svc.Create(ctx, CreateRequest{Owner: "o", Idle: time.Minute, OnTimeout: OnTimeoutPause,
		PauseFilesOnly: true, AutoResume: true})
	if err != nil {
		t.Fatal(err)
	}
	first := <-b.made
	if first.spec.Pausable {
		t.Error("a sandbox whose timeout pauses it without memory was made pausable")
	}
	if err := first.user.WriteFile("home/f", strings.NewReader("x"), 10); err != nil {
		t.Fatal(err)
	}
	c.advance(2 * time.Minute)
	waitState(t, svc, info.ID, "paused")
	if _, err := os.Stat(first.dir); !os.IsNotExist(err) {
		t.Fatalf("the timeout did not close the sandbox: %v", err)
	}
	ws, done, err := svc.Workspace("o", info.ID) // resumes it
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	r, _, err := ws.OpenFile("f")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if buf, _ := io.ReadAll(r); string(buf) != "x" {
		t.Fatalf("after the resume: %q", buf)
	}
}

// Where a sandbox's files cannot be kept so, a pause without memory, and
// a sandbox asking its timeout for one, are refused, saying why; the
// sandbox runs on.
func TestPauseFilesRefused(t *testing.T) {
	ctx := context.Background()
	noViews := New(Config{Backend: newFakeBackend(), PausedDir: t.TempDir(), SnapshotKey: bytes.Repeat([]byte{1}, snapshot.KeySize)})
	defer noViews.Close()
	noDisk := New(Config{Backend: newFilesBackend(t)})
	defer noDisk.Close()
	for name, svc := range map[string]*Service{"a backend whose files cannot be written back": noViews,
		"no data directory": noDisk} {
		info, err := svc.Create(ctx, CreateRequest{Owner: "o"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.PauseFiles(ctx, "o", info.ID); !errors.Is(err, sandbox.ErrUnsupported) ||
			!strings.Contains(err.Error(), "keepMemory: false") {
			t.Errorf("%s: %v", name, err)
		}
		if got, _ := svc.Info("o", info.ID); got.State == "paused" {
			t.Errorf("%s: paused all the same", name)
		}
		if _, err := svc.Create(ctx, CreateRequest{Owner: "o", OnTimeout: OnTimeoutPause, PauseFilesOnly: true}); !errors.Is(err, sandbox.ErrUnsupported) {
			t.Errorf("%s: a timeout that pauses without memory: %v", name, err)
		}
	}

	// A tree deeper than is kept: refused once the walk sees it, and the
	// sandbox runs on, the same one.
	b := newFilesBackend(t)
	svc := filesService(t, b, t.TempDir(), nil)
	defer svc.Close()
	info, err := svc.Create(ctx, CreateRequest{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	sb := <-b.made
	if err := sb.user.Mkdir("home" + strings.Repeat("/d", maxFilesDepth)); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PauseFiles(ctx, "o", info.ID); !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "nested") {
		t.Fatalf("a tree too deep: %v", err)
	}
	res, err := svc.Execute(ctx, "o", info.ID, sandbox.ExecRequest{Code: "1"}, nil)
	if err != nil || res.Stdout != fmt.Sprint("boot ", sb.boot) {
		t.Fatalf("after a refused pause: %+v, %v", res, err)
	}
}

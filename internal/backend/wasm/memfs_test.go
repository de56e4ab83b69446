package wasm

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// These tests need no interpreter: they drive the file systems the way
// wazero's WASI functions do.

const (
	oCreate = experimentalsys.O_CREAT | experimentalsys.O_RDWR
)

func mustOpen(t *testing.T, m experimentalsys.FS, p string, flag experimentalsys.Oflag) experimentalsys.File {
	t.Helper()
	f, errno := m.OpenFile(p, flag, 0o644)
	if errno != 0 {
		t.Fatalf("open %s: %v", p, errno)
	}
	return f
}

func TestMemFSDiskLimit(t *testing.T) {
	m := newMemFS(1 << 20)
	full := 0
	m.onFull = func() { full++ }
	f := mustOpen(t, m, "a", oCreate)
	if _, errno := f.Write(make([]byte, 1<<20)); errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := f.Write([]byte{1}); errno != experimentalsys.EIO || full != 1 {
		t.Fatalf("write past the limit: %v (full %d)", errno, full)
	}
	// Sparse files cost their apparent size.
	g := mustOpen(t, m, "b", oCreate)
	if errno := g.Truncate(1 << 30); errno != experimentalsys.EIO {
		t.Fatalf("truncate up: %v", errno)
	}
	if _, errno := g.Pwrite([]byte{1}, 1<<40); errno != experimentalsys.EIO {
		t.Fatalf("pwrite far: %v", errno)
	}
	// An unlinked file costs its size until it is closed.
	if errno := m.Unlink("a"); errno != 0 {
		t.Fatal(errno)
	}
	if _, errno := g.Write([]byte{1}); errno != experimentalsys.EIO {
		t.Fatalf("write while the unlinked file is open: %v", errno)
	}
	f.Close()
	if _, errno := g.Write(make([]byte, 1<<19)); errno != 0 {
		t.Fatalf("write after the unlinked file closed: %v", errno)
	}
	// Hard links share their data: no amplification.
	for i := range 40 {
		if errno := m.Link("b", "b"+strings.Repeat("x", i+1)); errno != 0 {
			t.Fatal(errno)
		}
	}
	if m.used != 1<<19 {
		t.Fatalf("used %d after links, want %d", m.used, 1<<19)
	}
}

func TestMemFSInodeLimit(t *testing.T) {
	m := newMemFS(1 << 20) // 1024 inodes
	var errno experimentalsys.Errno
	n := 0
	for ; n < 5000; n++ {
		if errno = m.Mkdir(fmt.Sprint("d", n), 0o755); errno != 0 {
			break
		}
	}
	if errno != experimentalsys.EIO || n != 1024 {
		t.Fatalf("mkdir stopped at %d with %v", n, errno)
	}
}

func TestMemFSOperations(t *testing.T) {
	m := newMemFS(1 << 20)
	if errno := m.Mkdir("d", 0o755); errno != 0 {
		t.Fatal(errno)
	}
	f := mustOpen(t, m, "d/f", oCreate)
	f.Write([]byte("hello"))
	if _, errno := m.OpenFile("d/f", oCreate|experimentalsys.O_EXCL, 0o644); errno != experimentalsys.EEXIST {
		t.Fatalf("O_EXCL: %v", errno)
	}
	if errno := m.Rename("d/f", "g"); errno != 0 {
		t.Fatal(errno)
	}
	buf := make([]byte, 10)
	if n, _ := f.Pread(buf, 0); string(buf[:n]) != "hello" {
		t.Fatalf("read %q through the renamed file", buf[:n])
	}
	if errno := m.Rename("d", "d/sub"); errno != experimentalsys.EINVAL {
		t.Fatalf("rename into itself: %v", errno)
	}
	if errno := m.Rmdir("d"); errno != 0 {
		t.Fatal(errno)
	}
	if errno := m.Symlink("/etc/passwd", "link"); errno != experimentalsys.EPERM {
		t.Fatalf("symlink: %v", errno)
	}
	if _, errno := m.Stat("d/f"); errno != experimentalsys.ENOENT {
		t.Fatalf("stat removed: %v", errno)
	}
	if _, errno := m.OpenFile("g/x", oCreate, 0o644); errno != experimentalsys.ENOTDIR {
		t.Fatalf("create under a file: %v", errno)
	}
	if _, errno := m.OpenFile(strings.Repeat("n", 256), oCreate, 0o644); errno != experimentalsys.ENAMETOOLONG {
		t.Fatalf("long name: %v", errno)
	}
	d := mustOpen(t, m, "", experimentalsys.O_RDONLY)
	ents, errno := d.Readdir(-1)
	if errno != 0 || len(ents) != 1 || ents[0].Name != "g" {
		t.Fatalf("readdir: %v %v", ents, errno)
	}
}

func TestRootFSMounts(t *testing.T) {
	ws := newMemFS(1 << 20)
	skel := newMemFS(1 << 20)
	for _, d := range []string{"usr/local/lib", "workspace", "dev"} {
		if _, err := skel.mkdirAll(split(d)); err != nil {
			t.Fatal(err)
		}
	}
	skel.readOnly = true
	ch := newChannel()
	root := newRootFS(mount{"", skel}, mount{"workspace", ws}, mount{"dev", &devFS{channel: ch}})
	mustOpen(t, root, "workspace/a", oCreate).Close()
	if _, errno := ws.Stat("a"); errno != 0 {
		t.Fatalf("workspace/a not in the workspace: %v", errno)
	}
	for p, want := range map[string]experimentalsys.Errno{
		"evil": experimentalsys.EROFS, "usr/evil": experimentalsys.EROFS, "dev/evil": experimentalsys.EROFS,
	} {
		if _, errno := root.OpenFile(p, oCreate, 0o644); errno != want {
			t.Errorf("create %s: %v, want %v", p, errno, want)
		}
	}
	if errno := root.Rename("workspace/a", "usr/a"); errno != experimentalsys.EROFS {
		t.Fatalf("rename across mounts: %v", errno)
	}
	// The channel opens once.
	mustOpen(t, root, "dev/vivarium", experimentalsys.O_RDWR)
	if _, errno := root.OpenFile("dev/vivarium", experimentalsys.O_RDWR, 0); errno != experimentalsys.EACCES {
		t.Fatalf("second open of the channel: %v", errno)
	}
}

func TestWorkspaceAPI(t *testing.T) {
	m := newMemFS(1 << 20)
	w := &workspace{fs: m}
	if err := w.WriteFile("a/b.txt", strings.NewReader("data"), 100); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile("big", strings.NewReader(strings.Repeat("x", 200)), 100); !errors.Is(err, sandbox.ErrTooLarge) {
		t.Fatalf("over the per-file limit: %v", err)
	}
	if err := w.WriteFile("huge", strings.NewReader(strings.Repeat("x", 2<<20)), 4<<20); !errors.Is(err, sandbox.ErrTooLarge) {
		t.Fatalf("over the disk limit: %v", err)
	}
	for _, bad := range []string{"", "/etc/passwd", "../x", "a/../../x", "a\x00b", "."} {
		if err := w.WriteFile(bad, strings.NewReader("x"), 10); !errors.Is(err, sandbox.ErrBadPath) {
			t.Errorf("WriteFile(%q): %v", bad, err)
		}
	}
	if err := w.WriteFile("a/b.txt/c", strings.NewReader("x"), 10); !errors.Is(err, sandbox.ErrBadPath) {
		t.Fatalf("under a file: %v", err)
	}
	r, info, err := w.OpenFile("a/b.txt")
	if err != nil || info.Size != 4 {
		t.Fatal(info, err)
	}
	b, _ := io.ReadAll(r)
	if string(b) != "data" {
		t.Fatalf("read %q", b)
	}
	if _, _, err := w.OpenFile("a"); !errors.Is(err, sandbox.ErrBadPath) {
		t.Fatalf("open a directory: %v", err)
	}
	if _, err := w.Stat("nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat missing: %v", err)
	}
	ents, err := w.ReadDir("", 2)
	if err != nil || len(ents) != 2 || ents[0].Path != "a" || ents[1].Path != "a/b.txt" {
		t.Fatalf("readdir: %+v %v", ents, err)
	}
	if err := w.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if files, _ := w.List(10); len(files) != 0 || m.used != 0 || m.inodes != 0 {
		t.Fatalf("after remove: %v, used %d, inodes %d", files, m.used, m.inodes)
	}
}

// Copying out never writes through a link the out directory holds.
func TestCopyOutPlantedLinks(t *testing.T) {
	m := newMemFS(1 << 20)
	w := &workspace{fs: m}
	for _, name := range []string{"report.txt", "sub/x.txt", "ok/y.txt"} {
		if err := w.WriteFile(name, strings.NewReader("evil"), 100); err != nil {
			t.Fatal(err)
		}
	}
	host := t.TempDir()
	target := filepath.Join(host, "target")
	os.WriteFile(target, []byte("host"), 0o600)
	out := filepath.Join(t.TempDir(), "out")
	os.Mkdir(out, 0o755)
	os.Symlink(target, filepath.Join(out, "report.txt"))
	os.Symlink(host, filepath.Join(out, "sub"))
	copied, err := w.CopyOut(out, 100, 1000)
	if err == nil {
		t.Fatal("copying through the planted directory link reported nothing")
	}
	if len(copied) != 2 {
		t.Fatalf("copied %+v", copied)
	}
	if b, _ := os.ReadFile(target); string(b) != "host" {
		t.Fatalf("host target now %q", b)
	}
	if entries, _ := os.ReadDir(host); len(entries) != 1 {
		t.Fatalf("host directory holds %v", entries)
	}
	if fi, err := os.Lstat(filepath.Join(out, "report.txt")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("report.txt: %v %v", fi, err)
	}
}

func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"a", "a/b", "../a", "/a", "a//b", "./a", "a/./b/..", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		parts, err := cleanName(name)
		if err != nil {
			return
		}
		for _, p := range parts {
			if p == "" || p == "." || p == ".." || strings.Contains(p, "/") {
				t.Fatalf("%q cleaned to %q", name, parts)
			}
		}
	})
}

//go:build linux

package workspace

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func newDir(t *testing.T) (*Dir, string) {
	t.Helper()
	root := t.TempDir()
	d, err := Open(root, -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, root
}

func TestWriteAndRead(t *testing.T) {
	d, root := newDir(t)
	if err := d.WriteFile("a/b/c.txt", strings.NewReader("hello"), 100); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "a/b/c.txt"))
	if err != nil || string(b) != "hello" {
		t.Fatalf("got %q, %v", b, err)
	}
	r, info, err := d.OpenFile("a/b/c.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, _ := io.ReadAll(r)
	if string(got) != "hello" || info.Size != 5 || info.Path != "a/b/c.txt" {
		t.Fatalf("read %q, info %+v", got, info)
	}
	// Replacing keeps one file with the new content.
	if err := d.WriteFile("a/b/c.txt", strings.NewReader("bye"), 100); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "a/b/c.txt")); string(b) != "bye" {
		t.Fatalf("after replace: %q", b)
	}
	assertNoTempFiles(t, root)
}

func assertNoTempFiles(t *testing.T, root string) {
	t.Helper()
	filepath.Walk(root, func(p string, info fs.FileInfo, err error) error {
		if err == nil && strings.HasPrefix(info.Name(), ".vivarium-upload-") {
			t.Errorf("temporary file left behind: %s", p)
		}
		return nil
	})
}

func TestRejectsBadPaths(t *testing.T) {
	d, _ := newDir(t)
	for _, name := range []string{"", "/etc/passwd", "../x", "a/../../x", "a/..", ".", "x\x00y", strings.Repeat("a", 5000),
		strings.Repeat("a", 256), "a/" + strings.Repeat("b", 256) + "/c"} {
		err := d.WriteFile(name, strings.NewReader("x"), 10)
		if !errors.Is(err, sandbox.ErrBadPath) {
			t.Errorf("WriteFile(%q) = %v, want ErrBadPath", name, err)
		}
	}
}

func TestSymlinksNeverFollowed(t *testing.T) {
	d, root := newDir(t)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("s3cret"), 0o600)
	os.Symlink(outside, filepath.Join(root, "dirlink"))
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "filelink"))
	os.Symlink("/proc/self/root/etc", filepath.Join(root, "magic"))

	if err := d.WriteFile("dirlink/planted", strings.NewReader("x"), 10); err == nil {
		t.Error("wrote through a directory symlink")
	}
	if _, err := os.Stat(filepath.Join(outside, "planted")); err == nil {
		t.Error("file appeared outside the workspace")
	}
	for _, name := range []string{"filelink", "dirlink/secret", "magic/hostname"} {
		if r, _, err := d.OpenFile(name); err == nil {
			b, _ := io.ReadAll(r)
			r.Close()
			t.Errorf("OpenFile(%q) read %q through a link", name, b)
		}
	}
	// Writing over a link replaces the link itself, never its target.
	if err := d.WriteFile("filelink", strings.NewReader("new"), 10); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "s3cret" {
		t.Errorf("link target changed to %q", b)
	}
	if fi, _ := os.Lstat(filepath.Join(root, "filelink")); fi.Mode()&fs.ModeSymlink != 0 {
		t.Error("link still in place")
	}
}

func TestFIFOAndDevicesRefusedWithoutBlocking(t *testing.T) {
	d, root := newDir(t)
	if err := syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := d.OpenFile("fifo")
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, sandbox.ErrBadPath) {
			t.Errorf("FIFO: %v, want ErrBadPath", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("opening a FIFO blocked")
	}
	files, err := d.List(100)
	if err != nil || len(files) != 0 {
		t.Errorf("List = %v, %v; want no regular files", files, err)
	}
}

func TestSizeLimitLeavesNothing(t *testing.T) {
	d, root := newDir(t)
	err := d.WriteFile("big", strings.NewReader(strings.Repeat("x", 1000)), 999)
	if !errors.Is(err, sandbox.ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	if _, err := os.Stat(filepath.Join(root, "big")); err == nil {
		t.Error("oversized file left behind")
	}
	assertNoTempFiles(t, root)
}

func TestListAndCopyOut(t *testing.T) {
	d, root := newDir(t)
	os.MkdirAll(filepath.Join(root, "sub/deeper"), 0o755)
	os.WriteFile(filepath.Join(root, "plot.png"), []byte("png"), 0o644)
	os.WriteFile(filepath.Join(root, "sub/deeper/data.csv"), []byte("a,b\n"), 0o644)
	os.WriteFile(filepath.Join(root, "huge.bin"), make([]byte, 4096), 0o644)
	os.Symlink("/etc/passwd", filepath.Join(root, "passwd"))
	syscall.Mkfifo(filepath.Join(root, "pipe"), 0o644)

	files, err := d.List(100)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Path)
	}
	if got := strings.Join(names, ","); got != "huge.bin,plot.png,sub/deeper/data.csv" {
		t.Fatalf("List = %s", got)
	}

	out := filepath.Join(t.TempDir(), "out")
	copied, err := d.CopyOut(out, 1024, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(copied) != 2 {
		t.Fatalf("copied %+v, want plot.png and data.csv", copied)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "sub/deeper/data.csv")); string(b) != "a,b\n" {
		t.Errorf("data.csv = %q", b)
	}
	for _, skipped := range []string{"huge.bin", "passwd", "pipe"} {
		if _, err := os.Lstat(filepath.Join(out, skipped)); err == nil {
			t.Errorf("%s was copied", skipped)
		}
	}
}

func TestCopyOutDoesNotFollowLinksInDestination(t *testing.T) {
	d, root := newDir(t)
	os.MkdirAll(filepath.Join(root, "sub"), 0o755)
	os.WriteFile(filepath.Join(root, "sub/f"), []byte("x"), 0o644)
	out := t.TempDir()
	elsewhere := t.TempDir()
	os.Symlink(elsewhere, filepath.Join(out, "sub"))
	d.CopyOut(out, 100, 100)
	if _, err := os.Stat(filepath.Join(elsewhere, "f")); err == nil {
		t.Error("copy followed a symlink in the destination")
	}
}

func FuzzClean(f *testing.F) {
	for _, s := range []string{"a", "a/b", "../a", "/a", "a/./b", "a//b", ".", "..", "a/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		c, err := Clean(name)
		if err != nil {
			return
		}
		if c == "" || c == "." || strings.HasPrefix(c, "/") || strings.HasPrefix(c, "../") || c == ".." ||
			strings.Contains(c, "/../") || strings.ContainsRune(c, 0) {
			t.Fatalf("Clean(%q) = %q escapes", name, c)
		}
	})
}

// Files are created as the workspace's owner, with no more rights than the
// owner has, and the thread's identity is restored afterwards.
func TestWritesAsOwner(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	const owner = 54321
	if err := os.Chown(root, owner, owner); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "rootonly"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := Open(root, owner, owner)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteFile("sub/f.txt", strings.NewReader("x"), 10); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"sub", "sub/f.txt"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, p), &st); err != nil || st.Uid != owner || st.Gid != owner {
			t.Fatalf("%s: owner %d:%d (%v), want %d", p, st.Uid, st.Gid, err, owner)
		}
	}
	if err := d.WriteFile("rootonly/f.txt", strings.NewReader("x"), 10); !errors.Is(err, unix.EACCES) {
		t.Fatalf("write into a directory the owner cannot write: %v, want EACCES", err)
	}
	// This goroutine's thread (if it was reused) is root again.
	if err := os.WriteFile(filepath.Join(root, "rootonly", "g"), nil, 0o600); err != nil {
		t.Fatalf("identity not restored: %v", err)
	}
}

func TestReadDirStatRemove(t *testing.T) {
	d, root := newDir(t)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "victim"), []byte("keep"), 0o600)
	os.MkdirAll(filepath.Join(root, "a/b"), 0o755)
	os.WriteFile(filepath.Join(root, "a/b/f.txt"), []byte("12345"), 0o600)
	os.Symlink(outside, filepath.Join(root, "a/out"))

	got, err := d.ReadDir("a", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Path != "a/b" || got[0].Type != "dir" || got[1].Path != "a/out" || got[1].Type != "symlink" {
		t.Fatalf("depth 1: %+v", got)
	}
	got, _ = d.ReadDir("a", 2)
	if len(got) != 3 || got[1].Path != "a/b/f.txt" || got[1].Size != 5 {
		t.Fatalf("depth 2: %+v", got)
	}
	if _, err := d.ReadDir("a/out", 1); !errors.Is(err, sandbox.ErrBadPath) && err == nil {
		t.Fatalf("listing through a link: %v", err)
	}
	if fi, err := d.Stat("a/out"); err != nil || fi.Type != "symlink" {
		t.Fatalf("stat link: %+v %v", fi, err)
	}
	if _, err := d.Stat("nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("stat missing: %v", err)
	}
	if err := d.Remove("a/out/victim"); err == nil {
		t.Fatal("removed through a link")
	}
	if err := d.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "victim")); err != nil {
		t.Fatalf("the link's target was touched: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(root, "a")); !os.IsNotExist(err) {
		t.Fatalf("a still exists: %v", err)
	}
	if err := d.Remove("."); !errors.Is(err, sandbox.ErrBadPath) {
		t.Fatalf("remove workspace: %v", err)
	}
}

func TestMkdir(t *testing.T) {
	d, root := newDir(t)
	if err := d.Mkdir("x/y/z"); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(filepath.Join(root, "x/y/z")); err != nil || !st.IsDir() {
		t.Fatalf("x/y/z: %v %v", st, err)
	}
	if err := d.Mkdir("x/y/z"); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("again: %v, want ErrExists", err)
	}
	os.Symlink("/", filepath.Join(root, "out"))
	for _, name := range []string{"out/etc", "../x", "/abs", ""} {
		if err := d.Mkdir(name); err == nil {
			t.Errorf("Mkdir(%q) succeeded", name)
		}
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal(err)
	}
}

func TestRename(t *testing.T) {
	d, root := newDir(t)
	d.WriteFile("a.txt", strings.NewReader("A"), 10)
	d.WriteFile("dir/b.txt", strings.NewReader("B"), 10)
	if err := d.Rename("a.txt", "new/sub/a2.txt"); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "new/sub/a2.txt")); err != nil || string(b) != "A" {
		t.Fatalf("moved file: %q %v", b, err)
	}
	if err := d.Rename("dir", "dir2"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "dir2/b.txt")); err != nil {
		t.Fatal(err)
	}
	if err := d.Rename("missing", "x"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing source: %v", err)
	}
	if err := d.Rename("dir2", "dir2/inside"); !errors.Is(err, sandbox.ErrBadPath) {
		t.Fatalf("into itself: %v", err)
	}
	// A link is moved, never followed; a link in the path is refused.
	os.Symlink("/etc", filepath.Join(root, "link"))
	if err := d.Rename("link", "link2"); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(root, "link2")); err != nil || target != "/etc" {
		t.Fatalf("link moved: %q %v", target, err)
	}
	for _, c := range [][2]string{{"link2/passwd", "stolen"}, {"dir2/b.txt", "link2/x"}, {"../a", "b"}, {"dir2", "/tmp/x"}} {
		if err := d.Rename(c[0], c[1]); err == nil {
			t.Errorf("Rename(%q, %q) succeeded", c[0], c[1])
		}
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal(err)
	}
}

// A path through a file, or a file where a directory is, is the caller's
// mistake (ErrBadPath, ErrExists), not an unexplained error.
func TestFilesAndDirectoriesMixedUp(t *testing.T) {
	d, _ := newDir(t)
	if err := d.WriteFile("f", strings.NewReader("x"), 10); err != nil {
		t.Fatal(err)
	}
	if err := d.Mkdir("dir/sub"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		err  error
		want error
	}{
		{"open f/x", func() error { _, _, err := d.OpenFile("f/x"); return err }(), sandbox.ErrBadPath},
		{"stat f/x", func() error { _, err := d.Stat("f/x"); return err }(), sandbox.ErrBadPath},
		{"list f/x", func() error { _, err := d.ReadDir("f/x", 1); return err }(), sandbox.ErrBadPath},
		{"remove f/x", d.Remove("f/x"), sandbox.ErrBadPath},
		{"write f/x", d.WriteFile("f/x", strings.NewReader("x"), 10), sandbox.ErrBadPath},
		{"write over dir", d.WriteFile("dir", strings.NewReader("x"), 10), sandbox.ErrExists},
		{"open dir", func() error { _, _, err := d.OpenFile("dir"); return err }(), sandbox.ErrBadPath},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.what, tc.err, tc.want)
		}
	}
	if fi, err := d.Stat("dir/sub"); err != nil || fi.Type != "dir" {
		t.Errorf("the directory was touched: %+v %v", fi, err)
	}
}

// TestMkdirAllFor: the sandbox's root makes a user's directories where
// the user may not, and gives away only those it made; links are not
// followed, an existing name is ErrExists, and the user's own view is
// not a root's.
func TestMkdirAllFor(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	const sbRoot, user = 54321, 54322
	if err := os.Chown(base, sbRoot, sbRoot); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chown(filepath.Join(base, "etc"), sbRoot, sbRoot)
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	asRoot, err := Open(base, sbRoot, sbRoot)
	if err != nil {
		t.Fatal(err)
	}
	defer asRoot.Close()
	asUser, err := Open(base, user, user)
	if err != nil {
		t.Fatal(err)
	}
	defer asUser.Close()
	if err := asUser.Mkdir("data/deep"); !errors.Is(err, sandbox.ErrPermission) {
		t.Fatalf("the user's own mkdir: %v, want a permission error", err)
	}
	if err := asRoot.MkdirAllFor("etc/data/deep", asUser); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]uint32{"etc": sbRoot, "etc/data": user, "etc/data/deep": user} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(base, p), &st); err != nil || st.Uid != want || st.Gid != want {
			t.Errorf("%s: owner %d:%d (%v), want %d", p, st.Uid, st.Gid, err, want)
		}
	}
	if err := asUser.WriteFile("etc/data/deep/f.txt", strings.NewReader("x"), 10); err != nil {
		t.Fatalf("the user's write into what was made for it: %v", err)
	}
	if err := asRoot.MkdirAllFor("etc/data", asUser); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("an existing name: %v", err)
	}
	if err := asRoot.MkdirAllFor("link/x", asUser); err == nil {
		t.Fatal("made a directory through a link")
	}
	if _, err := os.Lstat(filepath.Join(outside, "x")); err == nil {
		t.Fatal("a directory was made through the link")
	}
	if err := asRoot.MkdirAllFor("y", fakeWorkspace{}); err == nil {
		t.Fatal("gave a directory to what is no confined directory")
	}
}

type fakeWorkspace struct{ sandbox.Workspace }

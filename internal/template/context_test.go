package template

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// archived lists the archive of src (tarEntries) and its digest.
func archived(t *testing.T, c *Context, src string) ([]string, string) {
	t.Helper()
	var buf bytes.Buffer
	hash, err := c.Archive(src, &buf)
	if err != nil {
		t.Fatalf("Archive(%q): %v", src, err)
	}
	return tarEntries(t, buf.Bytes()), hash
}

func TestContextArchive(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"app.py": "print(1)", "lib/util.py": "u", "lib/sub/deep.py": "d", "debug.log": "x", "keep.log": "k",
		"node_modules/m/index.js": "n", "web/node_modules/m/index.js": "n", "build/out.bin": "b",
		".dockerignore": "# comments\n*.log\n!keep.log\n**/node_modules\n/build\n",
	})
	if err := os.Symlink("/etc/shadow", filepath.Join(dir, "lib", "shadow")); err != nil {
		t.Fatal(err)
	}
	c, err := OpenContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct{ src, want string }{
		{"app.py", "app.py=print(1)"},
		{"lib", "shadow -> /etc/shadow sub/ sub/deep.py=d util.py=u"},
		{"/lib/sub", "deep.py=d"},
		{"*.log", "keep.log=k"},
		{".", ".dockerignore=# comments\n*.log\n!keep.log\n**/node_modules\n/build\n app.py=print(1) keep.log=k lib/ lib/shadow -> /etc/shadow lib/sub/ lib/sub/deep.py=d lib/util.py=u web/"},
	} {
		got, _ := archived(t, c, tc.src)
		if strings.Join(got, " ") != tc.want {
			t.Errorf("Archive(%q):\n got %q\nwant %q", tc.src, strings.Join(got, " "), tc.want)
		}
	}
	for _, src := range []string{"debug.log", "build", "node_modules", "absent.txt"} {
		if _, err := c.Archive(src, io.Discard); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "no such file") {
			t.Errorf("Archive(%q) of what is excluded or absent: %v", src, err)
		}
	}
	if _, err := c.Archive("../outside", io.Discard); !errors.Is(err, ErrInvalid) {
		t.Errorf("a source outside the context: %v", err)
	}
}

// TestContextHash: the digest follows names, modes and content, not
// times.
func TestContextHash(t *testing.T) {
	dir := writeTree(t, map[string]string{"a/x": "1", "a/y": "2"})
	hash := func() string {
		c, err := OpenContext(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, h := archived(t, c, "a")
		return h
	}
	h0 := hash()
	os.Chtimes(filepath.Join(dir, "a/x"), time.Now().Add(time.Hour), time.Now().Add(time.Hour))
	if hash() != h0 {
		t.Error("a new mtime changed the digest")
	}
	os.WriteFile(filepath.Join(dir, "a/y"), []byte("3"), 0o644)
	h1 := hash()
	if h1 == h0 {
		t.Error("new content kept the digest")
	}
	os.Chmod(filepath.Join(dir, "a/y"), 0o755)
	if hash() == h1 {
		t.Error("a new mode kept the digest")
	}
}

func TestContextRefusesSpecialFiles(t *testing.T) {
	dir := writeTree(t, map[string]string{"ok": "1"})
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := OpenContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Archive("pipe", io.Discard); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "not a file") {
		t.Errorf("a FIFO: %v", err)
	}
	if _, err := c.Archive("ok", io.Discard); err != nil {
		t.Errorf("a file beside a FIFO: %v", err)
	}
}

package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// An archive of a directory, its entries named as in it (as E2B's SDK
// uploads a COPY's files), gives each COPY what the directory itself
// gives it: the same tar, byte for byte.
func TestArchiveFromIsContextArchive(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"folder/test.txt": "a test", "folder/sub/deep.txt": "deep", "top.py": "print(1)", "other/x": "x",
	})
	if err := os.Symlink("test.txt", filepath.Join(dir, "folder", "link.txt")); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(dir, "top.py"), 0o755)
	c, err := OpenContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var whole, gz bytes.Buffer
	if _, err := c.Archive(".", &whole); err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(&gz)
	zw.Write(whole.Bytes())
	zw.Close()
	lim := ArchiveLimits{MaxBytes: 1 << 20, MaxEntries: 100}
	for _, src := range []string{".", "folder", "folder/*", "folder/test.txt", "top.py", "*.py", "folder/sub", "**/*.txt"} {
		var want, got bytes.Buffer
		wantSum, err := c.Archive(src, &want)
		if err != nil {
			t.Fatal(err)
		}
		gotSum, err := ArchiveFrom(bytes.NewReader(gz.Bytes()), lim, src, &got)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if gotSum != wantSum || !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Errorf("COPY %s: from the archive %s, from the directory %s", src, gotSum, wantSum)
		}
	}
	if _, err := ArchiveFrom(bytes.NewReader(gz.Bytes()), lim, "missing.txt", &bytes.Buffer{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a source the archive has not: %v", err)
	}
	if _, err := ArchiveFrom(bytes.NewReader(gz.Bytes()), lim, "../x", &bytes.Buffer{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("a source outside: %v", err)
	}
}

// Set-ID bits in an uploaded archive are dropped from what a COPY takes.
func TestArchiveFromDropsSetID(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "suid", Mode: 0o4755, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	var out bytes.Buffer
	if _, err := ArchiveFrom(&buf, ArchiveLimits{MaxBytes: 1 << 20, MaxEntries: 10}, "suid", &out); err != nil {
		t.Fatal(err)
	}
	h, err := tar.NewReader(&out).Next()
	if err != nil || h.Mode != 0o755 {
		t.Errorf("mode %o, %v", h.Mode, err)
	}
}

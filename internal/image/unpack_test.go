package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// entry is one entry of a test layer.
type entry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
	size       int64 // a body of this many zero bytes, when body is ""
	uid        int   // the owner, when not the test's own user (root only)
}

// layerTar is the tar archive of entries, owned by the test's own user
// (so that a test without root may unpack it).
func layerTar(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode,
			Uid: os.Getuid(), Gid: os.Getgid(), Format: tar.FormatPAX}
		if e.uid != 0 {
			h.Uid, h.Gid = e.uid, e.uid
		}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		var body io.Reader
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
			body = strings.NewReader(e.body)
			if e.body == "" && e.size > 0 {
				h.Size, body = e.size, io.LimitReader(zeros{}, e.size)
			}
		}
		if h.Typeflag == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if body != nil {
			if _, err := io.Copy(tw, body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func unpackInto(t *testing.T, lim Limits, layer []byte) (string, *budget, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A layer's read-only directories must not stop the test's cleanup
	// without root.
	t.Cleanup(func() {
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o700)
			}
			return nil
		})
	})
	b := &budget{lim: lim}
	_, err := unpackLayer(dir, bytes.NewReader(layer), b)
	return dir, b, err
}

func TestUnpackLayer(t *testing.T) {
	layer := layerTar(t,
		entry{name: "usr/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "usr/bin/tool", body: "#!/bin/sh\n", mode: 0o4755},
		entry{name: "usr/lib/lib.so", body: "elf"},
		entry{name: "usr/lib/link.so", typ: tar.TypeSymlink, link: "lib.so"},
		entry{name: "usr/lib/hard.so", typ: tar.TypeLink, link: "usr/lib/lib.so"},
		entry{name: "etc/ro/", typ: tar.TypeDir, mode: 0o555},
		entry{name: "etc/ro/file", body: "in a read-only directory"},
		entry{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		entry{name: "dev/mem", typ: tar.TypeChar, mode: 0o600},
		entry{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
		entry{name: "usr/lib/lib.so", body: "replaced"},
	)
	dir, b, err := unpackInto(t, DefaultLimits, layer)
	if err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	if got := read("usr/lib/link.so"); got != "replaced" {
		t.Errorf("the symlink reads %q", got)
	}
	// The hard link was made to the first lib.so, which the last entry
	// replaced: it keeps the first content, as tar does.
	if got := read("usr/lib/hard.so"); got != "elf" {
		t.Errorf("the hard link reads %q", got)
	}
	if got := read("etc/ro/file"); got != "in a read-only directory" {
		t.Errorf("etc/ro/file reads %q", got)
	}
	fi, err := os.Stat(filepath.Join(dir, "usr/bin/tool"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("usr/bin/tool has mode %v: set-ID bits must be dropped, the rest kept", fi.Mode())
	}
	if b.setIDDropped != 1 {
		t.Errorf("set-ID files counted: %d", b.setIDDropped)
	}
	for p, want := range map[string]os.FileMode{"etc/ro": 0o555 | os.ModeDir, "tmp": 0o777 | os.ModeDir | os.ModeSticky} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v (%v)", p, fi.Mode(), want, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "dev/mem")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a device node was made: %v", err)
	}
	if b.devices != 1 {
		t.Errorf("device nodes counted: %d", b.devices)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "run/fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("run/fifo: %v %v", fi, err)
	}
}

// TestUnpackHostileLayers: each layer is refused with an error that
// says why, and nothing is written outside the layer's directory.
func TestUnpackHostileLayers(t *testing.T) {
	outside := t.TempDir()
	canary := filepath.Join(outside, "canary")
	if err := os.WriteFile(canary, []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	small := Limits{Layers: 4, Bytes: 1 << 20, Files: 100}
	var many []entry
	for i := range 101 {
		many = append(many, entry{name: "f/" + strings.Repeat("x", i+1), body: "x"})
	}
	for _, c := range []struct {
		name    string
		entries []entry
		want    error
		says    string
	}{
		{"dot-dot", []entry{{name: "a/../../escape", body: "x"}}, ErrRefused, "leads out of its root"},
		{"absolute path", []entry{{name: canary, body: "overwritten"}}, ErrRefused, "absolute path"},
		{"symlink then file", []entry{
			{name: "out", typ: tar.TypeSymlink, link: outside},
			{name: "out/canary", body: "overwritten"},
		}, ErrRefused, "through a link"},
		{"relative symlink then file", []entry{
			{name: "a/out", typ: tar.TypeSymlink, link: "../../../../../../../../../../" + outside},
			{name: "a/out/canary", body: "overwritten"},
		}, ErrRefused, "through a link"},
		{"hard link out", []entry{{name: "h", typ: tar.TypeLink, link: "../../../../../../" + canary}}, ErrRefused, "leads out"},
		{"hard link through a symlink", []entry{
			{name: "s", typ: tar.TypeSymlink, link: outside},
			{name: "h", typ: tar.TypeLink, link: "s/canary"},
		}, ErrRefused, "not a file of the same layer"},
		{"hard link to an absent file", []entry{{name: "h", typ: tar.TypeLink, link: "etc/shadow"}}, ErrRefused, "not a file of the same layer"},
		{"opaque root", []entry{{name: ".wh..wh..opq", body: ""}}, ErrRefused, "root opaque"},
		{"whiteout of the root", []entry{{name: "a/../.wh..", body: ""}}, ErrRefused, ""},
		{"whiteout of dot", []entry{{name: "x/.wh..", body: ""}}, ErrRefused, "malformed whiteout"},
		{"too many files", many, ErrTooLarge, "100 files"},
		{"too many bytes", []entry{{name: "big", size: 2 << 20}}, ErrTooLarge, "1.0 MiB"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := unpackInto(t, small, layerTar(t, c.entries...))
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("err = %v, want %v saying %q", err, c.want, c.says)
			}
			if b, _ := os.ReadFile(canary); string(b) != "untouched" {
				t.Fatalf("the canary outside the layer was changed: %q", b)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 1 {
				t.Fatalf("files appeared outside the layer: %v", entries)
			}
		})
	}
	t.Run("not a tar", func(t *testing.T) {
		_, _, err := unpackInto(t, small, bytes.Repeat([]byte("garbage!"), 200))
		if !errors.Is(err, ErrRefused) {
			t.Errorf("err = %v", err)
		}
	})
}

// TestLayersStackInOverlay mounts two unpacked layers with overlayfs and
// checks that the upper one's whiteouts delete and its opaque directory
// hides what the lower one has.
func TestLayersStackInOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: whiteouts are device nodes, and overlayfs is mounted")
	}
	lower, _, err := unpackInto(t, DefaultLimits, layerTar(t,
		entry{name: "a/x", body: "x"}, entry{name: "a/y", body: "y"}, entry{name: "b/z", body: "z"},
		entry{name: "c/old", body: "old"}))
	if err != nil {
		t.Fatal(err)
	}
	upper, _, err := unpackInto(t, DefaultLimits, layerTar(t,
		entry{name: "a/.wh.x"}, entry{name: ".wh.b"},
		entry{name: "c/.wh..wh..opq"}, entry{name: "c/new", body: "new"}))
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(upper, "a/x"), &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("a/x in the upper layer is not a whiteout: %+v %v", st, err)
	}
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+upper+":"+lower); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	var seen []string
	filepath.Walk(mnt, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(mnt, p)
			seen = append(seen, rel)
		}
		return nil
	})
	if got, want := strings.Join(seen, " "), "a/y c/new"; got != want {
		t.Errorf("the stacked layers show %q, want %q", got, want)
	}
}

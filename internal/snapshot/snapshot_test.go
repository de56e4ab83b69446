package snapshot

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// tree makes a small snapshot-like directory in a new temporary one.
func tree(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "s")
	for _, d := range []string{"images", "files/sub"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "manifest.json"), []byte(`{"version":1}`), 0o600)
	os.WriteFile(filepath.Join(dir, "images", "pages-1.img"), bytes.Repeat([]byte("p"), 100000), 0o644)
	os.WriteFile(filepath.Join(dir, "files", "sub", "a.txt"), []byte("a"), 0o640)
	os.Symlink("/etc/passwd", filepath.Join(dir, "files", "link"))
	syscall.Mkfifo(filepath.Join(dir, "files", "fifo"), 0o600)
	return dir
}

func key(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

// TestSignVerify: a signed directory verifies; any change to a file's
// contents, mode, owner, a link's target, an added or removed file, or
// another key, does not.
func TestSignVerify(t *testing.T) {
	changes := map[string]func(dir string){
		"contents": func(d string) { os.WriteFile(filepath.Join(d, "images", "pages-1.img"), []byte("x"), 0o644) },
		"mode":     func(d string) { os.Chmod(filepath.Join(d, "files", "sub", "a.txt"), 0o644) },
		"owner":    func(d string) { os.Lchown(filepath.Join(d, "files", "sub", "a.txt"), 1234, 1234) },
		"link": func(d string) {
			os.Remove(filepath.Join(d, "files", "link"))
			os.Symlink("/etc/shadow", filepath.Join(d, "files", "link"))
		},
		"added":        func(d string) { os.WriteFile(filepath.Join(d, "images", "extra.img"), nil, 0o644) },
		"removed":      func(d string) { os.Remove(filepath.Join(d, "manifest.json")) },
		"no signature": func(d string) { os.Remove(filepath.Join(d, SignatureFile)) },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			if name == "owner" {
				testutil.RequireRoot(t, "chown")
			}
			dir := tree(t)
			if err := Sign(dir, key(1)); err != nil {
				t.Fatal(err)
			}
			if err := Verify(dir, key(1)); err != nil {
				t.Fatalf("unchanged: %v", err)
			}
			if err := Verify(dir, key(2)); !errors.Is(err, ErrTampered) {
				t.Fatalf("another key: %v", err)
			}
			change(dir)
			if err := Verify(dir, key(1)); !errors.Is(err, ErrTampered) {
				t.Fatalf("changed: %v", err)
			}
		})
	}
}

// TestExportImport: a directory exported and imported elsewhere verifies
// under the same key, with its owners, modes and link.
func TestExportImport(t *testing.T) {
	dir := tree(t)
	uid, gid := 4321, 4322 // owners only root may give; others keep their own
	if os.Geteuid() != 0 {
		uid, gid = os.Getuid(), os.Getgid()
	}
	os.Lchown(filepath.Join(dir, "files", "sub", "a.txt"), uid, gid)
	if err := Sign(dir, key(1)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Export(&buf, dir); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "imported")
	n, err := Import(bytes.NewReader(buf.Bytes()), dst, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n < 100000 {
		t.Fatalf("imported %d bytes", n)
	}
	if err := Verify(dst, key(1)); err != nil {
		t.Fatalf("the imported copy: %v", err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(dst, "files", "sub", "a.txt"), &st); err != nil || int(st.Uid) != uid || int(st.Gid) != gid || st.Mode&0o7777 != 0o640 {
		t.Fatalf("a.txt: %+v %v", st, err)
	}
	// Too large.
	if _, err := Import(bytes.NewReader(buf.Bytes()), filepath.Join(t.TempDir(), "small"), 1000, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
	// No room on the host's disk: asked before each file's contents,
	// and its error ends the import with nothing left.
	full := errors.New("the disk is full")
	var asked int64
	room := func(need int64) error {
		if asked += need; asked > 50000 {
			return full
		}
		return nil
	}
	dst = filepath.Join(t.TempDir(), "full")
	if _, err := Import(bytes.NewReader(buf.Bytes()), dst, 1<<20, room); !errors.Is(err, full) {
		t.Fatalf("no room: %v", err)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatalf("left %s: %v", dst, err)
	}
}

// TestImportRefuses: paths out of the directory, a path through a link,
// devices, and what is not a tar stream are refused, and nothing is left.
func TestImportRefuses(t *testing.T) {
	outside := t.TempDir()
	cases := map[string][]*tar.Header{
		"dotdot":   {{Name: "../escape", Typeflag: tar.TypeReg}},
		"absolute": {{Name: "/tmp/escape", Typeflag: tar.TypeReg}},
		"through a link": {
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			{Name: "l/escape", Typeflag: tar.TypeReg},
		},
		"device": {{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		"twice":  {{Name: "a", Typeflag: tar.TypeReg}, {Name: "a", Typeflag: tar.TypeReg}},
	}
	for name, hs := range cases {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			for _, h := range hs {
				h.Mode, h.Uid, h.Gid = 0o644, os.Getuid(), os.Getgid()
				tw.WriteHeader(h)
			}
			tw.Close()
			dst := filepath.Join(t.TempDir(), "d")
			if _, err := Import(&buf, dst, 1<<20, nil); err == nil {
				t.Fatal("imported")
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Fatalf("left %s: %v", dst, err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("wrote outside: %v", ents)
			}
		})
	}
	// Many empty files: each counts.
	var flood bytes.Buffer
	tw := tar.NewWriter(&flood)
	for i := range 3000 {
		tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%d", i), Typeflag: tar.TypeReg, Mode: 0o644, Uid: os.Getuid(), Gid: os.Getgid()})
	}
	tw.Close()
	if _, err := Import(&flood, filepath.Join(t.TempDir(), "d"), 1<<20, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("3,000 empty files in 1 MiB: %v", err)
	}
	if _, err := Import(strings.NewReader("not a tar stream at all, but long enough to be read as one's header......"),
		filepath.Join(t.TempDir(), "d"), 1<<20, nil); !errors.Is(err, ErrNotSnapshot) {
		t.Fatal("imported garbage")
	}
}

// TestLoadKey makes a key once and reads the same back.
func TestLoadKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "k", "snapshot.key")
	a, err := LoadKey(p)
	if err != nil || len(a) != KeySize {
		t.Fatal(a, err)
	}
	b, err := LoadKey(p)
	if err != nil || !bytes.Equal(a, b) {
		t.Fatal(b, err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	// Others may read or write it: refused, saying how to mend it.
	for _, mode := range []os.FileMode{0o640, 0o604, 0o620, 0o666} {
		os.Chmod(p, mode)
		if _, err := LoadKey(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Errorf("a key of mode %04o: %v", mode, err)
		}
	}
	os.Chmod(p, 0o400)
	if _, err := LoadKey(p); err != nil {
		t.Errorf("a key of mode 0400: %v", err)
	}
	if os.Geteuid() == 0 {
		os.Chown(p, 1234, 1234)
		if _, err := LoadKey(p); err == nil || !strings.Contains(err.Error(), "chown") {
			t.Errorf("another user's key: %v", err)
		}
	}
}

// A packed file comes back as it was, smaller on disk; one that does not
// unpack to its recorded size, or is not a packed file, is refused and
// leaves nothing behind.
func TestPackUnpack(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "pages-1.img")
	data := bytes.Repeat([]byte("a page of a Python heap, more or less repetitive\x00\x00\x00"), 1<<15)
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	packed := src + PackedSuffix
	n, err := Pack(packed, src)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("Pack: %d %v", n, err)
	}
	if st, _ := os.Stat(packed); st == nil || st.Size() >= int64(len(data))/4 {
		t.Fatalf("packed size %v of %d", st, len(data))
	}
	back := filepath.Join(dir, "back")
	if err := Unpack(back, packed, n, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(back); !bytes.Equal(got, data) {
		t.Fatal("unpacked data differs")
	}
	if st, _ := os.Stat(back); st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", st.Mode())
	}
	for name, c := range map[string]struct {
		src  string
		size int64
	}{
		"short": {packed, n - 1}, "long": {packed, n + 1}, "not packed": {src, n},
	} {
		dst := filepath.Join(dir, "bad-"+strings.ReplaceAll(name, " ", "-"))
		if err := Unpack(dst, c.src, c.size, 0o644); err == nil {
			t.Errorf("%s: unpacked", name)
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("%s: left %s behind (%v)", name, dst, err)
		}
	}
}

// ustar is one raw tar header block: a stream tar.Writer would not write
// (a sparse file's).
func ustar(name string, typ byte, size int) []byte {
	b := make([]byte, 512)
	copy(b, name)
	copy(b[100:], "0000600\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], "00000000000\x00")
	b[156] = typ
	copy(b[257:], "ustar\x0000")
	copy(b[148:], "        ")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

func padded(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }

// paxRecord is one record of a PAX extended header: "LEN KEY=VALUE\n",
// LEN counting itself.
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	for {
		r := fmt.Sprintf("%d %s=%s\n", n, k, v)
		if len(r) == n {
			return r
		}
		n = len(r)
	}
}

// sparseStreams are archives of one sparse file of 1 GiB whose only data
// is one byte: a few KiB that tar.Reader reads back as 1 GiB of zeros.
func sparseStreams() map[string][]byte {
	const real = 1 << 30
	pax := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
		paxRecord("GNU.sparse.name", "pages-1.img") + paxRecord("GNU.sparse.realsize", fmt.Sprint(real))
	sparseMap := padded([]byte(fmt.Sprintf("1\n%d\n1\n", real-1)))
	var pax10 []byte
	pax10 = append(pax10, ustar("PaxHeaders/pages-1.img", 'x', len(pax))...)
	pax10 = append(pax10, padded([]byte(pax))...)
	pax10 = append(pax10, ustar("GNUSparseFile.0/pages-1.img", '0', len(sparseMap)+1)...)
	pax10 = append(pax10, padded(append(sparseMap, 'x'))...)
	pax10 = append(pax10, make([]byte, 1024)...)

	// GNU's old form: type 'S', the map in the header (offset 386: four
	// entries of offset and length, 12 bytes each), the real size at 483.
	old := ustar("pages-1.img", 'S', 1)
	copy(old[257:], "ustar  \x00") // GNU's magic
	copy(old[386:], fmt.Sprintf("%011o\x00%011o\x00", real-1, 1))
	copy(old[483:], fmt.Sprintf("%011o\x00", real))
	copy(old[148:], "        ")
	sum := 0
	for _, c := range old {
		sum += int(c)
	}
	copy(old[148:], fmt.Sprintf("%06o\x00 ", sum))
	old = append(old, padded([]byte("x"))...)
	old = append(old, make([]byte, 1024)...)
	return map[string][]byte{"pax 1.0": pax10, "gnu old": old}
}

// A sparse entry is refused before anything of it is written: its holes,
// read back as zeros, would fill the disk with what the stream never
// carried, within the key's room and before the signature is checked.
func TestImportRefusesSparse(t *testing.T) {
	for name, stream := range sparseStreams() {
		t.Run(name, func(t *testing.T) {
			// The stream is what it says: tar.Reader makes 1 GiB of it.
			tr := tar.NewReader(bytes.NewReader(stream))
			h, err := tr.Next()
			if err != nil || h.Size != 1<<30 {
				t.Fatalf("the test's stream: %v %+v", err, h)
			}
			dst := filepath.Join(t.TempDir(), "d")
			_, err = Import(bytes.NewReader(stream), dst, 8<<30, nil)
			if !errors.Is(err, ErrNotSnapshot) || !strings.Contains(err.Error(), "sparse") {
				t.Fatalf("%d bytes of a sparse file: %v", len(stream), err)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Fatalf("left %s: %v", dst, err)
			}
		})
	}
}

// FuzzImport: whatever the stream, Import writes only beneath its
// directory, never more than it counted within its limit, and leaves
// nothing when it fails.
func FuzzImport(f *testing.F) {
	dir := tree(&testing.T{})
	Sign(dir, key(1))
	var buf bytes.Buffer
	Export(&buf, dir)
	f.Add(buf.Bytes())
	for _, s := range sparseStreams() {
		f.Add(s)
	}
	f.Add([]byte("not a tar stream"))
	const limit = 1 << 20
	f.Fuzz(func(t *testing.T, stream []byte) {
		base := t.TempDir()
		dst := filepath.Join(base, "d")
		n, err := Import(bytes.NewReader(stream), dst, limit, nil)
		if err != nil {
			if _, serr := os.Stat(dst); !os.IsNotExist(serr) {
				t.Fatalf("failed (%v) and left %s", err, dst)
			}
		} else if n > limit {
			t.Fatalf("imported %d bytes over the limit", n)
		}
		ents, _ := os.ReadDir(base)
		if len(ents) > 1 || (len(ents) == 1 && ents[0].Name() != "d") {
			t.Fatalf("wrote beside its directory: %v", ents)
		}
		var written int64
		filepath.Walk(dst, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				var st syscall.Stat_t
				syscall.Lstat(p, &st)
				written += st.Blocks * 512
			}
			return nil
		})
		if written > limit+int64(len(stream)) {
			t.Fatalf("%d bytes on disk from a %d-byte stream", written, len(stream))
		}
	})
}

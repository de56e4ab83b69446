package workspace

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func TestMetadataRoundTripAndBounds(t *testing.T) {
	d, root := newDir(t)
	if err := d.WriteFile("f.txt", strings.NewReader("x"), 10); err != nil {
		t.Fatal(err)
	}
	md := map[string]string{"author": "mish", "purpose": "upload"}
	if err := d.SetFileMetadata("f.txt", md); err != nil {
		if errors.Is(err, sandbox.ErrUnsupported) {
			t.Skip("this file system keeps no user extended attributes")
		}
		t.Fatal(err)
	}
	if got, err := d.FileMetadata("f.txt"); err != nil || !maps.Equal(got, md) {
		t.Fatalf("metadata: %v %v", got, err)
	}
	// What a program in the sandbox sets in user.e2b. is metadata; other
	// attributes are not.
	unix.Setxattr(filepath.Join(root, "f.txt"), "user.e2b.tag", []byte("set inside"), 0)
	unix.Setxattr(filepath.Join(root, "f.txt"), "user.other", []byte("no"), 0)
	if got, _ := d.FileMetadata("f.txt"); got["tag"] != "set inside" || len(got) != 3 {
		t.Fatalf("metadata set inside: %v", got)
	}
	// Values and keys over the bounds, set inside, are left out.
	unix.Setxattr(filepath.Join(root, "f.txt"), "user.e2b.big", make([]byte, sandbox.MaxMetadataValueLen+1), 0)
	if got, _ := d.FileMetadata("f.txt"); len(got) != 3 {
		t.Fatalf("an oversized value was reported: %d entries", len(got))
	}
	// A file rewritten has none.
	if err := d.WriteFile("f.txt", strings.NewReader("y"), 10); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.FileMetadata("f.txt"); len(got) != 0 {
		t.Fatalf("after a rewrite: %v", got)
	}

	many := map[string]string{}
	for i := range sandbox.MaxMetadataEntries + 1 {
		many[strings.Repeat("k", i+1)] = "v"
	}
	for name, bad := range map[string]map[string]string{
		"too many":   many,
		"long key":   {strings.Repeat("k", sandbox.MaxMetadataKeyLen+1): "v"},
		"long value": {"k": strings.Repeat("v", sandbox.MaxMetadataValueLen+1)},
		"empty key":  {"": "v"},
		"space":      {"a b": "v"},
		"NUL":        {"k": "a\x00b"},
		"non-ASCII":  {"é": "v"},
	} {
		if err := d.SetFileMetadata("f.txt", bad); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Errorf("%s: %v", name, err)
		}
	}

	// Links are never followed, and carry none.
	outside := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(outside, nil, 0o600)
	os.Symlink(outside, filepath.Join(root, "link"))
	if err := d.SetFileMetadata("link", map[string]string{"k": "v"}); !errors.Is(err, sandbox.ErrBadPath) {
		t.Fatalf("metadata on a link: %v", err)
	}
	if n, _ := unix.Listxattr(outside, make([]byte, 1024)); n != 0 {
		t.Fatal("the link's target got metadata")
	}
	if got, err := d.FileMetadata("link"); err != nil || len(got) != 0 {
		t.Fatalf("a link's metadata: %v %v", got, err)
	}
	if target, err := d.Readlink("link"); err != nil || target != outside {
		t.Fatalf("readlink: %q %v", target, err)
	}
	if _, err := d.Readlink("f.txt"); !errors.Is(err, sandbox.ErrBadPath) {
		t.Fatalf("readlink of a file: %v", err)
	}
	if _, err := d.Readlink("link/x"); err == nil {
		t.Fatal("readlink through a link")
	}
}

// Metadata is set with the sandbox user's rights: the host's own
// /proc/self/fd path works under the user's fsuid, and a file the user
// may not write gets none.
func TestMetadataAsOwner(t *testing.T) {
	testutil.RequireRoot(t)
	root := t.TempDir()
	const owner = 54321
	os.Chown(root, owner, owner)
	os.WriteFile(filepath.Join(root, "hosts"), nil, 0o644) // root's
	d, err := Open(root, owner, owner)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteFile("f", strings.NewReader("x"), 10); err != nil {
		t.Fatal(err)
	}
	if err := d.SetFileMetadata("f", map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.FileMetadata("f"); got["k"] != "v" {
		t.Fatalf("metadata: %v", got)
	}
	if err := d.SetFileMetadata("hosts", map[string]string{"k": "v"}); !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EACCES) {
		t.Fatalf("metadata on a file the user may not write: %v", err)
	}
}

// Symlink writes a link as it is told, never follows one on its way
// (a link planted as a parent is refused), and replaces nothing; as the
// owner, it makes links only where the owner may.
func TestSymlink(t *testing.T) {
	d, root := newDir(t)
	if err := d.Symlink("/etc/passwd", "abs"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(filepath.Join(root, "abs")); err != nil || got != "/etc/passwd" {
		t.Fatalf("abs -> %q (%v)", got, err)
	}
	if got, err := d.Readlink("abs"); err != nil || got != "/etc/passwd" {
		t.Fatalf("Readlink: %q (%v)", got, err)
	}
	if err := d.Symlink("elsewhere", "abs"); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("over an entry: %v", err)
	}
	os.Symlink(t.TempDir(), filepath.Join(root, "out"))
	if err := d.Symlink("x", "out/planted"); !errors.Is(err, sandbox.ErrBadPath) {
		t.Fatalf("through a link: %v", err)
	}
	for _, target := range []string{"", "a\x00b"} {
		if err := d.Symlink(target, "bad"); !errors.Is(err, sandbox.ErrBadPath) {
			t.Fatalf("target %q: %v", target, err)
		}
	}
	if err := d.Symlink("x", "../up"); !errors.Is(err, sandbox.ErrBadPath) {
		t.Fatalf("outside: %v", err)
	}

	testutil.RequireRoot(t)
	owned := t.TempDir()
	const owner = 54321
	os.Chown(owned, owner, owner)
	os.Mkdir(filepath.Join(owned, "roots"), 0o755) // root's
	u, err := Open(owned, owner, owner)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if err := u.Symlink("t", "mine"); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(owned, "mine"), &st); err != nil || st.Uid != owner {
		t.Fatalf("the link's owner: %d (%v)", st.Uid, err)
	}
	if err := u.Symlink("t", "roots/theirs"); !errors.Is(err, sandbox.ErrPermission) {
		t.Fatalf("in root's directory: %v", err)
	}
}

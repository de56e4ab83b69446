package e2b

import (
	"errors"
	"path"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

func TestToRoot(t *testing.T) {
	for _, c := range []struct {
		in, want string // want "" means refused
	}{
		{"/home/user", "workspace"},
		{"/home/user/", "workspace"},
		{"/home/user/a.txt", "workspace/a.txt"},
		{"/home/user/d/e/f.csv", "workspace/d/e/f.csv"},
		{"/home/user//d/./e", "workspace/d/e"},
		{"/home/user/d/../e", "workspace/e"},
		{"/workspace", "workspace"},
		{"/workspace/out.png", "workspace/out.png"},
		{"a.txt", "workspace/a.txt"}, // relative to the home
		{"d/e", "workspace/d/e"},
		{"", "workspace"},
		{".", "workspace"},
		{"./x", "workspace/x"},
		{"x/../y", "workspace/y"},
		{"..", "home"},
		{"../user/x", "workspace/x"}, // /home/user/../user/x is the home again
		{"../../etc/passwd", "etc/passwd"},
		{"/home/user/../../etc/passwd", "etc/passwd"},
		{"/home/userx/a", "home/userx/a"},
		{"/home", "home"},
		{"/", "."},
		{"/../..", "."},
		{"/etc/passwd", "etc/passwd"},
		{"/tmp/x", "tmp/x"},
		{"/workspacex", "workspacex"},
		{"/home/user/a\x00b", ""},
		{"/home/user/" + strings.Repeat("a", maxPathLen), ""},
	} {
		got, err := toRoot(c.in, sandbox.UserSandbox)
		if c.want == "" {
			if err == nil || !errors.Is(err, sandbox.ErrBadPath) {
				t.Errorf("toRoot(%q) = %q, %v; want ErrBadPath", c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("toRoot(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	// Root's relative paths are relative to its home, /root.
	for in, want := range map[string]string{"hello.txt": "root/hello.txt", "": "root", "..": ".",
		"/home/user/a": "workspace/a", "../home/user": "workspace"} {
		if got, err := toRoot(in, sandbox.UserRoot); err != nil || got != want {
			t.Errorf("toRoot(%q, root) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestToSandboxAndDirs(t *testing.T) {
	for rel, want := range map[string]string{".": "/", "workspace": "/home/user", "workspace/a/b": "/home/user/a/b",
		"tmp/x": "/tmp/x", "workspacex": "/workspacex"} {
		if got := toSandbox(rel); got != want {
			t.Errorf("toSandbox(%q) = %q, want %q", rel, got, want)
		}
	}
	for in, want := range map[string]string{"": "/home/user", "sub": "/home/user/sub", "/tmp/": "/tmp", "/home/user/../x": "/home/x"} {
		if got, err := sandboxDir(in, sandbox.UserSandbox); err != nil || got != want {
			t.Errorf("sandboxDir(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, want := range map[string]string{"": "/root", "sub": "/root/sub", "/tmp": "/tmp"} {
		if got, err := sandboxDir(in, sandbox.UserRoot); err != nil || got != want {
			t.Errorf("sandboxDir(%q, root) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := sandboxDir("a\x00", sandbox.UserSandbox); err == nil {
		t.Error("a NUL byte in a directory was accepted")
	}
}

// FuzzToRoot checks that whatever a client sends, an accepted path is a
// clean relative path that cannot name anything above the sandbox's root,
// and that it maps back to the same place.
func FuzzToRoot(f *testing.F) {
	for _, s := range []string{"/home/user/a", "a/../../b", "/workspace/../home/user", "..", "/home/user/..", "./././x",
		"/home/user/\x00", "//home//user//x", "/home/user/.../x", "a/b/../../..", "/workspace//.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		rel, err := toRoot(in, sandbox.UserSandbox)
		if err != nil {
			if !errors.Is(err, sandbox.ErrBadPath) {
				t.Fatalf("toRoot(%q): %v is not ErrBadPath", in, err)
			}
			return
		}
		switch {
		case rel == "":
			t.Fatalf("toRoot(%q) accepted an empty path", in)
		case strings.HasPrefix(rel, "/"):
			t.Fatalf("toRoot(%q) = %q is absolute", in, rel)
		case strings.ContainsRune(rel, 0):
			t.Fatalf("toRoot(%q) = %q holds a NUL byte", in, rel)
		case path.Clean(rel) != rel:
			t.Fatalf("toRoot(%q) = %q is not clean", in, rel)
		}
		for _, part := range strings.Split(rel, "/") {
			if part == ".." {
				t.Fatalf("toRoot(%q) = %q goes up", in, rel)
			}
		}
		// It names what the caller named: mapping back and forth agrees.
		if again, err := toRoot(toSandbox(rel), sandbox.UserSandbox); err != nil || again != rel {
			t.Fatalf("toRoot(toSandbox(%q)) = %q, %v", rel, again, err)
		}
		abs := in
		if !strings.HasPrefix(in, "/") {
			abs = homeDir + "/" + in
		}
		abs = path.Clean(abs)
		if abs != toSandbox(rel) && abs != strings.Replace(toSandbox(rel), homeDir, workspaceDir, 1) {
			t.Fatalf("toRoot(%q) = %q, which is %s, not %s", in, rel, toSandbox(rel), abs)
		}
	})
}

// A volume's path is the volume's root or a clean path below it: never
// absolute, never "..".
func FuzzVolumeRel(f *testing.F) {
	for _, s := range []string{"/", "", "a/b", "/../../etc/shadow", "..", "a/../../b", "/a//b/./c/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := volumeRel(p)
		if err != nil {
			return
		}
		if rel == "." {
			return
		}
		if strings.HasPrefix(rel, "/") || path.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") {
			t.Fatalf("%q gave %q", p, rel)
		}
	})
}

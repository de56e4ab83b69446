package e2b

import (
	"errors"
	"path"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

func TestToWorkspace(t *testing.T) {
	for _, c := range []struct {
		in, want string // want "" means refused
	}{
		{"/home/user", "."},
		{"/home/user/", "."},
		{"/home/user/a.txt", "a.txt"},
		{"/home/user/d/e/f.csv", "d/e/f.csv"},
		{"/home/user//d/./e", "d/e"},
		{"/home/user/d/../e", "e"},
		{"/workspace", "."},
		{"/workspace/out.png", "out.png"},
		{"a.txt", "a.txt"}, // relative to the home
		{"d/e", "d/e"},
		{"", "."},
		{".", "."},
		{"./x", "x"},
		{"x/../y", "y"},
		{"..", ""},
		{"../user/x", "x"}, // /home/user/../user/x is the home again
		{"../../etc/passwd", ""},
		{"/home/user/../../etc/passwd", ""},
		{"/home/userx/a", ""},
		{"/home", ""},
		{"/", ""},
		{"/etc/passwd", ""},
		{"/tmp/x", ""},
		{"/workspacex", ""},
		{"/home/user/a\x00b", ""},
		{"/home/user/" + strings.Repeat("a", maxPathLen), ""},
	} {
		got, err := toWorkspace(c.in)
		if c.want == "" {
			if err == nil || !errors.Is(err, sandbox.ErrBadPath) {
				t.Errorf("toWorkspace(%q) = %q, %v; want ErrBadPath", c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("toWorkspace(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestToSandboxAndDirs(t *testing.T) {
	if toSandbox(".") != "/home/user" || toSandbox("a/b") != "/home/user/a/b" {
		t.Fatal(toSandbox("."), toSandbox("a/b"))
	}
	for in, want := range map[string]string{"": "/home/user", "sub": "/home/user/sub", "/tmp/": "/tmp", "/home/user/../x": "/home/x"} {
		if got, err := sandboxDir(in); err != nil || got != want {
			t.Errorf("sandboxDir(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := sandboxDir("a\x00"); err == nil {
		t.Error("a NUL byte in a directory was accepted")
	}
}

// FuzzToWorkspace checks that whatever a client sends, an accepted path is
// a clean relative path that cannot name anything above the workspace, and
// that it maps back to the same place.
func FuzzToWorkspace(f *testing.F) {
	for _, s := range []string{"/home/user/a", "a/../../b", "/workspace/../home/user", "..", "/home/user/..", "./././x",
		"/home/user/\x00", "//home//user//x", "/home/user/.../x", "a/b/../../..", "/workspace//.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		rel, err := toWorkspace(in)
		if err != nil {
			if !errors.Is(err, sandbox.ErrBadPath) {
				t.Fatalf("toWorkspace(%q): %v is not ErrBadPath", in, err)
			}
			return
		}
		switch {
		case rel == "":
			t.Fatalf("toWorkspace(%q) accepted an empty path", in)
		case strings.HasPrefix(rel, "/"):
			t.Fatalf("toWorkspace(%q) = %q is absolute", in, rel)
		case strings.ContainsRune(rel, 0):
			t.Fatalf("toWorkspace(%q) = %q holds a NUL byte", in, rel)
		case path.Clean(rel) != rel:
			t.Fatalf("toWorkspace(%q) = %q is not clean", in, rel)
		}
		for _, part := range strings.Split(rel, "/") {
			if part == ".." {
				t.Fatalf("toWorkspace(%q) = %q goes up", in, rel)
			}
		}
		// It names what the caller named: mapping back and forth agrees.
		if again, err := toWorkspace(toSandbox(rel)); err != nil || again != rel {
			t.Fatalf("toWorkspace(toSandbox(%q)) = %q, %v", rel, again, err)
		}
		abs := in
		if !strings.HasPrefix(in, "/") {
			abs = homeDir + "/" + in
		}
		abs = path.Clean(abs)
		if abs != toSandbox(rel) && abs != strings.Replace(toSandbox(rel), homeDir, workspaceDir, 1) {
			t.Fatalf("toWorkspace(%q) = %q, which is %s, not %s", in, rel, toSandbox(rel), abs)
		}
	})
}

package rootview

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// The skeleton holds the synthetic /etc, the runner and its shims, the
// host's top-level directories as links into /usr or mount points, the
// links of /root, /var/tmp and /home/user, and the mount points. Runs
// without root.
func TestRootSkeleton(t *testing.T) {
	dir := t.TempDir()
	if err := RootSkeleton(dir, map[string][]byte{"runner.py": []byte("print()")}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"etc/hostname":           "sandbox\n",
		"etc/passwd":             etcGenerated["passwd"],
		"etc/resolv.conf":        "",
		"opt/vivarium/runner.py": "print()",
	} {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != want {
			t.Errorf("%s: %q (%v), want %q", name, got, err, want)
		}
	}
	links := map[string]string{"root": "workspace", "var/tmp": "../tmp", "home/user": "/workspace"}
	for name, target := range sandbox.Shims {
		links[sandbox.ShimDir[1:]+"/"+name] = target
	}
	for _, top := range HostTopLevel("/") {
		if top.Link != "" {
			links[top.Name] = top.Link
		}
	}
	for name, want := range links {
		if got, err := os.Readlink(filepath.Join(dir, name)); err != nil || got != want {
			t.Errorf("%s links to %q (%v), want %q", name, got, err, want)
		}
	}
	for _, d := range append([]string{"/usr", "/workspace", "/tmp", "/proc", "/dev", RunnerDir + "/bin"}, TopLevelBinds()...) {
		if fi, err := os.Lstat(filepath.Join(dir, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v, want a directory", d, err)
		}
	}
}

// The host's /etc gives the sandbox its public files and links, never
// one the host keeps from other users, nor one not on the list. Runs
// without root.
func TestHostEtc(t *testing.T) {
	etc := t.TempDir()
	for name, mode := range map[string]os.FileMode{"mime.types": 0o644, "protocols": 0o600, "shadow": 0o644,
		"ssl/openssl.cnf": 0o644, "ssl/private/key.pem": 0o644} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(etc, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(etc, name), []byte(name), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/usr/share/zoneinfo/Etc/UTC", filepath.Join(etc, "localtime")); err != nil {
		t.Fatal(err)
	}
	files, err := HostEtc(etc)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]File{}
	for _, f := range files {
		got[f.Path] = f
	}
	for _, name := range []string{"mime.types", "ssl/openssl.cnf"} {
		if string(got[name].Data) != name {
			t.Errorf("%s: %q, want the host's", name, got[name].Data)
		}
	}
	if l := got["localtime"].Link; l != "/usr/share/zoneinfo/Etc/UTC" {
		t.Errorf("localtime links to %q, want the host's target", l)
	}
	for _, name := range []string{"protocols", "shadow", "ssl/private/key.pem"} {
		if _, ok := got[name]; ok {
			t.Errorf("%s copied from the host", name)
		}
	}
	for name, data := range etcGenerated {
		if string(got[name].Data) != data {
			t.Errorf("%s: %q, want the sandbox's own", name, got[name].Data)
		}
	}
}

// Top-level directories are links where the host links them into /usr,
// binds where they are directories, and left out otherwise. Runs without
// root.
func TestHostTopLevel(t *testing.T) {
	root := t.TempDir()
	for _, l := range []struct{ name, target string }{{"bin", "usr/bin"}, {"lib", "/etc"}} {
		if err := os.Symlink(l.target, filepath.Join(root, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	got := HostTopLevel(root)
	want := []TopDir{{Name: "bin", Link: "usr/bin"}, {Name: "lib64"}}
	if !slices.Equal(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
}

// A file's path stays inside the directory it is written under. Runs
// without root.
func TestWriteFilesInside(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "etc")
	if err := WriteFiles(dir, []File{{Path: "../../outside", Data: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(parent, "outside")); err == nil {
		t.Error("written outside the directory")
	}
	if got, err := os.ReadFile(filepath.Join(dir, "outside")); err != nil || string(got) != "x" {
		t.Errorf("outside: %q (%v), want it in the directory", got, err)
	}
	if err := WriteFiles(dir, []File{{Path: ".", Data: []byte("x")}}); err == nil {
		t.Error("a file at the directory itself written")
	}
}

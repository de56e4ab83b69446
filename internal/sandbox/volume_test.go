package sandbox

import (
	"errors"
	"path"
	"strings"
	"testing"
)

func TestValidVolumePath(t *testing.T) {
	for _, p := range []string{"/home/user/data", "/workspace/x/y", "/mnt", "/mnt/v", "/data", "/srv/a", "/opt/tools",
		"/tmp/scratch", "/root/v", "/media/usb"} {
		if err := ValidVolumePath(p); err != nil {
			t.Errorf("%s refused: %v", p, err)
		}
	}
	for _, p := range []string{"", "/", "relative", "/home/user", "/workspace", "/home/user/../../etc", "/home/user/./x",
		"/home/user/x/", "//mnt/x", "/etc", "/etc/x", "/usr/lib", "/proc/1", "/dev/shm/x", "/sys/x", "/opt", "/opt/vivarium",
		"/opt/vivarium/x", "/bin/x", "/var/tmp/x", "/tmp", "/root", "/home/other/x", "/mnt/x\x00y",
		"/mnt/" + strings.Repeat("a", 256), "/mnt" + strings.Repeat("/a", 16)} {
		if err := ValidVolumePath(p); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
}

func TestOverlappingVolumes(t *testing.T) {
	v := func(p string) VolumeMount { return VolumeMount{Path: p, Mount: noMount, Name: "n"} }
	if err := validVolumes([]VolumeMount{v("/mnt/a"), v("/mnt/ab")}); err != nil {
		t.Fatal(err)
	}
	for _, vs := range [][]VolumeMount{{v("/mnt/a"), v("/mnt/a")}, {v("/mnt"), v("/mnt/a")}, {v("/mnt/a/b"), v("/mnt/a")},
		{v("/home/user/a"), v("/workspace/a")}, {v("/workspace/a"), v("/home/user/a/b")}} {
		if err := validVolumes(vs); err == nil {
			t.Errorf("%v accepted", vs)
		}
	}
	if err := validVolumes([]VolumeMount{{Path: "/mnt/a", Name: "n"}}); err == nil {
		t.Error("a volume without a file system accepted")
	}
}

// What ValidVolumePath accepts is an absolute, clean path below one of the
// user's places, never a system directory.
func FuzzValidVolumePath(f *testing.F) {
	for _, s := range []string{"/home/user/data", "/mnt", "/../etc", "/opt/vivarium/x", "/mnt/./x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if ValidVolumePath(p) != nil {
			return
		}
		if path.Clean(p) != p || !strings.HasPrefix(p, "/") || strings.Contains(p, "\x00") {
			t.Fatalf("accepted %q", p)
		}
		for _, sys := range []string{"/etc", "/usr", "/proc", "/dev", "/sys", "/bin", "/lib", "/var", "/run", "/opt/vivarium"} {
			if p == sys || strings.HasPrefix(p, sys+"/") {
				t.Fatalf("accepted %q, in %s", p, sys)
			}
		}
		if p == "/home/user" || p == "/workspace" || p == "/" {
			t.Fatalf("accepted %q", p)
		}
	})
}

// noMount stands for a volume's file system where none is mounted.
func noMount() (int, error) { return -1, errors.New("no volume in this test") }

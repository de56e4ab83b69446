package native_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/voltest"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

func execOK(t *testing.T, sb sandbox.Sandbox, code string) string {
	t.Helper()
	res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: code}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != sandbox.StatusOK {
		t.Fatalf("%s: %+v", code, res)
	}
	return res.Stdout
}

// mountHolders lists the processes in other mount namespaces than this
// one that see a mount of a loop device whose image is under dir, as
// "pid (name)".
func mountHolders(dir string) []string {
	var keys []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && strings.HasPrefix(string(b), dir) {
			keys = append(keys, " /dev/"+filepath.Base(filepath.Dir(filepath.Dir(f)))+" ")
		}
	}
	var out []string
	own, _ := os.Readlink("/proc/self/ns/mnt")
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if ns, _ := os.Readlink(p + "/ns/mnt"); ns == own {
			continue // the host's, which has none
		}
		mi, err := os.ReadFile(p + "/mountinfo")
		if err != nil || !slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(string(mi), k) }) {
			continue
		}
		comm, _ := os.ReadFile(p + "/comm")
		out = append(out, fmt.Sprintf("%s (%s)", filepath.Base(p), strings.TrimSpace(string(comm))))
	}
	return out
}

// Two sandboxes (each its own host user) mount one volume at once and see
// each other's writes, owned by their own user; the volume outlives them,
// its size is the kernel's limit, and nothing of it is left mounted or
// attached once they end.
func TestVolumesSharedOwnedAndBounded(t *testing.T) {
	b := newBackend(t)
	st, dir := voltest.TempVolumes(t)
	v, err := st.Create("alice", "data", 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	mount := func(path string) (sandbox.Sandbox, *volume.Lease) {
		t.Helper()
		l, err := st.Acquire("alice", "data", true)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := b.Create(context.Background(), sandbox.Spec{Home: sandbox.HomeUser,
			Volumes: []sandbox.VolumeMount{{Path: path, Mount: l.Mount, Name: v.Name}}})
		if err != nil {
			l.Release()
			t.Fatal(err)
		}
		return sb, l
	}
	a, la := mount("/home/user/data")
	bb, lb := mount("/mnt/shared")
	execOK(t, a, `open("/home/user/data/from_a.txt", "w").write("hello from a")`)
	if got := execOK(t, bb, `import os
print(open("/mnt/shared/from_a.txt").read(), os.stat("/mnt/shared/from_a.txt").st_uid, os.getuid())`); got != "hello from a 1000 1000\n" {
		t.Fatalf("b read %q", got)
	}
	// On disk, the sandbox user's own id, whatever host user it was.
	var hst unix.Stat_t
	if err := unix.Lstat(filepath.Join(la.Dir(), "from_a.txt"), &hst); err != nil || hst.Uid != 1000 || hst.Gid != 1000 {
		t.Fatalf("on disk: %v uid %d gid %d", err, hst.Uid, hst.Gid)
	}
	execOK(t, bb, `import os; os.mkdir("/mnt/shared/dir"); open("/mnt/shared/dir/from_b", "w").write("b")`)
	if got := execOK(t, a, `print(open("/home/user/data/dir/from_b").read())`); got != "b\n" {
		t.Fatalf("a read %q", got)
	}
	// Past its size: ENOSPC in the sandbox, and the image keeps its size.
	res, err := a.Execute(context.Background(), sandbox.ExecRequest{Code: `import errno
try:
    with open("/home/user/data/big", "wb") as f:
        for _ in range(64):
            f.write(b"x" * (1 << 20))
            f.flush()
    print("wrote it all")
except OSError as e:
    print("errno", errno.errorcode[e.errno])`}, nil)
	if err != nil || strings.TrimSpace(res.Stdout) != "errno ENOSPC" {
		t.Fatalf("64 MiB into a 32 MiB volume: %v %+v", err, res)
	}
	image := filepath.Join(dir, v.ID, "image")
	if fi, err := os.Stat(image); err != nil || fi.Size() != 32<<20 {
		t.Fatalf("image: %v %v", fi.Size(), err)
	}
	// Set-id bits are not honoured in the volume, device nodes cannot be
	// made; the server's mount of it is noexec, nosuid, nodev.
	var sfs unix.Statfs_t
	if err := unix.Statfs(la.Dir(), &sfs); err != nil {
		t.Fatal(err)
	}
	if want := int64(unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC); sfs.Flags&want != want {
		t.Fatalf("host mount flags %#x", sfs.Flags)
	}
	if got := execOK(t, a, `import os
st = os.statvfs("/home/user/data")
print(bool(st.f_flag & os.ST_NOSUID), bool(st.f_flag & os.ST_NODEV))`); got != "True True\n" {
		t.Fatalf("sandbox mount flags: %q", got)
	}

	for _, c := range []struct {
		sb sandbox.Sandbox
		l  *volume.Lease
	}{{a, la}, {bb, lb}} {
		if err := c.sb.Close(); err != nil {
			t.Fatal(err)
		}
		c.l.Release()
	}
	// The kernel lets go of a dead sandbox's mounts, and so of the
	// device, a moment after its last process.
	for deadline := time.Now().Add(10 * time.Second); voltest.LoopsBacking(dir) > 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			// Seen once, with three test packages at once: who still has
			// a mount of it (a mount namespace copied from the host's
			// while it was mounted there keeps it).
			t.Fatalf("the volume's loop device did not detach within 10 s of its sandboxes' end; its mounts are held by %v",
				mountHolders(dir))
		}
	}
	// The files outlived both sandboxes, owned by the sandbox user on disk.
	err = st.Content("alice", "data", func(_ volume.Volume, d *volume.Dir) error {
		fi, err := d.Stat("dir/from_b")
		if err != nil {
			return err
		}
		if fi.Size != 1 {
			t.Errorf("from_b: %+v", fi)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A volume's mount path is checked before anything starts; a link
// planted in a volume leads nowhere outside it when mounted.
func TestVolumePathsAndLinks(t *testing.T) {
	b := newBackend(t)
	st, _ := voltest.TempVolumes(t)
	if _, err := st.Create("alice", "v", 0); err != nil {
		t.Fatal(err)
	}
	l, err := st.Acquire("alice", "v", true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	for _, p := range []string{"/", "/etc", "/usr/lib", "/proc/x", "/opt/vivarium", "/home/user/../../etc", "data", "/home/user"} {
		_, err := b.Create(context.Background(), sandbox.Spec{Volumes: []sandbox.VolumeMount{{Path: p, Mount: l.Mount, Name: "v"}}})
		if err == nil {
			t.Fatalf("mounted at %q", p)
		}
	}
	// A host file the sandbox must never read, named by absolute path.
	canary := filepath.Join(t.TempDir(), "canary")
	token := "canary-" + filepath.Base(filepath.Dir(canary))
	if err := os.WriteFile(canary, []byte(token), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"canary": canary, "up": "../../../../.." + canary,
		"host": "/proc/1/root" + canary, "shadow": "/etc/shadow"} {
		if err := os.Symlink(target, filepath.Join(l.Dir(), name)); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := b.Create(context.Background(), sandbox.Spec{Volumes: []sandbox.VolumeMount{{Path: "/data", Mount: l.Mount, Name: "v"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	// Links resolve inside the sandbox, to the sandbox's own files.
	got := execOK(t, sb, `out = []
for p in ["/data/canary", "/data/up", "/data/host", "/data/shadow"]:
    try:
        out.append(open(p).read())
    except OSError as e:
        out.append(type(e).__name__)
print(out)`)
	if strings.Contains(got, token) || strings.Contains(got, "root:") || !strings.Contains(got, "FileNotFoundError") {
		t.Fatalf("read the host's files through a volume's links: %s", got)
	}
}

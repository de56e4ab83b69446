//go:build linux

package hostile

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// noVolumes: the backends other than native mount no volume; a sandbox
// that asks for one is refused before it starts (sandbox.CheckVolumes,
// TestMuxVolumes), never made without it.
const noVolumes = "this backend mounts no volumes: a sandbox asking for one is refused before it starts"

// A persistent volume, mounted at /mnt/vol: what a sandbox can do to it
// and, through it, to the host. Its links (planted on the host, as another
// sandbox of the key could) resolve inside the sandbox; its mount cannot
// be undone, moved or made to honour set-id bits; no device is made in it
// and nothing outside it is linked in. Another sandbox of the key on the
// same volume that hands over descriptors of its root and /proc on a
// socket there gives only what any other user may have of them
// (docs/security.md, Volumes: a decision, not prevented); what such
// descriptors keep after their giver ended (a memfd's pages) stays
// within the key's memory ceiling (TestCeilingBoundsHandedMemory,
// internal/backend/native).
var volumeCases = []hostileCase{
	{
		name: "volume_escape",
		code: `
import ctypes, errno, os
out = []
def name(e):
    return errno.errorcode.get(e, str(e))
def attempt(what, fn):
    try:
        fn()
        out.append(what + " ok")
    except OSError as e:
        out.append(what + " " + name(e.errno))
secret = os.environ["SECRET_PATH"]
attempt("read link to the secret", lambda: open("/mnt/vol/secret").read())
attempt("read up and out", lambda: open("/mnt/vol/up" + secret).read())
attempt("read through /proc/1/root", lambda: open("/mnt/vol/hostroot" + secret).read())
libc = ctypes.CDLL(None, use_errno=True)
def call(what, rc):
    out.append(what + (" ok" if rc == 0 else " refused"))
MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2
call("umount", libc.umount2(b"/mnt/vol", MNT_DETACH))
call("remount with set-id bits", libc.mount(None, b"/mnt/vol", None, MS_REMOUNT | MS_BIND, None))
call("bind elsewhere", libc.mount(b"/mnt/vol", b"/tmp", None, MS_BIND, None))
attempt("mknod", lambda: os.mknod("/mnt/vol/null", 0o20666, os.makedev(1, 3)))
attempt("hard link from outside", lambda: os.link("/etc/passwd", "/mnt/vol/passwd"))
open("/mnt/vol/suid", "w").write("x")
os.chmod("/mnt/vol/suid", 0o4755)
st = os.statvfs("/mnt/vol")
out.append("nosuid %s nodev %s" % (bool(st.f_flag & os.ST_NOSUID), bool(st.f_flag & os.ST_NODEV)))
print("\n".join(out))
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			st, err := volume.Open(volume.Config{Dir: filepath.Join(t.TempDir(), "volumes"), MaxSize: 16 << 20})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			if err := st.Unavailable(); err != nil {
				t.Skipf("volumes unavailable on this host: %v", err)
			}
			if _, err := st.Create("hostile", "v", 0); err != nil {
				t.Fatal(err)
			}
			l, err := st.Acquire("hostile", "v", true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Release) // the one-shot sandbox has ended by then
			for name, target := range map[string]string{"secret": h.canaries.SecretPath, "up": "../../../../../..",
				"hostroot": "/proc/1/root"} {
				if err := os.Symlink(target, filepath.Join(l.Dir(), name)); err != nil {
					t.Fatal(err)
				}
			}
			j.vars["SECRET_PATH"] = h.canaries.SecretPath
			j.vars["HOST_DIR"] = l.Dir() // this process's path to the store's mount, until Release
			j.Spec.Volumes = []sandbox.VolumeMount{{Path: "/mnt/vol", Mount: l.Mount, Name: "v"}}
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusOK, 0)
			if h.canaries.LeakedIn(o.Stdout + o.Stderr) {
				t.Fatalf("the secret leaked through the volume: %s", describe(o))
			}
			t.Logf("in the sandbox:\n%s", o.Stdout)
			got := strings.Split(strings.TrimSpace(o.Stdout), "\n")
			for _, l := range got {
				if strings.HasSuffix(l, " ok") {
					t.Errorf("allowed: %s", l)
				}
			}
			if len(got) != 9 || got[8] != "nosuid True nodev True" {
				t.Fatalf("unexpected outcome: %s", describe(o))
			}
			// The server's mount of the volume is as it was.
			var sfs unix.Statfs_t
			if err := unix.Statfs(o.vars["HOST_DIR"], &sfs); err != nil {
				t.Fatal(err)
			}
			if want := int64(unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC); sfs.Flags&want != want {
				t.Fatalf("the server's mount of the volume now has flags %#x", sfs.Flags)
			}
		},
	},
	{
		name: "volume_pass_descriptors",
		code: `
import errno, os, socket
out = []
def attempt(what, fn):
    try:
        r = fn()
        out.append(what + " ok")
        return r
    except OSError as e:
        out.append(what + " " + errno.errorcode.get(e.errno, str(e.errno)))
def read(dirfd, path):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK, dir_fd=dirfd)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)
def listing(dirfd, path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dirfd)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)
def create(dirfd, path):
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o666, dir_fd=dirfd))
c = socket.socket(socket.AF_UNIX)
c.connect("/mnt/vol/rendezvous")
msg, fds, flags, addr = socket.recv_fds(c, 16, 8)
out.append("received %d" % len(fds))
root, proc = fds
attempt("read its private file", lambda: read(root, "workspace/private.txt"))
attempt("create in its /tmp", lambda: create(root, "tmp/planted"))
attempt("create in its workspace", lambda: create(root, "workspace/planted"))
attempt("the host's secret through its root", lambda: read(root, os.environ["SECRET_PATH"].lstrip("/")))
attempt("its init's environ", lambda: read(proc, "1/environ"))
attempt("its init's memory", lambda: read(proc, "1/mem"))
attempt("its init's root", lambda: listing(proc, "1/root/"))
attempt("its init's descriptors", lambda: listing(proc, "1/fd"))
attempt("its init's cwd", lambda: os.readlink("1/cwd", dir_fd=proc))
here = attempt("list its root", lambda: listing(root, "."))
up = attempt("list above its root", lambda: listing(root, "../.."))
out.append("above its root: " + ("its root" if up == here else "elsewhere"))
print("\n".join(out))
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			st, err := volume.Open(volume.Config{Dir: filepath.Join(t.TempDir(), "volumes"), MaxSize: 16 << 20})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			if err := st.Unavailable(); err != nil {
				t.Skipf("volumes unavailable on this host: %v", err)
			}
			if _, err := st.Create("hostile", "v", 0); err != nil {
				t.Fatal(err)
			}
			// The sender: another sandbox of the same key on the same
			// volume, which binds a socket there and gives whoever
			// connects descriptors of its own root and /proc.
			sl, err := st.Acquire("hostile", "v", true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(sl.Release)
			sender, err := h.be.B.Create(context.Background(), sandbox.Spec{Limits: baseLimits,
				Volumes: []sandbox.VolumeMount{{Path: "/mnt/vol", Mount: sl.Mount, Name: "v"}}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				// Nothing the receiver tried was made in the sender.
				res, err := sender.Execute(context.Background(), sandbox.ExecRequest{Code: `import os
print([p for p in ("/tmp/planted", "/workspace/planted") if os.path.lexists(p)])`}, nil)
				if err != nil || strings.TrimSpace(res.Stdout) != "[]" {
					t.Errorf("the receiver made files in the sender: %v %+v", err, res)
				}
				sender.Close()
			})
			res, err := sender.Execute(context.Background(), sandbox.ExecRequest{Code: `import os, socket, threading
with open("/workspace/private.txt", "w") as f:
    f.write("the sender's own")
os.chmod("/workspace/private.txt", 0o600)
srv = socket.socket(socket.AF_UNIX)
srv.bind("/mnt/vol/rendezvous")
srv.listen(1)
fds = [os.open("/", os.O_PATH | os.O_DIRECTORY), os.open("/proc", os.O_PATH | os.O_DIRECTORY)]
def serve():
    c, _ = srv.accept()
    socket.send_fds(c, [b"fds"], fds)
    c.close()
threading.Thread(target=serve, daemon=True).start()`}, nil)
			if err != nil || res.Status != sandbox.StatusOK {
				t.Fatalf("the sender: %v %+v", err, res)
			}
			l, err := st.Acquire("hostile", "v", true)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.Release) // the one-shot sandbox has ended by then
			j.vars["SECRET_PATH"] = h.canaries.SecretPath
			j.Spec.Volumes = []sandbox.VolumeMount{{Path: "/mnt/vol", Mount: l.Mount, Name: "v"}}
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusOK, 0)
			if h.canaries.LeakedIn(o.Stdout + o.Stderr) {
				t.Fatalf("the secret leaked through a received descriptor: %s", describe(o))
			}
			t.Logf("in the receiving sandbox:\n%s", o.Stdout)
			got := strings.Split(strings.TrimSpace(o.Stdout), "\n")
			if len(got) != 13 || got[0] != "received 2" || got[12] != "above its root: its root" {
				t.Fatalf("unexpected outcome: %s", describe(o))
			}
			// What the receiver may do with them is what any other user
			// may do with the sender's files: list what its modes let
			// others list (docs/security.md, Volumes). Nothing else.
			for _, l := range got[1:10] {
				if strings.HasSuffix(l, " ok") {
					t.Errorf("allowed: %s", l)
				}
			}
		},
	},
}

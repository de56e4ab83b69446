package image

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"golang.org/x/sys/unix"
)

// rootChild is set in the environment of the process TestRootMount
// starts in a user namespace: it attaches the image root it is given as
// fd 3 and says what it sees.
const rootChild = "VIVARIUM_IMAGE_ROOT_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(rootChild); dir != "" {
		json.NewEncoder(os.Stdout).Encode(inspectRoot(dir))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rootSeen is what a process of the user namespace sees of an image root.
type rootSeen struct {
	Attach       string
	AUID, BUID   uint32
	AMode        uint32
	AContent     string
	GoneExists   bool
	Write, Mknod string
	RemountSUID  string
	WroteBack    string
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func inspectRoot(dir string) rootSeen {
	var r rootSeen
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		r.Attach = "make mounts private: " + err.Error()
		return r
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		r.Attach = "tmpfs: " + err.Error()
		return r
	}
	root := filepath.Join(dir, "root")
	os.Mkdir(root, 0o755)
	if err := unix.MoveMount(3, "", unix.AT_FDCWD, root, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		r.Attach = "move_mount: " + err.Error()
		return r
	}
	var st unix.Stat_t
	if unix.Stat(filepath.Join(root, "etc/a"), &st) == nil {
		r.AUID, r.AMode = st.Uid, st.Mode&0o7777
	}
	if unix.Stat(filepath.Join(root, "etc/b"), &st) == nil {
		r.BUID = st.Uid
	}
	b, _ := os.ReadFile(filepath.Join(root, "etc/a"))
	r.AContent = string(b)
	_, err := os.Lstat(filepath.Join(root, "etc/gone"))
	r.GoneExists = err == nil
	r.Write = errString(os.WriteFile(filepath.Join(root, "etc/a"), []byte("written"), 0o600))
	b, _ = os.ReadFile(filepath.Join(root, "etc/a"))
	r.WroteBack = string(b)
	r.Mknod = errString(unix.Mknod(filepath.Join(root, "mem"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 1))))
	return r
}

// TestRootMount stacks an image's layers, idmapped to a user namespace,
// and has a process of such a namespace attach and use them: the image's
// owners are the namespace's, a whiteout hides, writes go to the upper
// layer (owned by the namespace's root on the host), the layers stay as
// they were, and no device node or suid can be had.
func TestRootMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: idmapped mounts and overlayfs")
	}
	const hostBase = 3_900_000_000 // the namespace's root on the host
	s, _ := openStore(t, DefaultLimits)
	img := testImage(t,
		layerTar(t, entry{name: "etc/a", body: "root's", mode: 0o600}, entry{name: "etc/b", body: "user's", uid: 1000},
			entry{name: "etc/gone", body: "x"}),
		layerTar(t, entry{name: "etc/.wh.gone"}))
	im, err := s.Add(context.Background(), "example.test/root:1", img, nil)
	if err != nil {
		t.Fatal(err)
	}
	userns := testutil.UserNamespace(t, int(hostBase))

	rw := t.TempDir()
	if err := unix.Mount("tmpfs", rw, "tmpfs", 0, "size=4m,mode=700"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(rw, unix.MNT_DETACH)
	upper, work := filepath.Join(rw, "upper"), filepath.Join(rw, "work")
	for _, d := range []string{upper, work} {
		os.Mkdir(d, 0o755)
		os.Chown(d, hostBase, hostBase)
	}
	os.Chmod(rw, 0o755)
	root, err := s.RootMount(im.Layers, userns, upper, work)
	if errors.Is(err, ErrNoIdmap) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()

	// The namespace's root is no user of the host: the test binary and
	// the directory it mounts on are where any user reaches them.
	open, err := os.MkdirTemp("", "vivarium-image-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(open)
	os.Chmod(open, 0o755)
	bin := filepath.Join(open, "image.test")
	if b, err := os.ReadFile(os.Args[0]); err != nil || os.WriteFile(bin, b, 0o755) != nil {
		t.Fatalf("copy the test binary: %v", err)
	}
	os.Mkdir(filepath.Join(open, "mnt"), 0o755)
	child := exec.Command(bin, "-test.run=^$")
	child.Env = append(os.Environ(), rootChild+"="+filepath.Join(open, "mnt"))
	child.ExtraFiles = []*os.File{root}
	child.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{},
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostBase, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostBase, Size: 65536}}}
	out, err := child.Output()
	if err != nil {
		t.Fatalf("the namespace's process: %v", err)
	}
	var seen rootSeen
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if seen.Attach != "" {
		t.Fatalf("attach the image root: %s", seen.Attach)
	}
	if seen.AUID != 0 || seen.AMode != 0o600 || seen.AContent != "root's" || seen.BUID != 1000 {
		t.Errorf("the namespace sees etc/a owned by %d, mode %o, reading %q, etc/b owned by %d: want the image's owners",
			seen.AUID, seen.AMode, seen.AContent, seen.BUID)
	}
	if seen.GoneExists {
		t.Error("a file the top layer whites out is seen")
	}
	if seen.Write != "" || seen.WroteBack != "written" {
		t.Errorf("the namespace's root could not write its root's file: %q, reads back %q", seen.Write, seen.WroteBack)
	}
	if seen.Mknod == "" {
		t.Error("a device node was made in the image root")
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(upper, "etc/a"), &st); err != nil || st.Uid != hostBase {
		t.Errorf("the written file in the upper layer: owner %d (%v), want the namespace's root %d", st.Uid, err, hostBase)
	}
	if b, _ := os.ReadFile(filepath.Join(s.LayerDir(im.Layers[0]), "etc/a")); string(b) != "root's" {
		t.Errorf("the layer itself was changed: %q", b)
	}
}

// TestCheckRootMount: this host's probe says what TestRootMount shows in
// full (an idmapped root, attached in a user namespace, its files the
// namespace's own).
func TestCheckRootMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: idmapped mounts and overlayfs")
	}
	if err := CheckRootMount(); err != nil {
		t.Fatal(err)
	}
}

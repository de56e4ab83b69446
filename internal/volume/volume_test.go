package volume

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// open opens a store in a temporary directory, skipping where the host
// cannot keep volumes.
func open(t testing.TB, dir string) *Store {
	t.Helper()
	testutil.RequireRoot(t, "loop devices and mounts")
	s, err := Open(Config{Dir: dir, MaxSize: 64 << 20, MaxPerOwner: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Unavailable(); err != nil {
		t.Skipf("volumes unavailable here: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// loopsOf lists the loop devices whose backing file is under dir.
func loopsOf(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	ents, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, p := range ents {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir) {
			out = append(out, p)
		}
	}
	return out
}

// mountsUnder lists this mount namespace's mounts at or under dir: the
// store makes none (its mounts are detached).
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

func TestNames(t *testing.T) {
	for _, n := range []string{"data", "my-vol_1.x", "A", strings.Repeat("a", MaxNameLen)} {
		if err := ValidName(n); err != nil {
			t.Errorf("%q refused: %v", n, err)
		}
	}
	for _, n := range []string{"", ".", "..", "../x", "/", "a/b", "/etc", ".hidden", "-x", "a b", "a\x00b",
		strings.Repeat("a", MaxNameLen+1), "é"} {
		if err := ValidName(n); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q accepted", n)
		}
	}
}

func TestLifecycleOwnersAndLimit(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	v, err := s.Create("alice", "data", 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create("alice", "data", 0); !errors.Is(err, ErrExists) {
		t.Fatalf("second volume of one name: %v", err)
	}
	if _, err := s.Create("alice", "big", 65<<20); !errors.Is(err, ErrInvalid) {
		t.Fatalf("volume over the operator's cap: %v", err)
	}
	// Another key sees nothing of alice's, by ID or by name.
	for _, ref := range []string{v.ID, "data"} {
		if _, err := s.Get("bob", ref); !errors.Is(err, ErrNotFound) {
			t.Fatalf("bob got alice's %s: %v", ref, err)
		}
		if _, err := s.Acquire("bob", ref, true); !errors.Is(err, ErrNotFound) {
			t.Fatalf("bob mounted alice's %s: %v", ref, err)
		}
		if err := s.Delete("bob", ref); !errors.Is(err, ErrNotFound) {
			t.Fatalf("bob deleted alice's %s: %v", ref, err)
		}
	}
	if l := s.List("bob"); len(l) != 0 {
		t.Fatalf("bob lists %v", l)
	}
	// Its whole size is taken on the host's disk from the start: what
	// its sandboxes write cannot run the disk out later.
	var st = mustStat(t, filepath.Join(dir, v.ID, "image"))
	if st < 32<<20 {
		t.Fatalf("a new 32 MiB volume takes only %d bytes of the host's disk", st)
	}

	// Past the size: the kernel says no space, the image stays its size.
	err = s.Content("alice", "data", func(_ Volume, d *Dir) error {
		if err := d.WriteFile("small.txt", strings.NewReader("hello"), 1<<30); err != nil {
			return err
		}
		return d.WriteFile("huge.bin", zeros{}, 1<<30)
	})
	if !errors.Is(err, sandbox.ErrTooLarge) {
		t.Fatalf("writing 1 GiB into a 32 MiB volume: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, v.ID, "image")); fi.Size() != 32<<20 {
		t.Fatalf("image grew to %d", fi.Size())
	}
	if m := mountsUnder(t, dir); len(m) != 0 {
		t.Fatalf("mounted after the content request: %v", m)
	}
	if l := loopsOf(t, dir); len(l) != 0 {
		t.Fatalf("loop devices left: %v", l)
	}

	// In use by a sandbox: no deletion.
	l, err := s.Acquire("alice", v.ID, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("alice", "data"); !errors.Is(err, ErrInUse) {
		t.Fatalf("delete in use: %v", err)
	}
	l.Release()
	l.Release() // once only

	// Persisted: a new store over the same directory has it, with its file.
	s.Close()
	s = open(t, dir)
	err = s.Content("alice", "data", func(_ Volume, d *Dir) error {
		r, _, err := d.OpenFile("small.txt")
		if err != nil {
			return err
		}
		defer r.Close()
		b, _ := io.ReadAll(r)
		if string(b) != "hello" {
			t.Errorf("read back %q", b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("alice", "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, v.ID)); !os.IsNotExist(err) {
		t.Fatalf("volume directory left: %v", err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if _, err := s.Create("alice", n, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Create("alice", "d", 0); !errors.Is(err, ErrQuota) {
		t.Fatalf("fourth volume: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if l := loopsOf(t, dir); len(l) != 0 {
		t.Fatalf("loop devices left: %v", l)
	}
	if m := mountsUnder(t, dir); len(m) != 0 {
		t.Fatalf("mounted after Close: %v", m)
	}
}

// A link planted in a volume does not lead the content API out of it.
func TestContentLinksStayInside(t *testing.T) {
	s := open(t, t.TempDir())
	defer s.Close()
	if _, err := s.Create("alice", "v", 0); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire("alice", "v", true)
	if err != nil {
		t.Fatal(err)
	}
	// What a sandbox could make in its volume.
	for name, target := range map[string]string{"shadow": "/etc/shadow", "up": "../../..", "etc": "/etc"} {
		if err := os.Symlink(target, filepath.Join(l.Dir(), name)); err != nil {
			t.Fatal(err)
		}
	}
	err = s.Content("alice", "v", func(_ Volume, d *Dir) error {
		for _, p := range []string{"shadow", "up/etc/shadow", "etc/shadow", "etc/passwd"} {
			if r, _, err := d.OpenFile(p); err == nil {
				r.Close()
				t.Errorf("%s opened through a link", p)
			}
		}
		if err := d.WriteFile("etc/evil", strings.NewReader("x"), 10); err == nil {
			t.Error("wrote through a link to /etc")
		}
		if _, err := d.ReadDir("up", 1); err == nil {
			t.Error("listed through a link")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/etc/evil"); err == nil {
		t.Fatal("/etc/evil exists")
	}
	l.Release()
}

// The content API reaches a volume as the sandbox's user: what a
// sandbox's root keeps to itself there (a 0600 file in a 0700 directory,
// a file only its group may read) is refused, as it is to that user in a
// sandbox; what the user may read and write, it reads and writes. The
// server's own threads keep root's identity.
func TestContentAsSandboxUser(t *testing.T) {
	s := open(t, t.TempDir())
	if _, err := s.Create("alice", "v", 0); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire("alice", "v", true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	// The server in root's group, as a root login is: the group's files
	// are not the sandbox user's for that.
	groups, err := syscall.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setgroups([]int{0}); err != nil { // every thread's
		t.Fatal(err)
	}
	defer syscall.Setgroups(groups)
	// What a sandbox's root (uid and gid 0 on the volume's disk) makes.
	root := l.Dir()
	for _, f := range []struct {
		name string
		mode os.FileMode
		dir  bool
	}{
		{"private", 0o700, true}, {"private/secret", 0o600, false}, {"group-only", 0o640, false},
		{"public", 0o644, false}, {"shut", 0o755, true},
	} {
		p := filepath.Join(root, f.name)
		if f.dir {
			err = os.Mkdir(p, f.mode)
		} else {
			err = os.WriteFile(p, []byte("root's"), f.mode)
		}
		if err == nil {
			err = os.Chmod(p, f.mode) // past the umask
		}
		if err == nil {
			err = os.Chown(p, 0, 0)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	err = s.Content("alice", "v", func(_ Volume, d *Dir) error {
		for _, p := range []string{"private/secret", "group-only"} {
			if r, _, err := d.OpenFile(p); !errors.Is(err, sandbox.ErrPermission) {
				if err == nil {
					r.Close()
				}
				t.Errorf("read %s, the sandbox root's own: %v, want a permission error", p, err)
			}
		}
		if _, err := d.Stat("private/secret"); !errors.Is(err, sandbox.ErrPermission) {
			t.Errorf("stat in the root's 0700 directory: %v", err)
		}
		if _, err := d.ReadDir("private", 1); !errors.Is(err, sandbox.ErrPermission) {
			t.Errorf("list the root's 0700 directory: %v", err)
		}
		if _, err := d.FileMetadata("private/secret"); err == nil {
			t.Error("metadata of a file in the root's 0700 directory")
		}
		for _, p := range []string{"shut/x", "private/x"} {
			if err := d.WriteFile(p, strings.NewReader("x"), 10); !errors.Is(err, sandbox.ErrPermission) {
				t.Errorf("write %s, in the root's directory: %v", p, err)
			}
		}
		if err := d.Remove("private/secret"); !errors.Is(err, sandbox.ErrPermission) {
			t.Errorf("remove a file of the root's 0700 directory: %v", err)
		}
		// The user's own, and what the root lets others read.
		if r, _, err := d.OpenFile("public"); err != nil {
			t.Errorf("read the root's 0644 file: %v", err)
		} else {
			r.Close()
		}
		if err := d.WriteFile("mine", strings.NewReader("x"), 10); err != nil {
			t.Errorf("write in the volume's root, the user's: %v", err)
		}
		if fis, err := d.ReadDir(".", 2); err != nil || len(fis) != 5 {
			t.Errorf("list the volume: %v %v", fis, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// No thread of the server's was left with the user's identity: a
	// goroutine on any of them still reads the root's file.
	var wg sync.WaitGroup
	for range 4 * runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := os.ReadFile(filepath.Join(root, "private/secret")); err != nil {
				t.Errorf("the server, as root, after the content API: %v", err)
			}
		}()
	}
	wg.Wait()
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// mustStat returns the bytes of the host's disk a file takes.
func mustStat(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// An image still attached elsewhere (a sandbox of a crashed server, not
// yet gone) is never attached a second time: two file systems would write
// one disk.
func TestNeverAttachedTwice(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	defer s.Close()
	v, err := s.Create("alice", "v", 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", filepath.Join(dir, v.ID, "image")).CombinedOutput()
	if err != nil {
		t.Skipf("losetup: %v %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "--detach", dev).Run()
	if _, err := s.Acquire("alice", "v", true); !errors.Is(err, ErrInUse) {
		t.Fatalf("attached while %s holds it: %v", dev, err)
	}
	exec.Command("losetup", "--detach", dev).Run()
	l, err := s.Acquire("alice", "v", true)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// A mount that waits (for a device an ending sandbox still holds) holds
// no lock of the store's: another key's volumes are made, mounted, read
// and listed meanwhile, and the waiting mount goes on once the device is
// free.
func TestSlowMountDelaysNoOne(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	v, err := s.Create("alice", "v", 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", filepath.Join(dir, v.ID, "image")).CombinedOutput()
	if err != nil {
		t.Skipf("losetup: %v %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "--detach", dev).Run()
	defer func(w time.Duration) { attachedWait = w }(attachedWait)
	attachedWait = 10 * time.Minute // until the test frees the device
	waiting := make(chan error, 1)
	go func() {
		l, err := s.Acquire("alice", "v", true)
		if err == nil {
			l.Release()
		}
		waiting <- err
	}()
	// Alice's mount is under way once the store counts it mounted.
	testutil.WaitFor(t, time.Minute, "alice's mount to begin", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.mounted == 1
	})
	bobs := make(chan error, 1)
	go func() {
		if _, err := s.Create("bob", "w", 0); err != nil {
			bobs <- err
			return
		}
		l, err := s.Acquire("bob", "w", true)
		if err != nil {
			bobs <- err
			return
		}
		defer l.Release()
		bobs <- s.Content("bob", "w", func(_ Volume, d *Dir) error {
			return d.WriteFile("f", strings.NewReader("x"), 10)
		})
	}()
	select {
	case err := <-bobs:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("bob's volume waited on alice's mount")
	}
	if got := s.List("bob"); len(got) != 1 {
		t.Fatalf("bob's volumes: %v", got)
	}
	select {
	case err := <-waiting:
		t.Fatalf("alice's mount ended while the device was held: %v", err)
	default:
	}
	exec.Command("losetup", "--detach", dev).Run()
	if err := <-waiting; err != nil {
		t.Fatalf("alice's mount, once the device was free: %v", err)
	}
}

// The server's mounts are bounded: each is a loop device of the host's.
func TestMountedBound(t *testing.T) {
	testutil.RequireRoot(t)
	s, err := Open(Config{Dir: t.TempDir(), MaxSize: 64 << 20, MaxMounted: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Unavailable() != nil {
		t.Skip(s.Unavailable())
	}
	for _, n := range []string{"a", "b"} {
		if _, err := s.Create("alice", n, 0); err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.Acquire("alice", "a", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire("alice", "b", true); !errors.Is(err, ErrQuota) {
		t.Fatalf("a second mount past the bound: %v", err)
	}
	again, err := s.Acquire("alice", "a", true) // the same mount
	if err != nil {
		t.Fatal(err)
	}
	again.Release()
	l.Release()
	l, err = s.Acquire("alice", "b", true)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
}

// Leases taken and given back at once, content requests and deletions
// racing them: one mount at most, none at the end, and a deletion only
// when nothing held the volume.
func TestConcurrentLeases(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if _, err := s.Create("alice", "v", 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 20; j++ {
				if i%2 == 0 {
					l, err := s.Acquire("alice", "v", true)
					if err != nil {
						t.Error(err)
						return
					}
					l.Release()
					continue
				}
				err := s.Content("alice", "v", func(_ Volume, d *Dir) error {
					return d.WriteFile(fmt.Sprintf("f%d", i), strings.NewReader("x"), 10)
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}(i)
	}
	wg.Wait()
	if m := mountsUnder(t, dir); len(m) != 0 {
		t.Fatalf("mounted after every lease ended: %v", m)
	}
	if err := s.Delete("alice", "v"); err != nil {
		t.Fatal(err)
	}
}

// One store per directory.
func TestOneStore(t *testing.T) {
	dir := t.TempDir()
	open(t, dir)
	second, err := Open(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if second.Unavailable() == nil {
		t.Fatal("a second store opened the same directory")
	}
	if _, err := second.Create("alice", "x", 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("the second store created a volume: %v", err)
	}
	second.Close()
}

// A volume is mounted in no mount namespace of the host's: a process that
// makes one while the volume is in use (a service's, an unshare -m) keeps
// nothing of it, and its loop device detaches once its users are gone.
// Each sandbox's mount (Lease.Mount) is the same file system.
func TestNoHostNamespaceHoldsIt(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if _, err := s.Create("alice", "v", 0); err != nil {
		t.Fatal(err)
	}
	l, err := s.Acquire("alice", "v", true)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	if m := mountsUnder(t, "/"); slices.ContainsFunc(m, func(p string) bool { return strings.HasPrefix(p, dir) }) {
		t.Fatalf("mounted on the host: %v", m)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), " "+l.e.dev+" ") {
		t.Fatalf("%s is mounted in the server's mount namespace:\n%s", l.e.dev, b)
	}
	// A namespace copied from the host's while the volume is in use.
	held := exec.Command("sleep", "600")
	held.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { held.Process.Kill(); held.Wait() }()

	fd, err := l.Mount()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(l.Dir(), "f"), []byte("one file system"), 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d/f", fd))
	if err != nil || string(b) != "one file system" {
		t.Fatalf("a sandbox's mount reads %q, %v", b, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		t.Fatal(err)
	}
	if want := int64(unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC); sfs.Flags&want != want {
		t.Fatalf("a sandbox's mount has flags %#x", sfs.Flags)
	}
	unix.Close(fd)
	l.Release()
	if _, err := l.Mount(); err == nil {
		t.Fatal("a released lease made a mount")
	}
	if d, err := l.Open(); err == nil || l.Dir() != "" {
		d.Close()
		t.Fatalf("a released lease opened its volume (%q)", l.Dir())
	}
	for deadline := time.Now().Add(5 * time.Second); len(loopsOf(t, dir)) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the loop device is still attached while a namespace made meanwhile lives: %v", loopsOf(t, dir))
		}
	}
}

// A sandbox's mount of a volume already in use (Lease.Mount).
func BenchmarkLeaseMount(b *testing.B) {
	s := open(b, b.TempDir())
	if _, err := s.Create("alice", "v", 0); err != nil {
		b.Fatal(err)
	}
	l, err := s.Acquire("alice", "v", true)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Release()
	for b.Loop() {
		fd, err := l.Mount()
		if err != nil {
			b.Fatal(err)
		}
		unix.Close(fd)
	}
}

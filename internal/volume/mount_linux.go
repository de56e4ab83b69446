package volume

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"golang.org/x/sys/unix"
)

// makeImage makes a sparse image of size bytes at path with an ext4 file
// system in it whose root belongs to the sandbox user. Nothing is zeroed
// (lazy inode tables and journal, no discard), so the image takes a few
// MiB of the host disk until the volume is written. No blocks are
// reserved for root: a sandbox's root and user share the whole size.
func makeImage(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("volume image: %w", err)
	}
	// Its blocks taken now: what its sandboxes write later cannot run
	// the server's disk out, which every tenant and the database share.
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	f.Close()
	if errors.Is(err, unix.ENOSPC) {
		return fmt.Errorf("%w: the server's disk has no room for a volume of %d MiB", sandbox.ErrNoRoom, size>>20)
	}
	if err != nil {
		return fmt.Errorf("volume image: %w", err)
	}
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		return fmt.Errorf("%w: mkfs.ext4 is not installed (Debian: apt-get install e2fsprogs)", ErrUnavailable)
	}
	cmd := exec.Command(mkfs, "-q", "-F", "-m", "0", "-L", "vivarium",
		"-E", fmt.Sprintf("root_owner=%d:%d,lazy_itable_init=1,lazy_journal_init=1,nodiscard", OwnerUID, OwnerGID), path)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, strings.TrimSpace(string(out)))
	}
	// lost+found would be the first thing every listing shows, and
	// root's; e2fsck makes it again if it needs one. Removed in the image,
	// without a mount.
	debugfs, err := exec.LookPath("debugfs")
	if err != nil {
		return fmt.Errorf("%w: debugfs is not installed (Debian: apt-get install e2fsprogs)", ErrUnavailable)
	}
	cmd = exec.Command(debugfs, "-w", "-R", "rmdir lost+found", path)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("debugfs: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// mountAttrs: the host never executes, trusts set-id bits of or opens
// devices in what sandboxes wrote. Backends set their own flags on the
// mounts they make of it.
const mountAttrs = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC | unix.MOUNT_ATTR_NOATIME

// mountImage attaches image to a free loop device and mounts its ext4
// file system, detached (newMount): it returns the device and the mount.
// The device is configured with autoclear: once the descriptor opened
// here is closed, it detaches when the file system's last mount is gone
// (the returned one, and each a sandbox was given), so no device outlives
// its volume's mounts. It does direct I/O on the image: no second copy of
// a volume's pages in the host's page cache, and the loop device writes
// on behalf of the writer's cgroup, so that the sandbox's disk I/O limits
// throttle what it makes durable (O_DIRECT, fsync; measured 2.1 MB/s
// under a 2 MiB/s limit).
func mountImage(image string) (dev string, mnt *os.File, err error) {
	// Its file system may still be mounted somewhere: in a sandbox that
	// has just ended (the kernel releases a dead mount namespace's
	// mounts asynchronously), or of a server that did not stop cleanly.
	// A second device would make a second file system writing the same
	// blocks: wait a little for the first to go, never attach twice.
	for deadline := time.Now().Add(attachedWait); ; {
		dev := loopOf(image)
		if dev == "" {
			break
		}
		if time.Now().After(deadline) {
			return "", nil, fmt.Errorf("%w: the volume is still attached (%s) by an ending sandbox; try again shortly", ErrInUse, dev)
		}
		time.Sleep(20 * time.Millisecond)
	}
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("open image: %w", err)
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("%w: no loop devices: %v", ErrUnavailable, err)
	}
	defer ctl.Close()
	for try := 0; ; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("%w: no free loop device: %v", ErrUnavailable, err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		lfd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", nil, fmt.Errorf("%w: open %s: %v", ErrUnavailable, dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
		copy(cfg.Info.File_name[:], filepath.Base(image))
		err = unix.IoctlLoopConfigure(lfd, &cfg)
		if err == unix.EBUSY && try < 16 {
			// Another process took it between GET_FREE and here.
			unix.Close(lfd)
			continue
		}
		if err != nil {
			unix.Close(lfd)
			return "", nil, fmt.Errorf("%w: configure %s (LOOP_CONFIGURE, Linux 5.8): %v", ErrUnavailable, dev, err)
		}
		fd, err := newMount(dev)
		unix.Close(lfd) // autoclear: the device now lives as long as a mount
		if err != nil {
			return "", nil, err
		}
		return dev, os.NewFile(uintptr(fd), dev), nil
	}
}

// newMount mounts the ext4 file system on dev (a loop device of a
// volume's, attached), nosuid, nodev, noexec and noatime, and returns the
// mount detached: it is attached in no mount namespace, so no namespace
// made meanwhile on the host (a service's, a container's, an `unshare
// -m`) gets a copy of it that would keep the volume's file system, and
// its loop device, alive after its sandboxes. A backend attaches the one
// it is given in its sandbox (move_mount). The file system is the one the
// device's earlier mounts have: the kernel keeps one per device.
// noinit_itable: the kernel does not zero inode tables in the background,
// which would fill the sparse image.
func newMount(dev string) (int, error) {
	fs, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("%w: mount ext4 (fsopen, Linux 5.2): %v", ErrUnavailable, err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "source", dev); err != nil {
		return -1, fmt.Errorf("mount ext4 from %s: %w", dev, err)
	}
	if err := unix.FsconfigSetFlag(fs, "noinit_itable"); err != nil {
		return -1, fmt.Errorf("mount ext4 from %s: noinit_itable: %w", dev, err)
	}
	if err := unix.FsconfigSetString(fs, "errors", "remount-ro"); err != nil {
		return -1, fmt.Errorf("mount ext4 from %s: errors=remount-ro: %w", dev, err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("mount ext4 from %s: %w", dev, err)
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, mountAttrs)
	if err != nil {
		return -1, fmt.Errorf("mount ext4 from %s (fsmount): %w", dev, err)
	}
	return fd, nil
}

// attachedWait is how long a mount waits for an image's earlier loop
// device to detach.
var attachedWait = 10 * time.Second

// waitDetached waits, at most d, until no loop device has an image under
// dir as its backing file.
func waitDetached(dir string, d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		attached := false
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), dir+"/") {
				attached = true
				break
			}
		}
		if !attached {
			return
		}
	}
}

// loopOf returns the loop device image is attached to, if any.
func loopOf(image string) string {
	abs, err := filepath.Abs(image)
	if err != nil {
		return ""
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.TrimSpace(string(b)) == abs {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		}
	}
	return ""
}

// sweepMounts detaches the volumes that a server of an earlier version,
// which kept them mounted under dir, left there when it did not stop
// cleanly (their sandboxes died with it). This version mounts none there.
func sweepMounts(dir string, log *slog.Logger) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	prefix := filepath.Clean(dir) + "/"
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if strings.HasPrefix(mp, prefix) {
			log.Warn("stale volume mount removed", "path", mp)
			unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		}
	}
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var out []byte
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%3o", &c); err == nil {
				out = append(out, c)
				i += 3
				continue
			}
		}
		out = append(out, s[i])
	}
	return string(out)
}

// probe makes, mounts and writes a small volume in dir, and removes it:
// volumes are available when that worked.
func probe(dir string) error {
	if os.Geteuid() != 0 {
		return errors.New("the server does not run as root: loop devices and mounts need it")
	}
	p, err := os.MkdirTemp(dir, ".probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(p)
	image := filepath.Join(p, "image")
	if err := makeImage(image, MinSize); err != nil {
		return err
	}
	dev, mnt, err := mountImage(image)
	if err != nil {
		return err
	}
	defer mnt.Close()
	// A second mount, as each sandbox gets: the same file system.
	fd, err := newMount(dev)
	if err != nil {
		return err
	}
	again := os.NewFile(uintptr(fd), dev)
	defer again.Close()
	if err := os.WriteFile(filepath.Join(procPath(mnt), "probe"), []byte("ok"), 0o600); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(procPath(again), "probe"))
	if err != nil || string(b) != "ok" {
		return fmt.Errorf("a second mount of the probe volume does not show its file: %q %v", b, err)
	}
	return nil
}

// procPath names a detached mount's root by its descriptor, for this
// process only.
func procPath(mnt *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", mnt.Fd()) }

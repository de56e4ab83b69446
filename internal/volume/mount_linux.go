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
	err = f.Truncate(size)
	f.Close()
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

// mountFlags: the host never executes, trusts set-id bits of or opens
// devices in what sandboxes wrote. Backends set their own flags on the
// mounts they make of it.
const mountFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME

// mountImage attaches image to a free loop device and mounts its ext4
// file system at dir. The device is configured with autoclear: once the
// descriptor opened here is closed, it detaches when the file system is
// unmounted (including a sandbox's last idmapped copy of it), so no device
// outlives its volume's mounts. It does direct I/O on the image: no second
// copy of a volume's pages in the host's page cache, and the loop device
// writes on behalf of the writer's cgroup, so that the sandbox's disk I/O
// limits throttle what it makes durable (O_DIRECT, fsync; measured 2.1
// MB/s under a 2 MiB/s limit). noinit_itable: the kernel does not zero
// inode tables in the background, which would fill the sparse image.
func mountImage(image, dir string) error {
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
			return fmt.Errorf("%w: the volume is still attached (%s) by an ending sandbox; try again shortly", ErrInUse, dev)
		}
		time.Sleep(20 * time.Millisecond)
	}
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open image: %w", err)
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: no loop devices: %v", ErrUnavailable, err)
	}
	defer ctl.Close()
	for try := 0; ; try++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("%w: no free loop device: %v", ErrUnavailable, err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		lfd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: open %s: %v", ErrUnavailable, dev, err)
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
			return fmt.Errorf("%w: configure %s (LOOP_CONFIGURE, Linux 5.8): %v", ErrUnavailable, dev, err)
		}
		err = unix.Mount(dev, dir, "ext4", mountFlags, "noinit_itable,errors=remount-ro")
		unix.Close(lfd) // autoclear: the device now lives as long as the mount
		if err != nil {
			return fmt.Errorf("mount ext4 from %s: %w", dev, err)
		}
		return nil
	}
}

// attachedWait is how long a mount waits for an image's earlier loop
// device to detach.
const attachedWait = 10 * time.Second

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

// unmount unmounts dir; a busy file system stays mounted (EBUSY).
func unmount(dir string) error {
	for i := 0; ; i++ {
		err := unix.Unmount(dir, unix.UMOUNT_NOFOLLOW)
		if err == unix.EINTR || (err == unix.EBUSY && i < 20) {
			// A descriptor the host had open in it is being closed.
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if err == unix.EINVAL {
			return nil // not mounted
		}
		return err
	}
}

// sweepMounts detaches the volumes that a server which did not stop
// cleanly left mounted under dir (their sandboxes died with it).
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
func probe(dir string) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("the server does not run as root: loop devices and mounts need it")
	}
	if err := privateDir(dir); err != nil {
		return err
	}
	defer func() {
		if uerr := unmount(dir); uerr != nil && err == nil {
			err = fmt.Errorf("unmount %s: %w", dir, uerr)
		}
	}()
	p, err := os.MkdirTemp(dir, ".probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(p)
	image, mnt := filepath.Join(p, "image"), filepath.Join(p, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	if err := makeImage(image, MinSize); err != nil {
		return err
	}
	if err := mountImage(image, mnt); err != nil {
		return err
	}
	werr := os.WriteFile(filepath.Join(mnt, "probe"), []byte("ok"), 0o600)
	if err := unmount(mnt); err != nil {
		unix.Unmount(mnt, unix.MNT_DETACH)
		return fmt.Errorf("unmount the probe volume: %w", err)
	}
	return werr
}

// privateDir makes dir a mount point of its own with private propagation,
// so that the volumes mounted below it never appear in other mount
// namespaces: on hosts whose / is shared (systemd's), a container or
// service started meanwhile would get a copy of each, which would keep a
// volume's file system, and its loop device, alive after its sandboxes.
func privateDir(dir string) error {
	if !isMountPoint(dir) {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s onto itself: %w", dir, err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}

// isMountPoint reports whether a mount is at dir (absolute, clean).
func isMountPoint(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 4 && unescapeMountinfo(f[4]) == dir {
			return true
		}
	}
	return false
}

// isMounted reports whether dir is the root of a file system of its own
// (not the directory of its parent's file system it covers).
func isMounted(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

package native

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A sandbox sees the host's files (its /usr, and /bin, /lib ... where /usr
// is not merged) through read-only overlays of its own, not through bind
// mounts. A bind mount shows the host's own inodes, and what the kernel
// keeps per inode is then shared with the host and every other sandbox:
// inotify watches see who opens and executes which file, and flock, POSIX
// and OFD locks taken in one place are seen, and block, everywhere else (a
// covert channel, and a way to make the host's `flock -n` fail). An
// overlay has inodes of its own, which belong to that one mount: watches
// and locks on them concern this sandbox alone. The data underneath stays
// the host's, read through the host's inodes: the page cache is shared,
// so a thousand sandboxes cost the memory of one copy of the libraries.
//
// Overlayfs may be mounted in a user namespace since Linux 5.11. A
// read-only overlay needs two lower layers; the second is an empty
// directory of a scratch tmpfs.

// overlayFeature names what a sandbox needs when an overlay cannot be
// mounted.
const overlayFeature = "a read-only overlayfs in a user namespace (Linux 5.11+, CONFIG_OVERLAY_FS)"

// mountOverlay mounts at dst a read-only, nosuid, nodev overlay showing
// the files of lower, with empty as its second, empty, layer.
func mountOverlay(lower, empty, dst string) error {
	for _, p := range []string{lower, empty} {
		// The option string separates layers with ':' and options with ','.
		if strings.ContainsAny(p, ":,\\") {
			return fmt.Errorf("overlay layer %q: a path with ':', ',' or '\\'", p)
		}
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	opts := "lowerdir=" + lower + ":" + empty
	if err := unix.Mount("overlay", dst, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("%s: %w", overlayFeature, err)
	}
	return nil
}

// overlayProbeArg0 is argv[0] of this binary re-executed by CheckOverlay.
const overlayProbeArg0 = "vivarium-overlay-probe"

func init() {
	if len(os.Args) > 0 && os.Args[0] == overlayProbeArg0 {
		if err := overlayProbe(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// CheckOverlay reports whether this host lets a sandbox's init mount the
// read-only overlays its root is made of: it mounts one, of the host's
// /usr, in a throwaway user and mount namespace (this binary again).
func CheckOverlay() error {
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}}
	cmd := &exec.Cmd{
		Path: "/proc/self/exe",
		Args: []string{overlayProbeArg0},
		Env:  initEnv,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings: ids,
			GidMappings: ids,
			Credential:  &syscall.Credential{Uid: 0, Gid: 0},
			Pdeathsig:   syscall.SIGKILL,
		},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("%w: %s", sandbox.ErrUnsupported, msg)
	}
	return nil
}

// overlayProbe is CheckOverlay's child: root of a new user namespace, in a
// new mount namespace, it mounts what a sandbox's init would.
func overlayProbe() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", scratchDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=16k,nr_inodes=16"); err != nil {
		return fmt.Errorf("mount a tmpfs: %w", err)
	}
	empty, dst := filepath.Join(scratchDir, "empty"), filepath.Join(scratchDir, "usr")
	if err := os.Mkdir(empty, 0o755); err != nil {
		return err
	}
	if err := mountOverlay("/usr", empty, dst); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dst, "bin")); err != nil {
		return errors.New("the overlay of /usr shows no /usr/bin")
	}
	return nil
}

package native

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/core"
)

// Every sandbox gets device nodes of its own. A node is an inode like any
// other file: inotify on the host's /dev/null would report every time the
// host (or another sandbox) opens it, and a flock on it would be the
// host's. A user namespace cannot make device nodes, so the supervisor,
// root of the host's, makes the sandbox's five (null, zero, full, random,
// urandom: the host's device numbers) in a directory of its own under
// devicesRoot, init binds them into its /dev, and the supervisor removes
// the directory once the sandbox has started: the binds keep the nodes,
// which nothing else can reach. A zygote binds its backend's directory
// under /.host/devices for the sandboxes it forks, which see a directory
// made after it started through the same bind.
const devicesRoot = "/run/vivarium/devices"

// devicesDir is where a backend makes its sandboxes' nodes: a directory
// per cgroup parent, which one supervisor uses at a time.
func devicesDir(cgroupParent string) string {
	if cgroupParent == "" {
		cgroupParent = "native"
	}
	return filepath.Join(devicesRoot, strings.ReplaceAll(cgroupParent, "/", "_"))
}

// prepareDevicesDir makes a backend's directory of device nodes, and
// removes what a killed supervisor of the same directory left. A sandbox's
// init, root of its own user namespace but nobody on the host, binds its
// nodes from there before it pivots away from the host's tree: every
// directory on the way must let others through (0711: through, not list).
func prepareDevicesDir(dir string) error {
	for d := dir; d != "/run"; d = filepath.Dir(d) {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
		info, err := os.Lstat(d)
		if err != nil {
			return err
		}
		if !info.IsDir() {
			return fmt.Errorf("%s is not a directory", d)
		}
		if info.Mode().Perm()&0o011 != 0o011 {
			if err := os.Chmod(d, info.Mode().Perm()|0o011); err != nil {
				return err
			}
		}
	}
	sweepDevices(dir)
	return nil
}

// makeDevices makes a sandbox's device nodes in dir/id and returns that
// directory.
func makeDevices(dir, id string) (string, error) {
	d := filepath.Join(dir, id)
	if err := os.Mkdir(d, 0o711); err != nil {
		return "", fmt.Errorf("device nodes: %w", err)
	}
	for _, name := range devices {
		var st unix.Stat_t
		err := unix.Stat("/dev/"+name, &st)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFCHR {
			err = fmt.Errorf("not a character device")
		}
		if err == nil {
			err = unix.Mknod(filepath.Join(d, name), unix.S_IFCHR|0o666, int(st.Rdev))
		}
		if err == nil {
			// Mknod's mode is masked by the umask.
			err = os.Chmod(filepath.Join(d, name), 0o666)
		}
		if err != nil {
			os.RemoveAll(d)
			return "", fmt.Errorf("device node %s: %w", name, err)
		}
	}
	return d, nil
}

// sweepDevices removes what a killed supervisor of the same cgroup parent
// left: nodes of sandboxes whose start it did not see through. A start
// ends within core.SetupTimeout; younger directories may be another process's.
func sweepDevices(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > 2*core.SetupTimeout {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

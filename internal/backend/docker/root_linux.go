package docker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
)

// root is what every container of a backend binds from the host: the
// native backend's root skeleton (synthetic /etc, the runner), with the
// host's /usr (and, without merged /usr, its top-level directories) and
// the agent bound into it, all read-only, nosuid and nodev.
//
// Docker is told to bind these read-write, which they are not. Asked for a
// read-only bind, runc remounts it read-only, and a remount that does not
// repeat nosuid and nodev clears them, which Docker's API cannot repeat;
// a plain bind of what is already a read-only, nosuid, nodev mount keeps
// all three. check makes sure they still are before each container.
type root struct {
	dir    string
	mounts []string // made in this order, unmounted in the reverse
}

// agentPath is where the agent is inside the container (and the skeleton).
var agentPath = container.RunnerDir + "/bin/" + agent.Arg0

// newRoot writes a skeleton under stateDir and mounts it, in order:
//  1. the skeleton (native.RootSkeleton) and an empty file where the agent goes;
//  2. the skeleton bound onto itself, remounted read-only, nosuid, nodev;
//  3. the host's /usr, then each top-level directory to bind, each bound
//     and remounted the same way;
//  4. the agent (exe) bound onto its file, remounted the same way.
//
// It returns the root and the image's content (taken before any mount).
func newRoot(stateDir, exe string) (_ *root, image []byte, err error) {
	dir, err := os.MkdirTemp(stateDir, "root-")
	if err != nil {
		return nil, nil, err
	}
	r := &root{dir: dir}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	// The sandbox user must traverse its root; host users cannot reach it
	// (the state directory is root's alone).
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, nil, err
	}
	if err := native.RootSkeleton(dir, runner.Files()); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, agentPath), nil, 0o755); err != nil {
		return nil, nil, err
	}
	if image, err = imageTar(dir); err != nil {
		return nil, nil, fmt.Errorf("the image's content: %w", err)
	}
	if err := r.bind(dir, dir); err != nil {
		return nil, nil, err
	}
	for _, d := range append([]string{"/usr"}, native.TopLevelBinds()...) {
		if err := r.bind(d, filepath.Join(dir, d)); err != nil {
			return nil, nil, err
		}
	}
	if err := r.bind(exe, filepath.Join(dir, agentPath)); err != nil {
		return nil, nil, err
	}
	return r, image, nil
}

// bind mounts src at dst read-only, nosuid and nodev (a bind takes the
// flags only in a second, remounting step).
func (r *root) bind(src, dst string) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	r.mounts = append(r.mounts, dst)
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("remount %s read-only: %w", dst, err)
	}
	return nil
}

// check verifies that every mount the containers bind is still there,
// read-only, nosuid and nodev: were one gone, Docker would bind the
// directory beneath it read-write.
func (r *root) check() error {
	for _, m := range r.mounts {
		var st unix.Statfs_t
		if err := unix.Statfs(m, &st); err != nil {
			return fmt.Errorf("root view: %w", err)
		}
		const want = unix.ST_RDONLY | unix.ST_NOSUID | unix.ST_NODEV
		if st.Flags&want != want {
			return fmt.Errorf("root view: %s is no longer a read-only, nosuid, nodev mount", m)
		}
	}
	return nil
}

// path is where a directory of the container's root is on the host.
func (r *root) path(p string) string { return filepath.Join(r.dir, p) }

// close unmounts the root and removes it.
func (r *root) close() error {
	var errs []error
	for _, m := range slices.Backward(r.mounts) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	r.mounts = nil
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return os.RemoveAll(r.dir)
}

// sweepRoots unmounts and removes the roots a crashed supervisor left in
// stateDir (all but keep).
func sweepRoots(stateDir, keep string) error {
	roots, _ := filepath.Glob(filepath.Join(stateDir, "root-*"))
	var errs []error
	for _, dir := range roots {
		if dir == keep {
			continue
		}
		// Its mounts, deepest first: the agent, /usr and the others,
		// then the skeleton's own.
		for range 3 {
			for _, m := range mountsUnder(dir) {
				unix.Unmount(m, unix.MNT_DETACH)
			}
		}
		if len(mountsUnder(dir)) > 0 {
			errs = append(errs, fmt.Errorf("%s: still mounted", dir))
			continue
		}
		errs = append(errs, os.RemoveAll(dir))
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or under dir, deepest first.
func mountsUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		// Our paths have no characters mountinfo escapes.
		if p := f[4]; p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

package docker

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/rootview"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
)

// root is the skeleton every container's view is made from (see view):
// the native backend's root skeleton (synthetic /etc, the runner, empty
// mount points), written once per backend in a directory only root can
// reach. No container binds it: each sees it through a read-only overlay
// of its own.
type root struct {
	dir string
	// passwd and group are the skeleton's, in which a view names its
	// sandbox user.
	passwd, group []byte
}

// agentPath is where the agent is inside the container (and the skeleton).
var agentPath = container.RunnerDir + "/bin/" + agent.Arg0

// newRoot writes a skeleton under stateDir: rootview.RootSkeleton and an
// empty file where the agent goes. It returns the root and the image's
// content.
func newRoot(stateDir string) (_ *root, image []byte, err error) {
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
	if err := rootview.RootSkeleton(dir, runner.Files()); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, agentPath), nil, 0o755); err != nil {
		return nil, nil, err
	}
	if r.passwd, err = os.ReadFile(r.path("etc/passwd")); err != nil {
		return nil, nil, err
	}
	if r.group, err = os.ReadFile(r.path("etc/group")); err != nil {
		return nil, nil, err
	}
	if image, err = imageTar(dir); err != nil {
		return nil, nil, fmt.Errorf("the image's content: %w", err)
	}
	return r, image, nil
}

// path is where a directory of the container's root is in the skeleton.
func (r *root) path(p string) string { return filepath.Join(r.dir, p) }

// close removes the skeleton.
func (r *root) close() error { return os.RemoveAll(r.dir) }

// users returns the skeleton's passwd and group with the sandbox user
// (container.SandboxUID, "sandbox") being uid and gid instead: the name
// and home of the user code runs as stay what they are in every backend,
// only the number is the host's.
func (r *root) users(uid, gid int) (passwd, group []byte) {
	return renumber(r.passwd, 2, 3, uid, gid), renumber(r.group, 2, -1, gid, 0)
}

// renumber rewrites the lines of a passwd or group file whose id field
// (idField) is the sandbox user's: that field becomes id and, in passwd,
// the group field (gidField) gid.
func renumber(file []byte, idField, gidField, id, gid int) []byte {
	lines := bytes.SplitAfter(file, []byte("\n"))
	var out bytes.Buffer
	for _, line := range lines {
		f := strings.Split(string(line), ":")
		if len(f) > idField && f[idField] == strconv.Itoa(container.SandboxUID) {
			f[idField] = strconv.Itoa(id)
			if gidField >= 0 && len(f) > gidField {
				f[gidField] = strconv.Itoa(gid)
			}
			line = []byte(strings.Join(f, ":"))
		}
		out.Write(line)
	}
	return out.Bytes()
}

// sweepRoots removes the skeletons a crashed supervisor left in stateDir
// (all but keep), unmounting first what an older version mounted in them.
func sweepRoots(stateDir, keep string) error {
	roots, _ := filepath.Glob(filepath.Join(stateDir, "root-*"))
	var errs []error
	for _, dir := range roots {
		if dir == keep {
			continue
		}
		if err := unmountAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.RemoveAll(dir))
	}
	return errors.Join(errs...)
}

// unmountAll detaches every mount at or under dir, deepest first, and says
// whether any is left.
func unmountAll(dir string) error {
	for range 3 {
		for _, m := range mountsUnder(dir) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	if left := mountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("%s: still mounted: %v", dir, left)
	}
	return nil
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

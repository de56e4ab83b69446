package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/backend/container"
	"github.com/vivarium-sandbox/vivarium/internal/layers"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A template's sandbox (sandbox.Spec.Root) on gVisor has the template's
// layers as its bundle's root, read-only as every gvisor sandbox's root
// is: a read-only overlay of them mounted on the host once per template
// (under the state directory, root's alone) and kept while the runtime
// lives, its layers held (layers.HoldLayers). Its writable layer holds
// only the mount points of the sandbox's own mounts (/workspace, /tmp,
// /proc, the runner's ...), made where the image has a link or nothing
// there, so that no mount of the bundle lands anywhere but where it
// says. /etc/hosts, /etc/hostname and /etc/resolv.conf are the skeleton's.
// gVisor's kernel sees the layers' owners as they are (the image's root
// is the sandbox's root). The runner runs the template's python3.

// RootsSupported implements the container runtime's templates: a root of
// a template's layers in the bundle.
func (r *Runtime) RootsSupported() error { return nil }

// templateRoots are the roots mounted so far, by template.
type templateRoots struct {
	mu sync.Mutex
	m  map[string]*templateRoot
}

type templateRoot struct {
	dir    string // its directory: merged, the root; fs, its writable layer's tmpfs
	unhold func()
}

// templateMountPoints are the bundle's mount points in a template's root:
// directories, then files.
var (
	templateMountDirs  = []string{"workspace", "tmp", "dev/shm", "proc", "sys", strings.TrimPrefix(container.RunnerDir, "/") + "/bin"}
	templateMountFiles = []string{"etc/hosts", "etc/hostname", "etc/resolv.conf"}
)

// templateRoot returns the host path of root's read-only root, mounting
// it the first time.
func (r *Runtime) templateRoot(root *sandbox.Root) (string, error) {
	h := sha256.Sum256([]byte(root.ID + "\x00" + strings.Join(root.Layers, "\x00")))
	key := hex.EncodeToString(h[:8])
	r.templates.mu.Lock()
	defer r.templates.mu.Unlock()
	if t := r.templates.m[key]; t != nil {
		return filepath.Join(t.dir, "merged"), nil
	}
	dir := filepath.Join(r.cfg.StateDir, "template-"+key)
	t, err := mountTemplateRoot(dir, root)
	if err != nil {
		unmountTemplateRoot(dir)
		return "", fmt.Errorf("template %s: %w", root.Template, err)
	}
	if r.templates.m == nil {
		r.templates.m = map[string]*templateRoot{}
	}
	r.templates.m[key] = t
	return filepath.Join(dir, "merged"), nil
}

func mountTemplateRoot(dir string, root *sandbox.Root) (*templateRoot, error) {
	unhold, err := layers.HoldLayers(root.Layers)
	if err != nil {
		return nil, err
	}
	t := &templateRoot{dir: dir, unhold: unhold}
	fs, merged := filepath.Join(dir, "fs"), filepath.Join(dir, "merged")
	for _, d := range []string{fs, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			unhold()
			return nil, err
		}
	}
	if err := unix.Mount("tmpfs", fs, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m,nr_inodes=256,mode=0755"); err != nil {
		unhold()
		return nil, fmt.Errorf("the root's mount points: %w", err)
	}
	upper, work := filepath.Join(fs, "upper"), filepath.Join(fs, "work")
	for _, d := range append([]string{upper, work}, prefixed(upper, templateMountDirs)...) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			unhold()
			return nil, err
		}
	}
	for _, f := range append(prefixed(upper, templateMountFiles), filepath.Join(upper, container.RunnerDir, "bin", agent.Arg0)) {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			unhold()
			return nil, err
		}
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			unhold()
			return nil, err
		}
	}
	m, err := layers.MountLayers(root.Layers, nil, upper, work)
	if err != nil {
		unhold()
		return nil, err
	}
	defer m.Close()
	if err := unix.MountSetattr(int(m.Fd()), "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		unhold()
		return nil, fmt.Errorf("make the root read-only: %w", err)
	}
	if err := unix.MoveMount(int(m.Fd()), "", unix.AT_FDCWD, merged, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		unhold()
		return nil, fmt.Errorf("attach the root: %w", err)
	}
	return t, nil
}

func prefixed(dir string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = filepath.Join(dir, n)
	}
	return out
}

// unmountTemplateRoot unmounts and removes what mountTemplateRoot made in
// dir.
func unmountTemplateRoot(dir string) error {
	var errs []error
	for _, m := range []string{"merged", "fs"} {
		if err := unix.Unmount(filepath.Join(dir, m), unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, err)
		}
	}
	return errors.Join(append(errs, os.RemoveAll(dir))...)
}

// closeTemplates unmounts every template's root and lets go of its
// layers.
func (r *Runtime) closeTemplates() error {
	r.templates.mu.Lock()
	defer r.templates.mu.Unlock()
	var errs []error
	for key, t := range r.templates.m {
		errs = append(errs, unmountTemplateRoot(t.dir))
		t.unhold()
		delete(r.templates.m, key)
	}
	return errors.Join(errs...)
}

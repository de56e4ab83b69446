package docker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/rootview"
)

// view is one container's file system from the host: read-only overlays
// of the skeleton, of the host's /usr (and, without merged /usr, its
// top-level directories) and of the agent's directory, mounted for this
// container alone under the backend's state directory and bound into it.
//
// A bind of the host's /usr would give every container the host's own
// inodes: inotify on /usr/bin/python3 would report when the host and
// other sandboxes run it, a flock on a /usr file would be seen by them
// all (a channel between tenants; flock -n on the host would fail). An
// overlay has inodes of its own: its watches see what goes through it,
// its locks are its own. (What it shares with the host is the page cache:
// reads go to the host's files.) An overlay without an upper layer is
// read-only; it needs two lower layers, so an empty directory (or, for
// the skeleton, the view's own files: passwd and group naming the
// sandbox user) goes on top.
//
// Under runc, the view holds the container's synthesised /proc files too
// (see proc_linux.go), in the skeleton's top layer, so that they are read-only
// through its overlay without a mount of their own.
//
// The mounts are made before the container is created and removed once
// it is: in order, for each: the directory, an overlay mounted
// read-only, nosuid and nodev. Docker binds them read-write, which they
// are not: a bind keeps the flags of the mount it binds (Docker asked
// for a read-only bind would have runc remount it, and a remount through
// its API cannot repeat nosuid and nodev).
type view struct {
	dir    string
	mounts []string // mounted in this order, unmounted in the reverse
	// procFiles are the synthesised files of /proc (paths relative to
	// it) the view holds, procMasked those the container's /proc
	// empties; both nil under gVisor, whose /proc is its own.
	procFiles, procMasked []string
}

// viewsDir is where the views are, in the backend's state directory.
const viewsDir = "views"

// Paths in a view.
const (
	viewEmpty = "empty" // an empty directory: the top layer of host overlays
	viewTop   = "top"   // the skeleton's top layer: /etc/passwd, /etc/group and /proc's files
	viewRoot  = "root"  // the skeleton's overlay
	viewHost  = "host"  // host/usr ...: the host directories' overlays
	viewAgent = "agent" // the agent's directory's overlay
)

// newView mounts a container's view: the skeleton with passwd and group
// naming the sandbox user uid and gid (and, under runc, the /proc files of
// a sandbox whose memory limit is memory bytes), the host's directories,
// the agent.
func (r *Runtime) newView(name string, uid, gid int, memory int64) (_ *view, err error) {
	dir, err := os.MkdirTemp(filepath.Join(r.cfg.StateDir, viewsDir), name+"-")
	if err != nil {
		return nil, err
	}
	v := &view{dir: dir}
	defer func() {
		if err != nil {
			v.close()
		}
	}()
	for _, d := range []string{viewEmpty, viewTop + "/etc", viewHost} {
		if err := os.MkdirAll(v.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	passwd, group := r.root.users(uid, gid)
	if err := os.WriteFile(v.path(viewTop+"/etc/passwd"), passwd, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(v.path(viewTop+"/etc/group"), group, 0o644); err != nil {
		return nil, err
	}
	if !r.gvisor {
		v.procFiles, v.procMasked, err = rootview.ProcFiles(v.path(viewTop+"/proc"), "/proc", memory, procBindable)
		if err != nil {
			return nil, fmt.Errorf("the /proc files: %w", err)
		}
	}
	if err := v.overlay(viewRoot, v.path(viewTop), r.root.dir); err != nil {
		return nil, err
	}
	for _, d := range hostDirs() {
		if err := v.overlay(filepath.Join(viewHost, d), v.path(viewEmpty), d); err != nil {
			return nil, err
		}
	}
	if err := v.overlay(viewAgent, v.path(viewEmpty), filepath.Dir(r.cfg.Exe)); err != nil {
		return nil, err
	}
	return v, nil
}

// hostDirs are the host's directories a container sees: /usr, and the
// top-level directories that are not links into it.
func hostDirs() []string { return append([]string{"/usr"}, rootview.TopLevelBinds()...) }

// overlay mounts at the view's path p a read-only, nosuid, nodev overlay
// of the directories lower (the first on top).
func (v *view) overlay(p string, lower ...string) error {
	for _, l := range lower {
		if err := overlayable(l); err != nil {
			return err
		}
	}
	dst := v.path(p)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	opts := "lowerdir=" + strings.Join(lower, ":")
	if err := unix.Mount("overlay", dst, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("overlay of %s: %w", lower[len(lower)-1], err)
	}
	v.mounts = append(v.mounts, dst)
	return nil
}

// overlayable fails for a path overlayfs's options cannot name.
func overlayable(p string) error {
	if strings.ContainsAny(p, ":,\\") {
		return fmt.Errorf("cannot overlay %q: overlayfs takes no path with ':', ',' or '\\'", p)
	}
	return nil
}

// path is where p of the view is on the host.
func (v *view) path(p string) string { return filepath.Join(v.dir, p) }

// root is where a directory of the container's root is in the skeleton's
// overlay.
func (v *view) root(p string) string { return filepath.Join(v.dir, viewRoot, p) }

// host is where a host directory is in the view.
func (v *view) host(d string) string { return filepath.Join(v.dir, viewHost, d) }

// agent is where the agent (the host's exe) is in the view.
func (v *view) agent(exe string) string { return filepath.Join(v.dir, viewAgent, filepath.Base(exe)) }

// close unmounts the view and removes it. (A container that still runs
// keeps its binds of the overlays, which live on until it ends.)
func (v *view) close() error {
	var errs []error
	for _, m := range slices.Backward(v.mounts) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	v.mounts = nil
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return os.RemoveAll(v.dir)
}

// sweepViews removes the views a crashed supervisor left in stateDir.
func sweepViews(stateDir string) error {
	dirs, _ := filepath.Glob(filepath.Join(stateDir, viewsDir, "*"))
	var errs []error
	for _, dir := range dirs {
		if err := unmountAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.RemoveAll(dir))
	}
	return errors.Join(errs...)
}

package service

import (
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// volumeFS is a sandbox's file system (or its workspace) with its volumes
// in it. The backend's view crosses no mount, by design: the names at or
// below a volume's mount point go to the volume itself, opened confined
// from its host mount, as the sandbox's user (what the sandbox's user
// writes there is uid 1000's on disk, the same files). The sandbox's root
// reaches no volume this way: the host would act on them with more
// rights than that root has.
type volumeFS struct {
	base   sandbox.Workspace
	mounts []fsMount
}

type fsMount struct {
	rel  string      // the mount point, named as base names paths
	dir  *volume.Dir // nil: not reachable as this user
	size int64
}

var (
	_ sandbox.WorkspaceEditor   = volumeFS{}
	_ sandbox.WorkspaceLinker   = volumeFS{}
	_ sandbox.WorkspaceMetadata = volumeFS{}
)

// withVolumes wraps ws, whose names are relative to the sandbox's root
// (inWorkspace false) or to its workspace, with the box's volumes, and
// returns what closes them.
func (b *Box) withVolumes(ws sandbox.Workspace, inWorkspace bool, user string) (sandbox.Workspace, func(), error) {
	if len(b.leases) == 0 {
		return ws, func() {}, nil
	}
	v := volumeFS{base: ws}
	closeAll := func() {
		for _, m := range v.mounts {
			if m.dir != nil {
				m.dir.Close()
			}
		}
	}
	for i, l := range b.leases {
		var d *volume.Dir
		if user == "" || user == sandbox.UserSandbox {
			var err error
			if d, err = l.Open(); err != nil {
				closeAll()
				return nil, nil, err
			}
		}
		for _, rel := range volumeNames(b.volumes[i].Path, inWorkspace) {
			v.mounts = append(v.mounts, fsMount{rel: rel, dir: d, size: l.Volume.Size})
		}
	}
	return v, closeAll, nil
}

// volumeNames are the names of a volume mounted at p (inside the
// sandbox) in a view of its root or workspace: a volume under the home is
// at both of its names (native's volumeTargets).
func volumeNames(p string, inWorkspace bool) []string {
	rest, home := strings.CutPrefix(p, sandbox.HomeUser+"/")
	if !home {
		rest, home = strings.CutPrefix(p, sandbox.HomeWorkspace+"/")
	}
	switch {
	case inWorkspace && home:
		return []string{rest}
	case inWorkspace:
		return nil
	case home:
		return []string{"workspace/" + rest, "home/user/" + rest}
	}
	return []string{p[1:]}
}

// route finds the volume name is in, and its name there.
func (v volumeFS) route(name string) (*fsMount, string, error) {
	c := path.Clean(name)
	if c == "." || slices.Contains(strings.Split(name, "/"), "..") {
		return nil, name, nil // the base refuses or answers it
	}
	for i := range v.mounts {
		m := &v.mounts[i]
		inner := ""
		if c == m.rel {
			inner = "."
		} else if rest, ok := strings.CutPrefix(c, m.rel+"/"); ok {
			inner = rest
		} else {
			continue
		}
		if m.dir == nil {
			return nil, "", fmt.Errorf("%w: %s is a volume: its files are reached as the sandbox's user", sandbox.ErrPermission, name)
		}
		return m, inner, nil
	}
	return nil, name, nil
}

func (m *fsMount) outside(fi sandbox.FileInfo) sandbox.FileInfo {
	if fi.Path == "." || fi.Path == "" {
		fi.Path = m.rel
	} else {
		fi.Path = m.rel + "/" + fi.Path
	}
	return fi
}

var errMountPoint = fmt.Errorf("%w: that is where a volume is mounted", sandbox.ErrBadPath)

func (v volumeFS) WriteFile(name string, r io.Reader, limit int64) error {
	m, inner, err := v.route(name)
	switch {
	case err != nil:
		return err
	case m == nil:
		return v.base.WriteFile(name, r, limit)
	case inner == ".":
		return errMountPoint
	}
	return m.dir.WriteFile(inner, r, m.size)
}

func (v volumeFS) List(max int) ([]sandbox.FileInfo, error) { return v.base.List(max) }

func (v volumeFS) CopyOut(dir string, maxFile, maxTotal int64) ([]sandbox.FileInfo, error) {
	return v.base.CopyOut(dir, maxFile, maxTotal)
}

func (v volumeFS) OpenFile(name string) (io.ReadCloser, sandbox.FileInfo, error) {
	m, inner, err := v.route(name)
	if err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	if m == nil {
		return v.base.OpenFile(name)
	}
	f, fi, err := m.dir.OpenFile(inner)
	return f, m.outside(fi), err
}

func (v volumeFS) ReadDir(name string, depth int) ([]sandbox.FileInfo, error) {
	m, inner, err := v.route(name)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return v.base.ReadDir(name, depth)
	}
	fis, err := m.dir.ReadDir(inner, depth)
	for i := range fis {
		fis[i] = m.outside(fis[i])
	}
	return fis, err
}

func (v volumeFS) Stat(name string) (sandbox.FileInfo, error) {
	m, inner, err := v.route(name)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	if m == nil {
		return v.base.Stat(name)
	}
	fi, err := m.dir.Stat(inner)
	return m.outside(fi), err
}

func (v volumeFS) Remove(name string) error {
	m, inner, err := v.route(name)
	switch {
	case err != nil:
		return err
	case m == nil:
		return v.base.Remove(name)
	case inner == ".":
		return errMountPoint
	}
	return m.dir.Remove(inner)
}

func (v volumeFS) Mkdir(name string) error {
	m, inner, err := v.route(name)
	switch {
	case err != nil:
		return err
	case m == nil:
		return baseAs[sandbox.WorkspaceEditor](v.base, func(e sandbox.WorkspaceEditor) error { return e.Mkdir(name) })
	case inner == ".":
		return fmt.Errorf("%w: %s", sandbox.ErrExists, name)
	}
	return m.dir.Mkdir(inner)
}

func (v volumeFS) Rename(from, to string) error {
	mf, src, err := v.route(from)
	if err != nil {
		return err
	}
	mt, dst, err := v.route(to)
	if err != nil {
		return err
	}
	switch {
	case mf == nil && mt == nil:
		return baseAs[sandbox.WorkspaceEditor](v.base, func(e sandbox.WorkspaceEditor) error { return e.Rename(from, to) })
	case mf == nil || mt == nil || mf.dir != mt.dir:
		return fmt.Errorf("%w: %s and %s are on different file systems (a volume and the sandbox's disk): copy, then remove",
			sandbox.ErrBadPath, from, to)
	case src == "." || dst == ".":
		return errMountPoint
	}
	return mf.dir.Rename(src, dst)
}

func (v volumeFS) Readlink(name string) (string, error) {
	m, inner, err := v.route(name)
	if err != nil {
		return "", err
	}
	if m == nil {
		var out string
		err := baseAs[sandbox.WorkspaceLinker](v.base, func(l sandbox.WorkspaceLinker) (err error) {
			out, err = l.Readlink(name)
			return err
		})
		return out, err
	}
	return m.dir.Readlink(inner)
}

func (v volumeFS) FileMetadata(name string) (map[string]string, error) {
	m, inner, err := v.route(name)
	if err != nil {
		return nil, err
	}
	if m == nil {
		var out map[string]string
		err := baseAs[sandbox.WorkspaceMetadata](v.base, func(w sandbox.WorkspaceMetadata) (err error) {
			out, err = w.FileMetadata(name)
			return err
		})
		return out, err
	}
	return m.dir.FileMetadata(inner)
}

func (v volumeFS) SetFileMetadata(name string, md map[string]string) error {
	m, inner, err := v.route(name)
	if err != nil {
		return err
	}
	if m == nil {
		return baseAs[sandbox.WorkspaceMetadata](v.base, func(w sandbox.WorkspaceMetadata) error { return w.SetFileMetadata(name, md) })
	}
	return m.dir.SetFileMetadata(inner, md)
}

// baseAs calls fn with the base workspace as a T, if it is one.
func baseAs[T any](base sandbox.Workspace, fn func(T) error) error {
	t, ok := base.(T)
	if !ok {
		return fmt.Errorf("%w: this backend's workspace cannot do that", sandbox.ErrUnsupported)
	}
	return fn(t)
}

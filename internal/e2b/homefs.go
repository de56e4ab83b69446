package e2b

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// files returns the target sandbox's file system as user acts on it,
// named as toRoot names paths, and marks the sandbox used until done is
// called: the whole of it where its backend reaches it (the native one's
// disk), else its workspace alone, under the home.
func (s *Server) files(t target, user string) (sandbox.Workspace, func(), error) {
	root, done, err := s.svc.FileSystem(t.owner, t.id, user)
	if err == nil {
		return root, done, nil
	}
	if !errors.Is(err, sandbox.ErrUnsupported) {
		return nil, nil, err
	}
	if user == sandbox.UserRoot {
		return nil, nil, fmt.Errorf("%w %q: this sandbox's backend acts on files as its user only", errUser, user)
	}
	ws, done, err := s.svc.Workspace(t.owner, t.id)
	if err != nil {
		return nil, nil, err
	}
	return homeOnly{ws}, done, nil
}

// homeOnly is a workspace seen as the home of a file system named as
// toRoot names it: what is under "workspace" is the workspace's, and
// nothing else exists for it.
type homeOnly struct{ ws sandbox.Workspace }

var (
	_ sandbox.WorkspaceEditor   = homeOnly{}
	_ sandbox.WorkspaceLinker   = homeOnly{}
	_ sandbox.WorkspaceMetadata = homeOnly{}
)

// metadataOf returns what keeps ws's files' metadata, if anything does: a
// homeOnly view keeps it only where its workspace does, and is asked
// before a file is written, not after.
func metadataOf(ws sandbox.Workspace) (sandbox.WorkspaceMetadata, bool) {
	if h, ok := ws.(homeOnly); ok {
		if _, inner := h.ws.(sandbox.WorkspaceMetadata); !inner {
			return nil, false
		}
		return h, true
	}
	m, ok := ws.(sandbox.WorkspaceMetadata)
	return m, ok
}

// inside maps a name onto the workspace.
func (h homeOnly) inside(name string) (string, error) {
	if name == homeRel {
		return ".", nil
	}
	if rest, ok := strings.CutPrefix(name, homeRel+"/"); ok {
		return rest, nil
	}
	return "", fmt.Errorf("%w: %s is outside the sandbox's home: on this backend, files live under %s "+
		"(the workspace, also /workspace)", sandbox.ErrBadPath, toSandbox(name), homeDir)
}

// outside names a workspace file as toRoot does.
func outside(fi sandbox.FileInfo) sandbox.FileInfo {
	if fi.Path == "." || fi.Path == "" {
		fi.Path = homeRel
	} else {
		fi.Path = homeRel + "/" + fi.Path
	}
	return fi
}

func outsideAll(fis []sandbox.FileInfo, err error) ([]sandbox.FileInfo, error) {
	for i := range fis {
		fis[i] = outside(fis[i])
	}
	return fis, err
}

func (h homeOnly) WriteFile(name string, r io.Reader, limit int64) error {
	rel, err := h.inside(name)
	if err != nil {
		return err
	}
	return h.ws.WriteFile(rel, r, limit)
}

func (h homeOnly) List(max int) ([]sandbox.FileInfo, error) { return outsideAll(h.ws.List(max)) }

func (h homeOnly) CopyOut(dir string, maxFile, maxTotal int64) ([]sandbox.FileInfo, error) {
	return h.ws.CopyOut(dir, maxFile, maxTotal)
}

func (h homeOnly) OpenFile(name string) (io.ReadCloser, sandbox.FileInfo, error) {
	rel, err := h.inside(name)
	if err != nil {
		return nil, sandbox.FileInfo{}, err
	}
	f, fi, err := h.ws.OpenFile(rel)
	return f, outside(fi), err
}

func (h homeOnly) ReadDir(name string, depth int) ([]sandbox.FileInfo, error) {
	rel, err := h.inside(name)
	if err != nil {
		return nil, err
	}
	return outsideAll(h.ws.ReadDir(rel, depth))
}

func (h homeOnly) Stat(name string) (sandbox.FileInfo, error) {
	rel, err := h.inside(name)
	if err != nil {
		return sandbox.FileInfo{}, err
	}
	fi, err := h.ws.Stat(rel)
	return outside(fi), err
}

func (h homeOnly) Remove(name string) error {
	rel, err := h.inside(name)
	if err != nil {
		return err
	}
	return h.ws.Remove(rel)
}

func (h homeOnly) Mkdir(name string) error {
	ed, err := editor(h.ws)
	if err != nil {
		return err
	}
	rel, err := h.inside(name)
	if err != nil {
		return err
	}
	return ed.Mkdir(rel)
}

func (h homeOnly) Rename(from, to string) error {
	ed, err := editor(h.ws)
	if err != nil {
		return err
	}
	src, err := h.inside(from)
	if err != nil {
		return err
	}
	dst, err := h.inside(to)
	if err != nil {
		return err
	}
	return ed.Rename(src, dst)
}

func (h homeOnly) Readlink(name string) (string, error) {
	l, ok := h.ws.(sandbox.WorkspaceLinker)
	if !ok {
		return "", fmt.Errorf("%w: this backend's workspace cannot read links", errUnsupported)
	}
	rel, err := h.inside(name)
	if err != nil {
		return "", err
	}
	return l.Readlink(rel)
}

func (h homeOnly) FileMetadata(name string) (map[string]string, error) {
	m, ok := h.ws.(sandbox.WorkspaceMetadata)
	if !ok {
		return nil, fmt.Errorf("%w: file metadata on this backend's files", errUnsupported)
	}
	rel, err := h.inside(name)
	if err != nil {
		return nil, err
	}
	return m.FileMetadata(rel)
}

func (h homeOnly) SetFileMetadata(name string, md map[string]string) error {
	m, ok := h.ws.(sandbox.WorkspaceMetadata)
	if !ok {
		return fmt.Errorf("%w: file metadata on this backend's files", errUnsupported)
	}
	rel, err := h.inside(name)
	if err != nil {
		return err
	}
	return m.SetFileMetadata(rel, md)
}

package e2b

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// writeInfo is what an upload answers per file (envd's EntryInfo over
// HTTP).
type writeInfo struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// entryInfo is filesystem.EntryInfo in protobuf's JSON mapping.
type entryInfo struct {
	Name string  `json:"name"`
	Type string  `json:"type"`
	Path string  `json:"path"`
	Size pbInt64 `json:"size"`
	// Mode is the permission bits alone (envd's); Permissions is the
	// whole mode as ls shows it ("drwxr-xr-x").
	Mode          uint32            `json:"mode"`
	Permissions   string            `json:"permissions"`
	Owner         string            `json:"owner"`
	Group         string            `json:"group"`
	ModifiedTime  pbTime            `json:"modifiedTime"`
	SymlinkTarget *string           `json:"symlinkTarget,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// sandboxUser owns every file of the workspace: the sandbox's one user,
// by E2B's name for it.
const sandboxUser = "user"

func entryOf(fi sandbox.FileInfo) entryInfo {
	mode := fi.Mode.Perm()
	typ := "FILE_TYPE_UNSPECIFIED"
	switch fi.Type {
	case "file":
		typ = "FILE_TYPE_FILE"
	case "dir":
		typ, mode = "FILE_TYPE_DIRECTORY", mode|fs.ModeDir
	case "symlink":
		typ, mode = "FILE_TYPE_SYMLINK", mode|fs.ModeSymlink
	default:
		mode |= fs.ModeIrregular
	}
	p := toSandbox(fi.Path)
	return entryInfo{Name: path.Base(p), Type: typ, Path: p, Size: pbInt64(fi.Size), Mode: uint32(mode.Perm()),
		Permissions: mode.String(), Owner: sandboxUser, Group: sandboxUser, ModifiedTime: pbTime(fi.ModTime)}
}

// detailedEntry is entryOf with what takes more than a stat: a link's
// target (as an absolute path in the sandbox, where the link names a
// relative one) and the file's metadata, where the backend's workspace
// keeps them.
func detailedEntry(ws sandbox.Workspace, fi sandbox.FileInfo) entryInfo {
	e := entryOf(fi)
	if fi.Type == "symlink" {
		if l, ok := ws.(sandbox.WorkspaceLinker); ok {
			if target, err := l.Readlink(fi.Path); err == nil {
				if !path.IsAbs(target) {
					target = path.Join(path.Dir(e.Path), target)
				}
				e.SymlinkTarget = &target
			}
		}
	}
	if m, ok := metadataOf(ws); ok && (fi.Type == "file" || fi.Type == "dir") {
		if md, err := m.FileMetadata(fi.Path); err == nil && len(md) > 0 {
			e.Metadata = md
		}
	}
	return e
}

// readFile serves GET /files?path=P: the file's bytes.
func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r)
	q := r.URL.Query()
	user, err := checkUser(q.Get("username"))
	if err != nil {
		s.fail(w, err)
		return
	}
	rel, err := toRoot(q.Get("path"), user)
	if err != nil {
		s.fail(w, err)
		return
	}
	ws, done, err := s.files(t, user)
	if err != nil {
		s.fail(w, err)
		return
	}
	defer done()
	if rel == "." || isHome(rel) {
		s.fail(w, fmt.Errorf("%w: %s is a directory", sandbox.ErrBadPath, toSandbox(rel)))
		return
	}
	f, fi, err := ws.OpenFile(rel)
	if err != nil {
		s.failFile(w, rel, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(rel)}))
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	w.WriteHeader(http.StatusOK)
	// The file may grow while it is sent: never more than its size then.
	io.Copy(w, io.LimitReader(f, fi.Size))
}

// failFile answers a file error, naming the file as the SDK's user wrote
// it (not the workspace's relative path).
func (s *Server) failFile(w http.ResponseWriter, rel string, err error) {
	if errors.Is(err, fs.ErrNotExist) {
		writeEnvdError(w, http.StatusNotFound, fmt.Sprintf("file %s not found", toSandbox(rel)))
		return
	}
	if errors.Is(err, sandbox.ErrBadPath) && strings.Contains(err.Error(), "not a regular file") {
		writeEnvdError(w, http.StatusBadRequest, fmt.Sprintf("%s is not a regular file (a directory, link or device)", toSandbox(rel)))
		return
	}
	s.fail(w, err)
}

// writeFiles serves POST /files: one file as the raw body
// (application/octet-stream, ?path=P), or any number as multipart form
// parts named "file" whose file names are their paths (?path=P, when
// given, names the only one).
func (s *Server) writeFiles(w http.ResponseWriter, r *http.Request) {
	t := targetOf(r)
	q := r.URL.Query()
	user, err := checkUser(q.Get("username"))
	if err != nil {
		s.fail(w, err)
		return
	}
	md, err := sandbox.MetadataFromHeader(r.Header)
	if err != nil {
		s.fail(w, err)
		return
	}
	b, err := s.svc.Get(t.owner, t.id)
	if err != nil {
		s.fail(w, err)
		return
	}
	ws, done, err := s.files(t, user)
	if err != nil {
		s.fail(w, err)
		return
	}
	defer done()
	limit := b.Limits().Disk
	meta, ok := metadataOf(ws)
	if len(md) > 0 && !ok {
		s.fail(w, fmt.Errorf("%w: file metadata on this backend's files", errUnsupported))
		return
	}
	write := func(name string, body io.Reader) (writeInfo, error) {
		rel, err := toRoot(name, user)
		if err != nil {
			return writeInfo{}, err
		}
		if rel == "." || isHome(rel) {
			return writeInfo{}, fmt.Errorf("%w: %s is a directory", sandbox.ErrBadPath, toSandbox(rel))
		}
		if err := ws.WriteFile(rel, body, limit); err != nil {
			if !s.ensureDirs(t, ws, path.Dir(rel), user, err) {
				return writeInfo{}, err
			}
			// Nothing of body was read: the directories' making
			// failed before the file was opened.
			if err := ws.WriteFile(rel, body, limit); err != nil {
				return writeInfo{}, err
			}
		}
		if len(md) > 0 {
			if err := meta.SetFileMetadata(rel, md); err != nil {
				return writeInfo{}, err
			}
		}
		return writeInfo{Name: path.Base(rel), Type: "file", Path: toSandbox(rel), Metadata: md}, nil
	}

	var body io.Reader = r.Body
	switch enc := r.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeEnvdError(w, http.StatusBadRequest, "the body is not valid gzip")
			return
		}
		defer zr.Close()
		body = zr
	default:
		writeEnvdError(w, http.StatusBadRequest, "unsupported Content-Encoding "+strconv.Quote(enc))
		return
	}
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	out := []writeInfo{}
	if mt != "multipart/form-data" {
		if q.Get("path") == "" {
			writeEnvdError(w, http.StatusBadRequest, "the path query parameter is required for a raw upload")
			return
		}
		info, err := write(q.Get("path"), body)
		if err != nil {
			s.failWrite(w, err)
			return
		}
		writeJSON(w, http.StatusOK, append(out, info))
		return
	}
	mr := multipart.NewReader(body, params["boundary"])
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			writeEnvdError(w, http.StatusBadRequest, "invalid multipart body: "+err.Error())
			return
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		// The part's file name is the path: read it raw, as
		// Part.FileName keeps only its last element.
		name := q.Get("path")
		if name == "" {
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			name = dp["filename"]
		}
		if name == "" {
			part.Close()
			writeEnvdError(w, http.StatusBadRequest, "a file part has no path (its file name)")
			return
		}
		info, err := write(name, part)
		part.Close()
		if err != nil {
			s.failWrite(w, err)
			return
		}
		out = append(out, info)
	}
	if len(out) == 0 {
		writeEnvdError(w, http.StatusBadRequest, "no file in the request")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) failWrite(w http.ResponseWriter, err error) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeEnvdError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	s.fail(w, err)
}

// Filesystem service.

type pathRequest struct {
	Path string `json:"path"`
}

type entryResponse struct {
	Entry entryInfo `json:"entry"`
}

// rpcWorkspace checks the user and maps a path, for a filesystem RPC.
func (s *Server) rpcWorkspace(r *http.Request, t target, p string) (sandbox.Workspace, string, func(), error) {
	user, err := rpcUser(r)
	if err != nil {
		return nil, "", nil, err
	}
	rel, err := toRoot(p, user)
	if err != nil {
		return nil, "", nil, err
	}
	ws, done, err := s.files(t, user)
	if err != nil {
		return nil, "", nil, err
	}
	return ws, rel, done, nil
}

// notFoundPath names a missing file as the caller wrote its path.
func notFoundPath(rel string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return newConnectError(codeNotFound, fmt.Sprintf("%s: no such file or directory", toSandbox(rel)))
	}
	return err
}

func (s *Server) stat(r *http.Request, t target, msg []byte) (any, error) {
	var req pathRequest
	if err := decodeMessage(msg, &req); err != nil {
		return nil, err
	}
	ws, rel, done, err := s.rpcWorkspace(r, t, req.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	fi, err := ws.Stat(rel)
	if err != nil {
		return nil, notFoundPath(rel, err)
	}
	return entryResponse{Entry: detailedEntry(ws, fi)}, nil
}

func editor(ws sandbox.Workspace) (sandbox.WorkspaceEditor, error) {
	e, ok := ws.(sandbox.WorkspaceEditor)
	if !ok {
		return nil, fmt.Errorf("%w: this backend's workspace cannot make directories or move files", errUnsupported)
	}
	return e, nil
}

func (s *Server) makeDir(r *http.Request, t target, msg []byte) (any, error) {
	var req pathRequest
	if err := decodeMessage(msg, &req); err != nil {
		return nil, err
	}
	ws, rel, done, err := s.rpcWorkspace(r, t, req.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	if rel == "." || isHome(rel) {
		return nil, newConnectError(codeAlreadyExists, toSandbox(rel)+" already exists")
	}
	ed, err := editor(ws)
	if err != nil {
		return nil, err
	}
	err = ed.Mkdir(rel)
	if user, _ := rpcUser(r); err != nil && s.ensureDirs(t, ws, rel, user, err) {
		err = nil // made, with its parents
	}
	if err != nil {
		if errors.Is(err, sandbox.ErrExists) {
			return nil, newConnectError(codeAlreadyExists, toSandbox(rel)+" already exists")
		}
		return nil, notFoundPath(rel, err)
	}
	fi, err := ws.Stat(rel)
	if err != nil {
		return nil, notFoundPath(rel, err)
	}
	return entryResponse{Entry: detailedEntry(ws, fi)}, nil
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

func (s *Server) move(r *http.Request, t target, msg []byte) (any, error) {
	var req moveRequest
	if err := decodeMessage(msg, &req); err != nil {
		return nil, err
	}
	ws, src, done, err := s.rpcWorkspace(r, t, req.Source)
	if err != nil {
		return nil, err
	}
	defer done()
	user, err := rpcUser(r)
	if err != nil {
		return nil, err
	}
	dst, err := toRoot(req.Destination, user)
	if err != nil {
		return nil, err
	}
	if src == "." || dst == "." || isHome(src) || isHome(dst) {
		return nil, fmt.Errorf("%w: the home directory itself cannot be moved or replaced", sandbox.ErrBadPath)
	}
	ed, err := editor(ws)
	if err != nil {
		return nil, err
	}
	if err := ed.Rename(src, dst); err != nil {
		return nil, notFoundPath(src, err)
	}
	fi, err := ws.Stat(dst)
	if err != nil {
		return nil, notFoundPath(dst, err)
	}
	return entryResponse{Entry: detailedEntry(ws, fi)}, nil
}

type listDirRequest struct {
	Path  string   `json:"path"`
	Depth pbUint32 `json:"depth"`
}

type listDirResponse struct {
	Entries []entryInfo `json:"entries"`
}

// maxListDepth bounds a listing's depth, as the workspace layer does.
const maxListDepth = 64

func (s *Server) listDir(r *http.Request, t target, msg []byte) (any, error) {
	var req listDirRequest
	if err := decodeMessage(msg, &req); err != nil {
		return nil, err
	}
	ws, rel, done, err := s.rpcWorkspace(r, t, req.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	depth := min(max(int(req.Depth), 1), maxListDepth)
	infos, err := ws.ReadDir(rel, depth)
	if err != nil {
		if errors.Is(err, sandbox.ErrBadPath) && strings.Contains(err.Error(), "not a directory") {
			return nil, newConnectError(codeInvalidArgument, toSandbox(rel)+" is not a directory")
		}
		return nil, notFoundPath(rel, err)
	}
	out := listDirResponse{Entries: make([]entryInfo, 0, len(infos))}
	for _, fi := range infos {
		out.Entries = append(out.Entries, detailedEntry(ws, fi))
	}
	return out, nil
}

func (s *Server) remove(r *http.Request, t target, msg []byte) (any, error) {
	var req pathRequest
	if err := decodeMessage(msg, &req); err != nil {
		return nil, err
	}
	ws, rel, done, err := s.rpcWorkspace(r, t, req.Path)
	if err != nil {
		return nil, err
	}
	defer done()
	if rel == "." || isHome(rel) {
		return nil, fmt.Errorf("%w: %s itself cannot be removed", sandbox.ErrBadPath, toSandbox(rel))
	}
	// Removing what is not there succeeds, as envd's Remove does.
	if err := ws.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, notFoundPath(rel, err)
	}
	return struct{}{}, nil
}

// ensureDirs makes dir (toRoot's) and its missing parents as the
// sandbox's root, each owned by user, after err refused user the
// making of them, as E2B's envd (root) makes a path's directories for a
// user's write anywhere (files.write('/data/out.csv')). It reports
// whether it made them: the caller then tries again, as user. Only
// directories that did not exist are made and given to user; an
// existing one keeps its owner and mode.
func (s *Server) ensureDirs(t target, ws sandbox.Workspace, dir, user string, err error) bool {
	if user == sandbox.UserRoot || !errors.Is(err, sandbox.ErrPermission) || dir == "." || isHome(dir) {
		return false
	}
	if _, err := ws.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		return false // there, or not a matter of its absence
	}
	if err := s.svc.MakeDirsFor(t.owner, t.id, dir, user); err != nil {
		s.log.Debug("e2b: make a user's directories as root", "sandbox", t.id, "dir", toSandbox(dir), "err", err)
		return false
	}
	return true
}

package e2b

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// E2B's volumes, over the service's volume store: the control plane
// creates, lists, describes and deletes them (/volumes, X-API-Key), the
// volume content API (/volumecontent/{volumeID}/file|dir|path, which the
// SDKs reach at E2B_VOLUME_API_URL, the same prefix) reads and writes
// their files without a sandbox, authenticated by the volume's token
// (Authorization: Bearer, handed out by create and get) or by the API
// key, and sandboxes mount them by name (volumeMounts). A token (the
// service's, tokens.go) opens that one volume while its key is live,
// until the server restarts (Volume.connect gets a new one).

type (
	volumeInfo struct {
		VolumeID string `json:"volumeID"`
		Name     string `json:"name"`
	}
	volumeAndToken struct {
		VolumeID string `json:"volumeID"`
		Name     string `json:"name"`
		Token    string `json:"token"`
	}
	// volumeEntry is E2B's VolumeEntryStat.
	volumeEntry struct {
		Name   string    `json:"name"`
		Path   string    `json:"path"`
		Type   string    `json:"type"` // file, directory, symlink or unknown
		Size   int64     `json:"size"`
		Mode   uint32    `json:"mode"`
		UID    uint32    `json:"uid"`
		GID    uint32    `json:"gid"`
		ATime  time.Time `json:"atime"`
		MTime  time.Time `json:"mtime"`
		CTime  time.Time `json:"ctime"`
		Target string    `json:"target,omitempty"`
	}
	volumeMount struct {
		Name string `json:"name"`
		Path string `json:"path"`
	}
	// metadataBody is the body of PATCH /volumecontent/{id}/path.
	metadataBody struct {
		UID  *uint32 `json:"uid"`
		GID  *uint32 `json:"gid"`
		Mode *uint32 `json:"mode"`
	}
)

func (s *Server) routeVolumes() {
	m := s.control
	owned := func(h func(http.ResponseWriter, *http.Request, string, *volume.Store)) func(http.ResponseWriter, *http.Request, string) {
		return func(w http.ResponseWriter, r *http.Request, owner string) {
			st := s.svc.Volumes()
			if st == nil {
				s.fail(w, service.ErrNoVolumes)
				return
			}
			h(w, r, owner, st)
		}
	}
	m.HandleFunc("POST /volumes", s.withKey(owned(s.createVolume)))
	m.HandleFunc("GET /volumes", s.withKey(owned(func(w http.ResponseWriter, r *http.Request, owner string, st *volume.Store) {
		out := []volumeInfo{}
		for _, v := range st.List(owner) {
			out = append(out, volumeInfo{VolumeID: v.ID, Name: v.Name})
		}
		writeJSON(w, http.StatusOK, out)
	})))
	m.HandleFunc("GET /volumes/{volumeID}", s.withKey(owned(func(w http.ResponseWriter, r *http.Request, owner string, st *volume.Store) {
		v, err := st.Get(owner, r.PathValue("volumeID"))
		if err != nil {
			s.fail(w, err)
			return
		}
		writeJSON(w, http.StatusOK, volumeAndToken{VolumeID: v.ID, Name: v.Name, Token: s.volumeToken(owner, v.ID)})
	})))
	m.HandleFunc("DELETE /volumes/{volumeID}", s.withKey(owned(func(w http.ResponseWriter, r *http.Request, owner string, st *volume.Store) {
		if err := st.Delete(owner, r.PathValue("volumeID")); err != nil {
			s.fail(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})))
	for _, route := range []string{"GET /volumecontent/{volumeID}/dir", "POST /volumecontent/{volumeID}/dir",
		"GET /volumecontent/{volumeID}/path", "PATCH /volumecontent/{volumeID}/path", "DELETE /volumecontent/{volumeID}/path",
		"GET /volumecontent/{volumeID}/file", "PUT /volumecontent/{volumeID}/file"} {
		m.HandleFunc(route, s.volumeContent)
	}
}

// withKey authenticates a control-plane request by its API key.
func (s *Server) withKey(h func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		owner, ok := s.owner(r)
		if !ok {
			writeEnvdError(w, http.StatusUnauthorized, "a valid vivarium API key is required in X-API-Key (E2B_API_KEY)")
			return
		}
		h(w, r, owner)
	}
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request, owner string, st *volume.Store) {
	var req struct {
		Name string `json:"name"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	v, err := st.Create(owner, req.Name, 0)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeAndToken{VolumeID: v.ID, Name: v.Name, Token: s.volumeToken(owner, v.ID)})
}

// volumeToken opens volume id of owner on the content API (the
// service's token: tokens.go).
func (s *Server) volumeToken(owner, id string) string { return s.svc.VolumeToken(owner, id) }

// volumeOwner authenticates a content request for volume id: by the
// volume's token, or by an API key.
func (s *Server) volumeOwner(r *http.Request, id string) (string, bool) {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if owner, ok := s.svc.VolumeTokenOwner(strings.TrimSpace(tok), id); ok {
		return owner, true
	}
	return s.owner(r)
}

// volumeRel maps a path of a volume (absolute or not, "/" its root) to
// the content layer's, which resolves it confined to the volume.
func volumeRel(p string) (string, error) {
	switch {
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("%w: path contains a NUL byte", sandbox.ErrBadPath)
	case len(p) > maxPathLen:
		return "", fmt.Errorf("%w: path is too long", sandbox.ErrBadPath)
	}
	abs := path.Clean("/" + p)
	if abs == "/" {
		return ".", nil
	}
	return abs[1:], nil
}

func (s *Server) volumeContent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("volumeID")
	owner, ok := s.volumeOwner(r, id)
	if !ok {
		writeEnvdError(w, http.StatusUnauthorized, "a valid volume token (Authorization: Bearer) or API key is required")
		return
	}
	st := s.svc.Volumes()
	if st == nil {
		s.fail(w, service.ErrNoVolumes)
		return
	}
	q := r.URL.Query()
	rel, err := volumeRel(q.Get("path"))
	if err != nil {
		s.fail(w, err)
		return
	}
	op := r.Method + " " + r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	var mode *uint32
	if m := q.Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 10, 32)
		if err != nil {
			writeEnvdError(w, http.StatusBadRequest, "mode must be a number")
			return
		}
		mode = new(uint32)
		*mode = uint32(v)
	}
	if err := checkOwnerIDs(q.Get("uid"), q.Get("gid")); err != nil {
		s.fail(w, err)
		return
	}
	err = st.Content(owner, id, func(v volume.Volume, d *volume.Dir) error {
		switch op {
		case "GET dir":
			depth := 1
			if s := q.Get("depth"); s != "" {
				var err error
				if depth, err = strconv.Atoi(s); err != nil || depth < 1 || depth > 64 {
					return fmt.Errorf("%w: depth must be an integer from 1 to 64", sandbox.ErrBadPath)
				}
			}
			fis, err := d.ReadDir(rel, depth)
			if err != nil {
				return err
			}
			out := []volumeEntry{}
			for _, fi := range fis {
				out = append(out, volumeEntryOf(d, fi))
			}
			writeJSON(w, http.StatusOK, out)
			return nil
		case "POST dir":
			if rel == "." {
				return fmt.Errorf("%w: the volume's root exists", sandbox.ErrExists)
			}
			err := d.Mkdir(rel)
			if errors.Is(err, sandbox.ErrExists) && q.Get("force") == "true" {
				err = nil
			}
			if err == nil && mode != nil {
				err = d.Chmod(rel, *mode)
			}
			return s.answerEntry(w, d, rel, err)
		case "GET path":
			return s.answerEntry(w, d, rel, nil)
		case "PATCH path":
			var body metadataBody
			if !decodeBody(w, r, &body) {
				return nil
			}
			if body.UID != nil || body.GID != nil {
				if err := checkOwnerIDs(fmtID(body.UID), fmtID(body.GID)); err != nil {
					return err
				}
			}
			var err error
			if body.Mode != nil {
				err = d.Chmod(rel, *body.Mode)
			}
			return s.answerEntry(w, d, rel, err)
		case "DELETE path":
			if err := d.Remove(rel); err != nil {
				return err
			}
			w.WriteHeader(http.StatusNoContent)
			return nil
		case "GET file":
			f, fi, err := d.OpenFile(rel)
			if err != nil {
				return err
			}
			defer f.Close()
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
			w.WriteHeader(http.StatusOK)
			io.Copy(w, io.LimitReader(f, fi.Size))
			return nil
		case "PUT file":
			// A file is written whole (atomically), its missing parents
			// made, whatever force says.
			err := d.WriteFile(rel, r.Body, v.Size)
			if err == nil && mode != nil {
				err = d.Chmod(rel, *mode)
			}
			return s.answerEntry(w, d, rel, err)
		}
		return fmt.Errorf("%w: %s", errUnsupported, op)
	})
	if err != nil {
		s.fail(w, err)
	}
}

// checkOwnerIDs refuses owners other than the sandbox user: the content
// API writes as that user, who cannot give files away.
func checkOwnerIDs(uid, gid string) error {
	for _, v := range []string{uid, gid} {
		if v != "" && v != strconv.Itoa(volume.OwnerUID) {
			return fmt.Errorf("%w: files written through the volume API belong to the sandbox user (uid and gid %d)",
				sandbox.ErrInvalidSpec, volume.OwnerUID)
		}
	}
	return nil
}

func fmtID(p *uint32) string {
	if p == nil {
		return ""
	}
	return strconv.FormatUint(uint64(*p), 10)
}

// answerEntry answers with rel's entry, unless err.
func (s *Server) answerEntry(w http.ResponseWriter, d *volume.Dir, rel string, err error) error {
	if err != nil {
		return err
	}
	fi, err := d.Stat(rel)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, volumeEntryOf(d, fi))
	return nil
}

func volumeEntryOf(d *volume.Dir, fi sandbox.FileInfo) volumeEntry {
	typ := map[string]string{"file": "file", "dir": "directory", "symlink": "symlink"}[fi.Type]
	if typ == "" {
		typ = "unknown"
	}
	p := "/" + strings.TrimPrefix(fi.Path, "./")
	if fi.Path == "." {
		p = "/"
	}
	e := volumeEntry{Name: path.Base(p), Path: p, Type: typ, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		UID: fi.UID, GID: fi.GID, ATime: fi.AccessTime.UTC(), MTime: fi.ModTime.UTC(), CTime: fi.ChangeTime.UTC()}
	if typ == "symlink" {
		e.Target, _ = d.Readlink(fi.Path)
	}
	return e
}

// volumeMounts turns E2B's volumeMounts into the service's requests.
func volumeMounts(ms []volumeMount) []service.VolumeRequest {
	var out []service.VolumeRequest
	for _, m := range ms {
		out = append(out, service.VolumeRequest{Name: m.Name, Path: m.Path})
	}
	return out
}

// mountsOf is a sandbox's volumeMounts as E2B describes them.
func mountsOf(info service.Info) []any {
	out := []any{}
	for _, v := range info.Volumes {
		out = append(out, volumeMount{Name: v.Name, Path: v.Path})
	}
	return out
}

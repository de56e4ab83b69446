package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/portproxy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/template"
)

// E2B's template build API, as its Template SDK calls it
// (Template.build):
//
//  1. POST /v3/templates {name, tags, cpuCount, memoryMB}: a build of the
//     template name ("name" or "name:tag"), made if new; 202
//     {templateID, buildID, names, tags}.
//  2. For each COPY step, GET /templates/{templateID}/files/{hash}: 201
//     {present} and, when not present, {url}, where the SDK PUTs a tar
//     (gzipped) of the step's files. The URL is this server's, signed
//     for that template and hash (uploadURL), and needs no key.
//  3. POST /v2/templates/{templateID}/builds/{buildID} {fromImage |
//     fromTemplate, steps, startCmd, readyCmd, force}: the build starts;
//     202.
//  4. GET /templates/{templateID}/builds/{buildID}/status?logsOffset=N,
//     polled until ready or error: {status, logEntries (at most 100 from
//     the offset), reason {message, step}}.
//
// Beside them: GET /templates/aliases/{name} (Template.exists), POST and
// DELETE /templates/tags and GET /templates/{templateID}/tags (tags), and
// DELETE /templates/{templateID} (a template, or a snapshot). Templates
// are the key's (service/builds.go); the build itself is the service's
// TemplateBuilder's.

// uploadURLLife is how long a files upload URL is good for: the SDK's
// own upload timeout.
const uploadURLLife = time.Hour

// uploadReadTimeout bounds the reading of one upload.
const uploadReadTimeout = 30 * time.Minute

// maxStatusLogs is the most log lines a status answers, as E2B's.
const maxStatusLogs = 100

func (s *Server) routeTemplates(handle func(string, func(http.ResponseWriter, *http.Request, string))) {
	handle("POST /v3/templates", s.requestBuild)
	handle("GET /templates/{templateID}/files/{hash}", s.buildFilesLink)
	// Signed, not keyed: the SDK sends the files without its key.
	s.control.HandleFunc("PUT /templates/{templateID}/files/{hash}", s.uploadBuildFiles)
	handle("POST /v2/templates/{templateID}/builds/{buildID}", s.startBuild)
	handle("GET /templates/{templateID}/builds/{buildID}/status", s.buildStatus)
	// /templates/aliases/{alias} and /templates/{templateID}/tags as one
	// pattern: ServeMux takes neither as the more precise.
	handle("GET /templates/{templateID}/{what}", func(w http.ResponseWriter, r *http.Request, owner string) {
		switch {
		case r.PathValue("templateID") == "aliases":
			s.templateAlias(w, r, owner)
		case r.PathValue("what") == "tags":
			s.templateTags(w, r, owner)
		default:
			s.unsupported(w, fmt.Sprintf("%s %s (templates, secrets and teams are E2B's cloud, not part of vivarium)",
				r.Method, r.URL.Path))
		}
	})
	handle("POST /templates/tags", s.assignTags)
	handle("DELETE /templates/tags", s.removeTags)
}

// requestBuild is POST /v3/templates (TemplateBuildRequestV3).
func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request, owner string) {
	var req struct {
		Name  string   `json:"name"`
		Alias string   `json:"alias"` // deprecated: name
		Tags  []string `json:"tags"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	if req.Name == "" {
		req.Name = req.Alias
	}
	if req.Name == "" {
		writeEnvdError(w, http.StatusBadRequest, "a template build needs a name")
		return
	}
	c, err := s.svc.RequestBuild(owner, service.BuildRequest{Name: req.Name, Tags: req.Tags})
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"templateID": c.TemplateID, "buildID": c.BuildID,
		"public": false, "names": []string{c.Name}, "aliases": []string{c.Name}, "tags": c.Tags})
}

// buildFilesLink is GET /templates/{templateID}/files/{hash}
// (TemplateBuildFileUpload).
func (s *Server) buildFilesLink(w http.ResponseWriter, r *http.Request, owner string) {
	id, hash := r.PathValue("templateID"), r.PathValue("hash")
	present, err := s.svc.BuildFilesPresent(owner, id, hash)
	if err != nil {
		s.fail(w, err)
		return
	}
	if present {
		writeJSON(w, http.StatusCreated, map[string]any{"present": true})
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"present": false, "url": s.uploadURL(r, id, hash)})
}

// uploadURL is the URL where the files of hash for template id are
// PUT: this server's, as the request reached it, signed with the
// server's secret for that template and hash until it expires.
func (s *Server) uploadURL(r *http.Request, id, hash string) string {
	exp := strconv.FormatInt(time.Now().Add(uploadURLLife).Unix(), 10)
	scheme, base := "http", s.cfg.Prefix
	if r.TLS != nil {
		scheme = "https"
	}
	if portproxy.IsHost(r.Host, "api", s.cfg.Domain) {
		// api.DOMAIN serves the API at its root, behind TLS.
		scheme, base = "https", ""
	}
	return fmt.Sprintf("%s://%s%s/templates/%s/files/%s?expires=%s&signature=%s", scheme, r.Host, base, id, hash, exp,
		s.uploadSignature(id, hash, exp))
}

func (s *Server) uploadSignature(id, hash, exp string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("build files\x00" + id + "\x00" + hash + "\x00" + exp))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// uploadBuildFiles is the PUT of uploadURL: the SDK's archive of a COPY's
// files.
func (s *Server) uploadBuildFiles(w http.ResponseWriter, r *http.Request) {
	id, hash := r.PathValue("templateID"), r.PathValue("hash")
	q := r.URL.Query()
	exp, sig := q.Get("expires"), q.Get("signature")
	expires, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || !hmac.Equal([]byte(sig), []byte(s.uploadSignature(id, hash, exp))) {
		writeEnvdError(w, http.StatusForbidden, "invalid upload URL: use the URL the server answered for these files, unchanged")
		return
	}
	if time.Now().Unix() > expires {
		writeEnvdError(w, http.StatusForbidden, "the upload URL has expired: ask for the files' upload URL again")
		return
	}
	owner, ok := s.svc.TemplateOwner(id)
	if !ok {
		writeEnvdError(w, http.StatusNotFound, fmt.Sprintf("template %q not found: it was deleted", id))
		return
	}
	// The client sends at its pace, for at most this long.
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(uploadReadTimeout))
	if err := s.svc.PutBuildFiles(owner, id, hash, r.Body); err != nil {
		if errors.Is(err, template.ErrTooLarge) {
			// The table's too_large is E2B's 507 (NotEnoughSpaceError,
			// a sandbox's disk); an upload past its bound is 413, as a
			// storage service answers it.
			writeEnvdError(w, http.StatusRequestEntityTooLarge, err.Error())
			return
		}
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// buildStart is TemplateBuildStartV2.
type buildStart struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry any             `json:"fromImageRegistry"`
	Force             bool            `json:"force"`
	Steps             []template.Step `json:"steps"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
}

// startBuild is POST /v2/templates/{templateID}/builds/{buildID}.
func (s *Server) startBuild(w http.ResponseWriter, r *http.Request, owner string) {
	var req buildStart
	if !decodeBody(w, r, &req) {
		return
	}
	if req.FromImageRegistry != nil {
		writeEnvdError(w, http.StatusBadRequest, "registry credentials in a template (fromImage with credentials, "+
			"fromAWSRegistry, fromGCPRegistry) are not supported: the server pulls images with its own credentials "+
			"(vivarium image pull --auth-file, or an image imported with vivarium image import)")
		return
	}
	spec := template.Spec{FromImage: req.FromImage, FromTemplate: req.FromTemplate, Steps: req.Steps,
		StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd}
	if spec.Steps == nil {
		spec.Steps = []template.Step{}
	}
	if err := s.svc.StartBuild(owner, r.PathValue("templateID"), r.PathValue("buildID"), spec, req.Force); err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, struct{}{})
}

// buildLogEntry is E2B's BuildLogEntry.
type buildLogEntry struct {
	Timestamp string `json:"timestamp"`
	Level     string `json:"level"`
	Message   string `json:"message"`
}

// buildStatus is GET /templates/{templateID}/builds/{buildID}/status
// (TemplateBuildInfo): the state and the log from logsOffset on, at most
// limit (100) lines.
func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request, owner string) {
	q := r.URL.Query()
	offset, limit := 0, maxStatusLogs
	for name, v := range map[string]*int{"logsOffset": &offset, "limit": &limit} {
		if raw := q.Get(name); raw != "" {
			n, err := strconv.Atoi(raw)
			if err != nil || n < 0 {
				writeEnvdError(w, http.StatusBadRequest, name+" is a whole number, 0 or more")
				return
			}
			*v = n
		}
	}
	st, err := s.svc.BuildStatus(owner, r.PathValue("templateID"), r.PathValue("buildID"), offset, min(limit, maxStatusLogs))
	if err != nil {
		s.fail(w, err)
		return
	}
	entries, lines := []buildLogEntry{}, []string{}
	for _, e := range st.Log {
		ts := e.Time.UTC().Format(time.RFC3339Nano)
		entries = append(entries, buildLogEntry{Timestamp: ts, Level: e.Level, Message: e.Message})
		lines = append(lines, ts+" "+e.Message)
	}
	out := map[string]any{"templateID": st.TemplateID, "buildID": st.BuildID, "status": st.State,
		"logEntries": entries, "logs": lines}
	if st.State == service.BuildError {
		reason := map[string]any{"message": st.Reason, "logEntries": []buildLogEntry{}}
		// The SDKs point at the template's line of the step: "base" for
		// its base, a step's number (from 1), "finalize" for the start.
		switch {
		case st.Step == 0:
			reason["step"] = "base"
		case st.Step > 0 && st.Step <= st.Steps:
			reason["step"] = strconv.Itoa(st.Step)
		case st.Step > st.Steps:
			reason["step"] = "finalize"
		}
		out["reason"] = reason
	}
	writeJSON(w, http.StatusOK, out)
}

// templateAlias is GET /templates/aliases/{alias} (Template.exists):
// 200 for E2B's own templates, the key's templates and its snapshots'
// names; 404 for any other, another key's included.
func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request, owner string) {
	name := r.PathValue("what")
	switch info, err := s.svc.TemplateByName(owner, name); {
	case slices.Contains(KnownTemplates, name):
		writeJSON(w, http.StatusOK, map[string]any{"templateID": name, "public": true})
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]any{"templateID": info.ID, "public": false})
	case snapshotRef(name) != "" && s.hasSnapshot(owner, snapshotRef(name)):
		writeJSON(w, http.StatusOK, map[string]any{"templateID": snapshotRef(name), "public": false})
	default:
		writeEnvdError(w, http.StatusNotFound, fmt.Sprintf("template %q not found", name))
	}
}

// templateTags is GET /templates/{templateID}/tags: a template's tags
// (by its ID or name), each with its build.
func (s *Server) templateTags(w http.ResponseWriter, r *http.Request, owner string) {
	info, err := s.svc.TemplateByName(owner, r.PathValue("templateID"))
	if err != nil {
		s.fail(w, err)
		return
	}
	out := []map[string]any{}
	for _, t := range info.Tags {
		out = append(out, map[string]any{"tag": t.Tag, "buildID": t.BuildID,
			"createdAt": t.Assigned.UTC().Format(time.RFC3339Nano)})
	}
	writeJSON(w, http.StatusOK, out)
}

// assignTags is POST /templates/tags {target: "name:tag", tags}: the
// build target names gets tags too.
func (s *Server) assignTags(w http.ResponseWriter, r *http.Request, owner string) {
	var req struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	if len(req.Tags) == 0 {
		writeEnvdError(w, http.StatusBadRequest, "no tags to assign")
		return
	}
	id, err := s.svc.AssignTags(owner, req.Target, req.Tags)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"buildID": id, "tags": req.Tags})
}

// removeTags is DELETE /templates/tags {name, tags}.
func (s *Server) removeTags(w http.ResponseWriter, r *http.Request, owner string) {
	var req struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	if err := s.svc.RemoveTags(owner, req.Name, req.Tags); err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// deleteTemplate deletes the key's template id names (by ID or name),
// and says whether it answered: not when the key has no such template,
// or the server no builds (builds false).
func (s *Server) deleteTemplate(w http.ResponseWriter, owner, id string) (answered, builds bool) {
	err := s.svc.DeleteTemplate(owner, id)
	switch {
	case errors.Is(err, sandbox.ErrUnsupported):
		return false, false
	case errors.Is(err, service.ErrTemplateNotFound):
		return false, true
	case err != nil:
		s.fail(w, err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
	return true, true
}

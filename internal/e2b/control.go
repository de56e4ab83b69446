package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/jsonerr"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// KnownTemplates are the templates Vivarium answers to: E2B's base template and its code
// interpreter. A Vivarium sandbox is the host's Python with its packages,
// whatever it is called.
var KnownTemplates = []string{"base", "code-interpreter-v1", "code-interpreter"}

// clientID is what E2B's deprecated clientID field says.
const clientID = "vivarium"

// maxControlBody bounds control-plane request bodies.
const maxControlBody = 1 << 20

func (s *Server) routeControl() {
	m := s.control
	handle := func(pattern string, h func(http.ResponseWriter, *http.Request, string)) {
		m.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			owner, ok := s.owner(r)
			if !ok {
				writeEnvdError(w, http.StatusUnauthorized, "a valid vivarium API key is required in X-API-Key (E2B_API_KEY)")
				return
			}
			h(w, r, owner)
		})
	}
	handle("POST /sandboxes", s.create)
	handle("POST /v2/sandboxes", s.create)
	handle("GET /sandboxes", s.list)
	handle("GET /v2/sandboxes", s.list)
	handle("GET /sandboxes/{id}", s.get)
	handle("DELETE /sandboxes/{id}", s.kill)
	handle("POST /sandboxes/{id}/timeout", s.setTimeout)
	handle("POST /sandboxes/{id}/refreshes", s.refresh)
	handle("POST /sandboxes/{id}/connect", s.connect)
	handle("POST /v2/sandboxes/{id}/connect", s.connect)
	handle("GET /sandboxes/{id}/metrics", s.metrics)
	handle("GET /sandboxes/metrics", s.latestMetrics)
	handle("PUT /sandboxes/{id}/network", s.updateNetwork)
	handle("POST /sandboxes/{id}/pause", s.pause)
	handle("POST /sandboxes/{id}/resume", s.resume)
	handle("POST /sandboxes/{id}/fork", s.fork)
	s.routeVolumes()
	handle("POST /sandboxes/{id}/snapshots", s.createSnapshot)
	handle("GET /snapshots", s.listSnapshots)
	handle("DELETE /templates/{id}", s.deleteSnapshot)
	s.routeTemplates(handle)
	for pattern, what := range map[string]string{
		"GET /sandboxes/{id}/logs":    "sandbox logs",
		"GET /v2/sandboxes/{id}/logs": "sandbox logs",
	} {
		handle(pattern, func(w http.ResponseWriter, r *http.Request, owner string) {
			// What is asked of a sandbox is checked first, as E2B does:
			// a fork of nothing is a bad request, a sandbox that is gone
			// (or another key's) is not found.
			if id := r.PathValue("id"); id != "" {
				if !s.svc.Exists(owner, id) {
					s.notFound(w, r, service.ErrNotFound)
					return
				}
			}
			s.unsupported(w, what)
		})
	}
	handle("/", func(w http.ResponseWriter, r *http.Request, _ string) {
		s.unsupported(w, fmt.Sprintf("%s %s (templates, secrets and teams are E2B's cloud, not part of vivarium)",
			r.Method, r.URL.Path))
	})
}

func (s *Server) unsupported(w http.ResponseWriter, what string) {
	writeEnvdError(w, http.StatusNotImplemented, what+" is not supported by vivarium's E2B-compatible API")
}

func (s *Server) fail(w http.ResponseWriter, err error) {
	code, msg := httpStatus(s.log, err)
	writeEnvdError(w, code, msg)
}

// decodeBody reads a JSON body into v; an empty body leaves v as it is.
// Unknown fields are ignored, as E2B's API adds fields with new SDKs.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxControlBody))
	if err != nil {
		writeEnvdError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return false
	}
	if len(body) == 0 {
		return true
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeEnvdError(w, http.StatusBadRequest, "invalid JSON body: "+jsonerr.Message(err))
		return false
	}
	return true
}

// newSandbox is the body of POST /sandboxes (NewSandbox) and
// POST /v2/sandboxes (NewSandboxV2).
type newSandbox struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout"` // seconds
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  *bool             `json:"autoPause"`
	// AutoPauseMemory false: the timeout's pause keeps the files alone
	// (lifecycle onTimeout { action: 'pause', keepMemory: false }).
	AutoPauseMemory *bool `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	// AllowInternetAccess and Network's egress fields: see network.go.
	AllowInternetAccess *bool           `json:"allow_internet_access"`
	Network             *networkConfig  `json:"network"`
	MCP                 json.RawMessage `json:"mcp"`
	VolumeMounts        []volumeMount   `json:"volumeMounts"`
	IAM                 *struct {
		Tokens map[string]any `json:"tokens"`
	} `json:"iam"`
}

type networkConfig struct {
	AllowOut        []string        `json:"allowOut"`
	DenyOut         []string        `json:"denyOut"`
	Rules           map[string]any  `json:"rules"`
	EgressProxy     json.RawMessage `json:"egressProxy"`
	MaskRequestHost string          `json:"maskRequestHost"`
	HTTPSPorts      []int           `json:"httpsPorts"`
}

// check refuses what Vivarium cannot honour, naming it; network settings
// are network.go's.
func (n *newSandbox) check() error {
	unsupported := func(what string) error { return fmt.Errorf("%w: %s", errUnsupported, what) }
	switch {
	case n.Timeout != nil && *n.Timeout < 0:
		return fmt.Errorf("%w: negative timeout", sandbox.ErrInvalidSpec)
	case n.AutoResume != nil && n.AutoResume.Enabled && (n.AutoPause == nil || !*n.AutoPause):
		return fmt.Errorf("%w: autoResume needs lifecycle onTimeout \"pause\"", sandbox.ErrInvalidSpec)
	case len(n.MCP) > 0 && string(n.MCP) != "null":
		return unsupported("the MCP gateway")
	case n.IAM != nil && len(n.IAM.Tokens) > 0:
		return unsupported("workload identity (iam)")
	}
	return n.Network.check()
}

// sandboxCreated is E2B's Sandbox: what create and connect answer.
type sandboxCreated struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

func (s *Server) created(owner, id string) sandboxCreated {
	tpl := s.template(id)
	tok := s.accessToken(owner, id)
	return sandboxCreated{SandboxID: id, TemplateID: tpl, Alias: tpl, ClientID: clientID, EnvdVersion: envdVersion,
		EnvdAccessToken: tok, TrafficAccessToken: tok, Domain: s.domain()}
}

func (s *Server) template(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.templates[id].name; t != "" {
		return t
	}
	return "base"
}

// templateSweepAt is how many templates are remembered before those of
// sandboxes that are gone (ended by their timeout, or through Vivarium's
// own API) are forgotten.
const templateSweepAt = 1024

// rememberTemplate records the template a sandbox was created from, and
// forgets those of sandboxes that are gone now and then. Whether a
// sandbox is still there is asked of the service outside s.mu, and
// without resuming it (Exists, not Get): a sweep neither wakes other
// keys' paused sandboxes nor holds up the requests that read templates.
func (s *Server) rememberTemplate(owner, id, tpl string) {
	live := s.svc.Live()
	s.mu.Lock()
	s.templates[id] = templateOf{owner: owner, name: tpl}
	var seen []target
	if n := len(s.templates); !s.sweepingTemplates && n >= s.templateSweepAt && n > 2*live {
		s.sweepingTemplates = true
		seen = make([]target, 0, n)
		for k, t := range s.templates {
			seen = append(seen, target{owner: t.owner, id: k})
		}
	}
	s.mu.Unlock()
	if seen == nil {
		return
	}
	// A sandbox's ID is never made again: one found gone stays gone, and
	// its entry can be deleted after the check.
	var gone []string
	for _, t := range seen {
		if !s.svc.Exists(t.owner, t.id) {
			gone = append(gone, t.id)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range gone {
		delete(s.templates, k)
	}
	s.sweepingTemplates = false
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, owner string) {
	var req newSandbox
	if !decodeBody(w, r, &req) {
		return
	}
	if err := req.check(); err != nil {
		s.fail(w, err)
		return
	}
	var idle time.Duration
	if req.Timeout != nil {
		idle = sandbox.Seconds(float64(*req.Timeout))
	}
	// E2B's layout: the user is "user", at home (and working) in /home/user.
	env := maps.Clone(req.EnvVars)
	if env == nil {
		env = map[string]string{}
	}
	env["E2B_SANDBOX"] = "true"
	create := service.CreateRequest{Owner: owner, Idle: idle, Env: env, Metadata: req.Metadata,
		Network: networkRequest(req.AllowInternetAccess, req.Network), Home: sandbox.HomeUser,
		IDEnv: []string{"E2B_SANDBOX_ID"}, Ports: req.Network.portOptions(), Volumes: volumeMounts(req.VolumeMounts),
		OnTimeout: req.onTimeout(), AutoResume: req.AutoResume != nil && req.AutoResume.Enabled, Pausable: s.cfg.Pausable,
		PauseFilesOnly: req.AutoPauseMemory != nil && !*req.AutoPauseMemory}
	ref := snapshotRef(req.TemplateID)
	switch {
	case ref != "" && (sandboxid.Snapshot.Valid(ref) || s.hasSnapshot(owner, ref)):
		// Sandbox.create(snapshotId or name): the snapshot's environment
		// and home, E2B's among them.
		create = service.CreateRequest{Owner: owner, Idle: idle, Metadata: req.Metadata, FromSnapshot: ref,
			OnTimeout: create.OnTimeout, AutoResume: create.AutoResume, PauseFilesOnly: create.PauseFilesOnly}
		if len(req.EnvVars) > 0 || len(req.VolumeMounts) > 0 || !create.Network.Empty() {
			s.fail(w, fmt.Errorf("%w: a sandbox made from a snapshot has the snapshot's environment, and no volumes or network yet",
				sandbox.ErrInvalidSpec))
			return
		}
	case req.TemplateID != "" && !slices.Contains(KnownTemplates, req.TemplateID):
		// A template of the server's image store (docs/templates.md).
		create.Template = req.TemplateID
	}
	info, err := s.svc.Create(r.Context(), create)
	if errors.Is(err, service.ErrSnapshotNotFound) || errors.Is(err, service.ErrNoTemplate) {
		writeEnvdError(w, http.StatusNotFound, fmt.Sprintf("template %q not found: no snapshot of this key's, and no "+
			"template of this key's or of the server's (vivarium image ls), has that name", req.TemplateID))
		return
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	s.writeRunFiles(owner, info.ID)
	tpl := req.TemplateID
	if tpl == "" {
		tpl = "base"
	}
	s.rememberTemplate(owner, info.ID, tpl)
	writeJSON(w, http.StatusCreated, s.created(owner, info.ID))
}

// writeRunFiles writes what envd leaves in /run/e2b for programs that
// read it rather than their environment: .E2B_SANDBOX and .E2B_SANDBOX_ID.
// A backend whose root cannot be reached from the host keeps only the
// environment variables.
func (s *Server) writeRunFiles(owner, id string) {
	root, done, err := s.svc.FileSystem(owner, id, sandbox.UserRoot)
	if errors.Is(err, sandbox.ErrUnsupported) {
		return
	}
	if err == nil {
		defer done()
		for name, value := range map[string]string{".E2B_SANDBOX": "true", ".E2B_SANDBOX_ID": id} {
			if err = root.WriteFile("run/e2b/"+name, strings.NewReader(value), 256); err != nil {
				break
			}
		}
	}
	if err != nil {
		s.log.Warn("e2b: /run/e2b not written", "id", id, "err", err)
	}
}

// listedSandbox is E2B's ListedSandbox and, with the detail fields,
// SandboxDetail.
type listedSandbox struct {
	SandboxID           string            `json:"sandboxID"`
	TemplateID          string            `json:"templateID"`
	Alias               string            `json:"alias,omitempty"`
	ClientID            string            `json:"clientID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int64             `json:"memoryMB"`
	DiskSizeMB          int64             `json:"diskSizeMB"`
	EnvdVersion         string            `json:"envdVersion"`
	Metadata            map[string]string `json:"metadata"`
	State               string            `json:"state"`
	VolumeMounts        []any             `json:"volumeMounts"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	Domain              *string           `json:"domain,omitempty"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
	Network             *sandboxNetwork   `json:"network,omitempty"`
	Lifecycle           *lifecycle        `json:"lifecycle,omitempty"`
}

type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

func (s *Server) listed(info service.Info) listedSandbox {
	tpl := s.template(info.ID)
	return listedSandbox{
		SandboxID: info.ID, TemplateID: tpl, Alias: tpl, ClientID: clientID,
		StartedAt: info.CreatedAt.UTC(), EndAt: info.ExpiresAt.UTC(),
		CPUCount: runtime.NumCPU(), MemoryMB: info.Limits.Memory >> 20, DiskSizeMB: info.Limits.Disk >> 20,
		EnvdVersion: envdVersion, Metadata: info.Metadata, State: e2bState(info), VolumeMounts: mountsOf(info),
	}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, owner string) {
	info, err := s.svc.Info(owner, r.PathValue("id"))
	if err != nil {
		s.notFound(w, r, err)
		return
	}
	d := s.listed(info)
	d.EnvdAccessToken = s.accessToken(owner, info.ID)
	d.Domain = s.domain()
	internet, network := networkOf(info.Network, info.Ports)
	d.AllowInternetAccess, d.Network = &internet, network
	d.Lifecycle = &lifecycle{OnTimeout: info.OnTimeout, AutoResume: info.AutoResume}
	writeJSON(w, http.StatusOK, d)
}

// notFound answers an error about a sandbox, saying which.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, service.ErrNotFound) {
		writeEnvdError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", r.PathValue("id")))
		return
	}
	s.fail(w, err)
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, owner string) {
	id := r.PathValue("id")
	if err := s.svc.Delete(owner, id); err != nil {
		s.notFound(w, r, err)
		return
	}
	s.mu.Lock()
	delete(s.templates, id)
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// timeoutBody is the body of /timeout (timeout), /refreshes (duration)
// and /connect (timeout), in seconds.
type timeoutBody struct {
	Timeout  *int64 `json:"timeout"`
	Duration *int64 `json:"duration"`
}

// extend sets a sandbox's timeout (E2B's is from now; Vivarium's is idle
// time, which every call restarts).
func (s *Server) extend(owner, id string, seconds *int64) error {
	if seconds == nil {
		_, err := s.svc.Info(owner, id)
		return err
	}
	if *seconds <= 0 {
		return fmt.Errorf("%w: timeout must be positive", sandbox.ErrInvalidSpec)
	}
	_, err := s.svc.SetTimeout(owner, id, sandbox.Seconds(float64(*seconds)))
	return err
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, owner string) {
	var req timeoutBody
	if !decodeBody(w, r, &req) {
		return
	}
	if req.Timeout == nil {
		writeEnvdError(w, http.StatusBadRequest, "timeout (seconds) is required")
		return
	}
	if err := s.extend(owner, r.PathValue("id"), req.Timeout); err != nil {
		s.notFound(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request, owner string) {
	var req timeoutBody
	if !decodeBody(w, r, &req) {
		return
	}
	if err := s.extend(owner, r.PathValue("id"), req.Duration); err != nil {
		s.notFound(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request, owner string) {
	var req timeoutBody
	if !decodeBody(w, r, &req) {
		return
	}
	// Connecting keeps the sandbox alive at least that long; a shorter
	// timeout than it has leaves it as it is (SetTimeout is the way to
	// shorten it).
	id := r.PathValue("id")
	// A paused sandbox is resumed: that is what connecting to one means.
	_, err := s.svc.Resume(r.Context(), owner, id)
	if err != nil && !errors.Is(err, service.ErrNotPaused) {
		s.notFound(w, r, err)
		return
	}
	switch {
	case req.Timeout == nil:
		_, err = s.svc.Info(owner, id)
	case *req.Timeout <= 0:
		err = fmt.Errorf("%w: timeout must be positive", sandbox.ErrInvalidSpec)
	default:
		_, err = s.svc.ExtendTimeout(owner, id, sandbox.Seconds(float64(*req.Timeout)))
	}
	if err != nil {
		s.notFound(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.created(owner, id))
}

// onTimeout is what the sandbox's timeout does, from E2B's autoPause
// (what the SDKs send for lifecycle onTimeout).
func (n *newSandbox) onTimeout() string {
	if n.AutoPause != nil && *n.AutoPause {
		return service.OnTimeoutPause
	}
	return service.OnTimeoutKill
}

// pause serves POST /sandboxes/{id}/pause: 204 once paused, 409 when it
// was already (the SDKs' pause() then answers false), 404 for no such
// sandbox, 501 where the backend cannot pause. With memory false
// (keepMemory: false) the files alone are kept (service.PauseFiles).
func (s *Server) pause(w http.ResponseWriter, r *http.Request, owner string) {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	pause := s.svc.Pause
	if req.Memory != nil && !*req.Memory {
		pause = s.svc.PauseFiles
	}
	_, err := pause(r.Context(), owner, r.PathValue("id"))
	switch {
	case errors.Is(err, service.ErrAlreadyPaused):
		writeEnvdError(w, http.StatusConflict, fmt.Sprintf("sandbox %q is already paused", r.PathValue("id")))
	case errors.Is(err, sandbox.ErrBusy):
		// Not 409, which the SDKs read as "already paused".
		writeEnvdError(w, http.StatusNotImplemented, "pausing a sandbox while code runs in it, or a terminal is "+
			"open, is not supported yet: "+err.Error())
	case errors.Is(err, sandbox.ErrCannotKeep):
		// Not 409 either: what the sandbox holds cannot be kept.
		writeEnvdError(w, http.StatusNotImplemented, err.Error())
	case err != nil:
		s.notFound(w, r, err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// resume serves the deprecated POST /sandboxes/{id}/resume: 201 with the
// sandbox, 409 when it is not paused.
func (s *Server) resume(w http.ResponseWriter, r *http.Request, owner string) {
	var req timeoutBody
	if !decodeBody(w, r, &req) {
		return
	}
	id := r.PathValue("id")
	_, err := s.svc.Resume(r.Context(), owner, id)
	if errors.Is(err, service.ErrNotPaused) {
		writeEnvdError(w, http.StatusConflict, fmt.Sprintf("sandbox %q is not paused", id))
		return
	}
	if err == nil && req.Timeout != nil {
		err = s.extend(owner, id, req.Timeout)
	}
	if err != nil {
		s.notFound(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.created(owner, id))
}

// fork serves POST /sandboxes/{id}/fork: count copies of the running
// sandbox (1 by default), each answered as E2B's SDKs read a fork's
// result, {sandbox} or {error: {code, message}}. Vivarium makes all of
// them or none: an error is the request's.
func (s *Server) fork(w http.ResponseWriter, r *http.Request, owner string) {
	var req struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	n := 1
	if req.Count != nil {
		n = *req.Count
	}
	if n < 1 {
		writeEnvdError(w, http.StatusBadRequest, fmt.Sprintf("count must be at least 1, got %d", n))
		return
	}
	id := r.PathValue("id")
	copies, err := s.svc.Fork(r.Context(), owner, id, n, sandbox.ForkOptions{})
	if err != nil {
		s.notFound(w, r, err)
		return
	}
	type forked struct {
		Sandbox *sandboxCreated `json:"sandbox,omitempty"`
		Error   *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error,omitempty"`
	}
	tpl := s.template(id)
	out := make([]forked, 0, len(copies))
	for _, c := range copies {
		if req.Timeout != nil {
			if err := s.extend(owner, c.ID, req.Timeout); err != nil {
				s.log.Warn("e2b: a fork's timeout", "id", c.ID, "err", err)
			}
		}
		s.writeRunFiles(owner, c.ID)
		s.rememberTemplate(owner, c.ID, tpl)
		created := s.created(owner, c.ID)
		out = append(out, forked{Sandbox: &created})
	}
	writeJSON(w, http.StatusCreated, out)
}

// hasSnapshot reports whether name is the name of one of owner's
// snapshots (an id needs no look-up: Create answers for it).
func (s *Server) hasSnapshot(owner, name string) bool {
	_, err := s.svc.SnapshotInfo(owner, name)
	return err == nil
}

// snapshotRef returns the snapshot a template id names ("": none): a
// snapshot's id, or its name (E2B's createSnapshot({name}); "name:latest"
// is the same, the newest of that name). The default templates are never
// snapshots.
func snapshotRef(template string) string {
	switch {
	case sandboxid.Snapshot.Valid(template):
		return template
	case slices.Contains(KnownTemplates, template):
		return ""
	}
	name := strings.TrimSuffix(template, ":latest")
	if !sandboxid.ValidName(name) {
		return ""
	}
	return name
}

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func toSnapshotInfo(x service.SnapshotInfo) snapshotInfo {
	names := []string{}
	if x.Name != "" {
		names = append(names, x.Name)
	}
	return snapshotInfo{SnapshotID: x.ID, Names: names}
}

// createSnapshot saves a sandbox as a snapshot (sandbox.createSnapshot),
// named as asked: its id, and its name, are template ids Sandbox.create
// takes; a name finds the newest snapshot of that name, as E2B's find a
// template's newest build.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, owner string) {
	var req struct {
		Name string `json:"name"`
	}
	if !decodeBody(w, r, &req) {
		return
	}
	info, err := s.svc.Snapshot(r.Context(), owner, r.PathValue("id"), req.Name)
	if err != nil {
		s.notFound(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toSnapshotInfo(info))
}

// listSnapshots lists the key's snapshots, newest first: of one sandbox
// with sandboxID, and with name (Sandbox.listSnapshots({ name })) those
// that template id names, as E2B's filter: a snapshot's id, or every
// snapshot of a name ("name:latest": its newest, the one Sandbox.create
// starts from). A name no snapshot can have (another tag, a default
// template) lists none.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, owner string) {
	from, name := r.URL.Query().Get("sandboxID"), r.URL.Query().Get("name")
	ref := snapshotRef(name)
	out := []snapshotInfo{}
	for _, x := range s.svc.Snapshots(owner) {
		if from != "" && x.SandboxID != from || name != "" && (ref == "" || ref != x.ID && ref != x.Name) {
			continue
		}
		out = append(out, toSnapshotInfo(x))
		if name != ref && x.Name == ref {
			break // name:latest
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot deletes a template of the key's (templates.go), else a
// snapshot by its template id, or all of a name (E2B's
// Sandbox.deleteSnapshot); other templates are E2B's cloud.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, owner string) {
	answered, builds := s.deleteTemplate(w, owner, r.PathValue("id"))
	if answered {
		return
	}
	id := snapshotRef(r.PathValue("id"))
	switch {
	case id == "" && builds:
		writeEnvdError(w, http.StatusNotFound, fmt.Sprintf("template %q not found", r.PathValue("id")))
		return
	case id == "":
		s.unsupported(w, "DELETE /templates (templates are E2B's cloud, not part of vivarium)")
		return
	}
	if err := s.svc.DeleteSnapshot(owner, id); err != nil {
		// Neither a template nor a snapshot of the key's; a server
		// that builds templates and keeps no snapshots says so too.
		if errors.Is(err, service.ErrSnapshotNotFound) || builds && errors.Is(err, sandbox.ErrUnsupported) {
			writeEnvdError(w, http.StatusNotFound, fmt.Sprintf("template %q not found", id))
			return
		}
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

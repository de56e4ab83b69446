// Package httpapi serves the service over JSON/HTTP under /v1, with
// NDJSON streaming of executions and commands.
package httpapi

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/jsonerr"
	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/route"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// Authenticator maps a bearer token to its owner.
type Authenticator interface {
	Owner(token string) (string, error)
}

// DevOwner is the single owner of a server without keys.
const DevOwner = "dev"

// Server is the HTTP API.
type Server struct {
	svc  *service.Service
	auth Authenticator // nil: dev mode, everyone is DevOwner
	log  *slog.Logger
	mux  *route.Mux
	// A sandbox's ports (ports.go).
	ports portRoutes
}

// maxBody bounds JSON request bodies (code, env, inline files).
const maxBody = 32 << 20

// New returns the API's handler.
func New(svc *service.Service, auth Authenticator, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{svc: svc, auth: auth, log: log, mux: route.NewMux(ClusterRoutes())}
	for _, r := range Routes {
		s.mux.Handle(r.Method+" "+r.Pattern, s.wrap(r, s.handler(r.Name)))
	}
	s.routePorts()
	s.mux.Complete()
	return s
}

// ClusterRoutes are the routes New serves (Routes and a sandbox's
// ports), as a cluster's gateway forwards them.
func ClusterRoutes() []route.Route {
	out := []route.Route{portRoute}
	for _, r := range Routes {
		out = append(out, route.Route{Method: r.Method, Path: r.Pattern, Forward: r.Forward})
	}
	return out
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// RefuseBrowsers answers 403 to requests a web browser makes on behalf of a
// page (they carry an Origin header), unless the origin is allowed. The API
// is for programs: without this, any page a developer visits could POST
// code to a server on localhost, which in --dev mode needs no key (a
// "simple" cross-origin POST is sent without a preflight).
func RefuseBrowsers(h http.Handler, allowed []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" && r.Header.Get("Sec-Fetch-Site") == "cross-site" {
			origin = "a cross-site page"
		}
		if origin != "" && !slices.Contains(allowed, origin) {
			writeError(w, apierr.Forbidden,
				fmt.Sprintf("requests from web pages are refused (origin %q); allow an origin with --allow-origin", origin))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Route is one endpoint; the OpenAPI document is generated from Routes.
type Route struct {
	Method, Pattern, Name, Summary string
	Public                         bool // no API key needed
	// Forward is how a cluster's gateway forwards it (package route).
	Forward route.Forward
}

// Routes lists every endpoint the server serves, but for a sandbox's
// ports (portRoute): New serves these and no others.
var Routes = []Route{
	{"GET", "/healthz", "health", "Liveness check", true, route.Local},
	{"GET", "/metrics", "metrics", "Prometheus metrics", false, route.Local},
	{"GET", "/openapi.json", "openapi", "This API's OpenAPI 3.1 document", true, route.Pick},
	{"POST", "/v1/sandboxes", "create", "Create a stateful sandbox", false, route.Create},
	{"GET", "/v1/sandboxes", "list", "List the caller's sandboxes", false, route.Every("sandboxes")},
	{"GET", "/v1/sandboxes/{id}", "get", "Describe a sandbox", false, route.Sandbox},
	{"DELETE", "/v1/sandboxes/{id}", "delete", "Close a sandbox", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/timeout", "timeout", "Set a sandbox's idle timeout from now", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/pause", "pause", "Pause a sandbox: its processes' state saved to disk, their memory freed (native backend, with CRIU)", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/resume", "resume", "Resume a paused sandbox where it was paused", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/fork", "fork", "Copy a running sandbox into new sandboxes of their own, at this moment (native backend, with CRIU)", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/snapshots", "createSnapshot", "Save a running sandbox as a snapshot, which new sandboxes are made from (native backend, with CRIU); the sandbox goes on", false, route.Sandbox},
	{"GET", "/v1/snapshots", "listSnapshots", "List the key's snapshots", false, route.Every("snapshots")},
	{"GET", "/v1/snapshots/{id}", "getSnapshot", "Describe a snapshot (by id, or the newest of a name)", false, route.Snapshot},
	{"DELETE", "/v1/snapshots/{id}", "deleteSnapshot", "Delete a snapshot (by id), or every snapshot of a name", false, route.Snapshot},
	{"GET", "/v1/snapshots/{id}/export", "exportSnapshot", "Download a snapshot as a tar stream, for a server that shares this one's snapshot key", false, route.Snapshot},
	{"POST", "/v1/snapshots/import", "importSnapshot", "Upload a snapshot another server (sharing this one's snapshot key) exported; a changed or foreign one is refused", false, route.Pick},
	{"GET", "/v1/sandboxes/{id}/metrics", "usage", "A sandbox's CPU, memory and disk over time (sampled every 5 s)", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/execute", "execute", "Run Python code, keeping state", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/interrupt", "interrupt", "Raise KeyboardInterrupt in the running execution", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/restart", "restart", "Restart the Python process; files are kept", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/commands", "command", "Run a shell command in the sandbox", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/packages", "installPackage", "Install one of the server's allowed packages into the sandbox", false, route.Sandbox},
	{"PUT", "/v1/sandboxes/{id}/network", "setNetwork", "Replace what a running sandbox may reach, within the server's allowlist", false, route.Sandbox},
	{"GET", "/v1/sandboxes/{id}/files", "listFiles", "List a directory of the workspace", false, route.Sandbox},
	{"PUT", "/v1/sandboxes/{id}/files/{path...}", "putFile", "Upload a file (raw body)", false, route.Sandbox},
	{"GET", "/v1/sandboxes/{id}/files/{path...}", "getFile", "Download a file", false, route.Sandbox},
	{"DELETE", "/v1/sandboxes/{id}/files/{path...}", "deleteFile", "Delete a file or directory", false, route.Sandbox},
	{"GET", "/v1/sandboxes/{id}/contexts", "listContexts", "List the code contexts", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/contexts", "createContext", "Create a code context (python, bash, javascript, typescript, r or java) with state of its own", false, route.Sandbox},
	{"DELETE", "/v1/sandboxes/{id}/contexts/{ctx}", "deleteContext", "Remove a code context", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/contexts/{ctx}/restart", "restartContext", "Forget a code context's state", false, route.Sandbox},
	{"GET", "/v1/sandboxes/{id}/processes", "listProcesses", "List the sandbox's running tracked processes", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/processes", "startProcess", "Start a shell command in the background", false, route.Sandbox},
	{"GET", "/v1/sandboxes/{id}/processes/{pid}/output", "processOutput", "Follow a process's output from now until it ends (NDJSON)", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/processes/{pid}/stdin", "processStdin", "Write the raw body to a process's stdin; ?close=1 closes it after", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/processes/{pid}/signal", "signalProcess", "Send SIGTERM or SIGKILL to a process's group", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/processes/{pid}/resize", "resizeProcess", "Resize the terminal of a process started with one", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/ports/{port}", "portToken", "A token and URLs that open one port of the sandbox (a server its code started) from outside; with rotate, a new token", false, route.Sandbox},
	{"POST", "/v1/sandboxes/{id}/access-token", "rotateAccessToken", "Give the sandbox a new E2B access token: the old one, and signed file URLs made with it, stop working", false, route.Sandbox},
	{"POST", "/v1/key/revoke", "revokeKey", "Revoke the caller's own API key (and every token made from it), and close its sandboxes if asked", false, route.Pick},
	{"POST", "/v1/execute", "runOnce", "Run code in a fresh sandbox destroyed afterwards", false, route.Pick},
	{"POST", "/v1/volumes", "createVolume", "Create a persistent volume (an ext4 file system of its own size)", false, route.NewVolume},
	{"GET", "/v1/volumes", "listVolumes", "List the key's volumes", false, route.Every("volumes")},
	{"GET", "/v1/volumes/{id}", "getVolume", "A volume, by ID or name", false, route.Volume},
	{"DELETE", "/v1/volumes/{id}", "deleteVolume", "Delete a volume and its files; refused while a live sandbox mounts it", false, route.Volume},
	{"GET", "/v1/volumes/{id}/files", "listVolumeFiles", "List a directory of a volume, without a sandbox", false, route.Volume},
	{"PUT", "/v1/volumes/{id}/files/{path...}", "putVolumeFile", "Upload a file into a volume (raw body)", false, route.Volume},
	{"GET", "/v1/volumes/{id}/files/{path...}", "getVolumeFile", "Download a file of a volume", false, route.Volume},
	{"DELETE", "/v1/volumes/{id}/files/{path...}", "deleteVolumeFile", "Delete a file or directory of a volume", false, route.Volume},
}

type ctxKey struct{}

func owner(r *http.Request) string { return r.Context().Value(ctxKey{}).(string) }

func (s *Server) wrap(route Route, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		if !route.Public {
			who := DevOwner
			if s.auth != nil {
				tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
				o, err := s.auth.Owner(strings.TrimSpace(tok))
				if !ok || err != nil {
					writeError(w, apierr.Unauthorized, "a valid API key is required: Authorization: Bearer <key>")
					return
				}
				who = o
			}
			r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, who))
		}
		h(w, r)
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "ms", time.Since(start).Milliseconds())
	})
}

func (s *Server) handler(name string) http.HandlerFunc {
	switch name {
	case "health":
		return func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, okResponse{OK: true}) }
	case "metrics":
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			s.svc.WriteMetrics(w)
		}
	case "openapi":
		return func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, OpenAPI()) }
	case "create":
		return s.create
	case "list":
		return func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 200, sandboxList{Sandboxes: s.svc.List(owner(r))})
		}
	case "get":
		return func(w http.ResponseWriter, r *http.Request) {
			info, err := s.svc.Info(owner(r), r.PathValue("id"))
			s.respond(w, info, err)
		}
	case "delete":
		return func(w http.ResponseWriter, r *http.Request) {
			if err := s.svc.Delete(owner(r), r.PathValue("id")); err != nil {
				s.fail(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}
	case "timeout":
		return s.setTimeout
	case "pause":
		return func(w http.ResponseWriter, r *http.Request) {
			info, err := s.svc.Pause(r.Context(), owner(r), r.PathValue("id"))
			s.respond(w, info, err)
		}
	case "fork":
		return s.fork
	case "resume":
		return func(w http.ResponseWriter, r *http.Request) {
			info, err := s.svc.Resume(r.Context(), owner(r), r.PathValue("id"))
			s.respond(w, info, err)
		}
	case "execute":
		return s.execute
	case "interrupt":
		return func(w http.ResponseWriter, r *http.Request) {
			s.respond(w, okResponse{OK: true}, s.svc.Interrupt(owner(r), r.PathValue("id")))
		}
	case "restart":
		return func(w http.ResponseWriter, r *http.Request) {
			s.respond(w, restartResponse{OK: true, StateLost: true}, s.svc.Restart(r.Context(), owner(r), r.PathValue("id")))
		}
	case "command":
		return s.command
	case "installPackage":
		return s.installPackage
	case "setNetwork":
		return s.setNetwork
	case "listFiles":
		return s.listFiles
	case "putFile":
		return s.putFile
	case "getFile":
		return s.getFile
	case "deleteFile":
		return s.deleteFile
	case "runOnce":
		return s.runOnce
	case "portToken":
		return s.portToken
	case "rotateAccessToken":
		return s.rotateAccessToken
	case "revokeKey":
		return s.revokeKey
	case "usage":
		return s.usage
	case "createSnapshot", "listSnapshots", "getSnapshot", "deleteSnapshot", "exportSnapshot", "importSnapshot":
		return s.snapshotHandler(name)
	case "listContexts", "createContext", "deleteContext", "restartContext":
		return s.contextHandler(name)
	case "listProcesses", "startProcess", "processOutput", "processStdin", "signalProcess", "resizeProcess":
		return s.processHandler(name)
	case "createVolume", "listVolumes", "getVolume", "deleteVolume", "listVolumeFiles", "putVolumeFile",
		"getVolumeFile", "deleteVolumeFile":
		return s.volumeHandler(name)
	}
	panic("httpapi: no handler for " + name)
}

// LimitsRequest is how clients ask for limits.
type LimitsRequest struct {
	Memory   int64   `json:"memory,omitempty" doc:"bytes of memory, swap off"`
	CPUTimeS float64 `json:"cpu_time_s,omitempty" doc:"CPU seconds per execution, all processes together"`
	TimeoutS float64 `json:"timeout_s,omitempty" doc:"wall-clock seconds per execution"`
	Pids     int     `json:"pids,omitempty" doc:"processes and threads at once"`
	Disk     int64   `json:"disk,omitempty" doc:"bytes of /workspace, /tmp and /dev/shm together"`
	Output   int64   `json:"max_output,omitempty" doc:"bytes kept per stream; the rest is dropped and flagged"`
	CPUs     float64 `json:"cpus,omitempty" doc:"CPU cap in cores"`
	// Disk I/O rates, at most the server's (which are also the defaults).
	IOReadBPS   int64 `json:"io_read_bps,omitempty" doc:"disk reads, bytes a second"`
	IOWriteBPS  int64 `json:"io_write_bps,omitempty" doc:"disk writes, bytes a second"`
	IOReadIOPS  int64 `json:"io_read_iops,omitempty" doc:"disk reads a second"`
	IOWriteIOPS int64 `json:"io_write_iops,omitempty" doc:"disk writes a second"`
}

func (l LimitsRequest) limits() sandbox.Limits {
	return sandbox.Limits{Memory: l.Memory, CPUTime: sandbox.Seconds(l.CPUTimeS), Timeout: sandbox.Seconds(l.TimeoutS),
		Pids: l.Pids, Disk: l.Disk, MaxOutput: l.Output, CPUs: l.CPUs,
		IOReadBPS: l.IOReadBPS, IOWriteBPS: l.IOWriteBPS, IOReadIOPS: l.IOReadIOPS, IOWriteIOPS: l.IOWriteIOPS}
}

type timeoutRequest struct {
	TimeoutS float64 `json:"timeout_s" doc:"new idle timeout from now, seconds"`
}

// Responses that are not a service type.
type (
	okResponse struct {
		OK bool `json:"ok"`
	}
	restartResponse struct {
		OK        bool `json:"ok"`
		StateLost bool `json:"state_lost"`
	}
	sandboxList struct {
		Sandboxes []service.Info `json:"sandboxes"`
	}
	fileEntry struct {
		Path     string    `json:"path" doc:"relative to the workspace"`
		Name     string    `json:"name"`
		Size     int64     `json:"size"`
		Type     string    `json:"type" doc:"file, dir, symlink or other"`
		Modified time.Time `json:"modified"`
	}
	fileList struct {
		Path    string      `json:"path"`
		Entries []fileEntry `json:"entries"`
	}
	fileWritten struct {
		Path     string            `json:"path"`
		Size     int64             `json:"size"`
		Metadata map[string]string `json:"metadata,omitempty" doc:"the file's metadata, from the request's X-Metadata-KEY headers"`
	}
)

type createRequest struct {
	TimeoutS     float64                 `json:"timeout_s" doc:"idle timeout in seconds"`
	MaxLifetimeS float64                 `json:"max_lifetime_s" doc:"maximum lifetime in seconds"`
	Limits       LimitsRequest           `json:"limits"`
	Env          map[string]string       `json:"env" doc:"environment variables of every execution"`
	Metadata     map[string]string       `json:"metadata" doc:"free-form labels"`
	Backend      string                  `json:"backend" doc:"isolation backend, one the server offers (native, gvisor, docker, wasm); default: the server's"`
	Network      netpolicy.Request       `json:"network" doc:"network access through the sandbox's proxy, within the server's allowlist; default: none"`
	Home         string                  `json:"home" doc:"the sandbox user's home, where code starts: /workspace (default; the user is \"sandbox\") or /home/user (E2B's layout; the user is \"user\"), the same directory"`
	Volumes      []service.VolumeRequest `json:"volumes" doc:"the key's volumes to mount (native backend only)"`
	Template     string                  `json:"template" doc:"the template (an image of the server's store: vivarium image ls) whose file system and Python the sandbox has; default: the server's own"`
	Pausable     bool                    `json:"pausable" doc:"kept for compatibility: every stateful native or gvisor sandbox can be paused"`
	OnTimeout    string                  `json:"on_timeout" doc:"what the idle timeout does: kill (default) or pause (where the backend can pause; else kill)"`
	AutoResume   bool                    `json:"auto_resume" doc:"a call on the paused sandbox (by its timeout or /pause) resumes it first, instead of answering 409 paused"`
	FromSnapshot string                  `json:"from_snapshot" doc:"make the sandbox from one of the key's snapshots (its id, or its name: the newest of that name): its memory, files, limits, environment and backend (limits, env, backend, home, network and volumes are then not given)"`
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if !decode(w, r, &req) {
		return
	}
	info, err := s.svc.Create(r.Context(), service.CreateRequest{
		Owner: owner(r), Idle: sandbox.Seconds(req.TimeoutS), MaxLifetime: sandbox.Seconds(req.MaxLifetimeS),
		Limits: req.Limits.limits(), Env: req.Env, Metadata: req.Metadata, Backend: req.Backend,
		Network: req.Network, Home: req.Home, Volumes: req.Volumes, OnTimeout: req.OnTimeout, AutoResume: req.AutoResume, Pausable: req.Pausable,
		FromSnapshot: req.FromSnapshot, Template: req.Template,
	})
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req timeoutRequest
	if !decode(w, r, &req) {
		return
	}
	if sandbox.Seconds(req.TimeoutS) <= 0 {
		writeError(w, apierr.InvalidRequest, "timeout_s must be positive")
		return
	}
	info, err := s.svc.SetTimeout(owner(r), r.PathValue("id"), sandbox.Seconds(req.TimeoutS))
	s.respond(w, info, err)
}

type executeRequest struct {
	Code     string            `json:"code" doc:"Python code; the value of a final expression is the main result"`
	TimeoutS float64           `json:"timeout_s" doc:"wall-clock limit of this execution, seconds"`
	CPUTimeS float64           `json:"cpu_time_s" doc:"CPU time limit of this execution, seconds"`
	Env      map[string]string `json:"env" doc:"environment of this execution only"`
	Stream   bool              `json:"stream" doc:"stream NDJSON events (or send Accept: application/x-ndjson)"`
	Context  string            `json:"context" doc:"code context to run in (default: the default python context)"`
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	if !decode(w, r, &req) {
		return
	}
	exec := sandbox.ExecRequest{Code: req.Code, Env: req.Env, Timeout: sandbox.Seconds(req.TimeoutS), CPUTime: sandbox.Seconds(req.CPUTimeS),
		Context: req.Context}
	if wantsStream(r, req.Stream) {
		st := s.newStream(w)
		res, err := s.svc.Execute(r.Context(), owner(r), r.PathValue("id"), exec, st)
		st.end(res, err)
		return
	}
	res, err := s.svc.Execute(r.Context(), owner(r), r.PathValue("id"), exec, nil)
	s.respond(w, res, err)
}

type commandRequest struct {
	Cmd      string            `json:"cmd" doc:"shell command, run with /bin/sh -c"`
	Cwd      string            `json:"cwd" doc:"working directory inside the sandbox, absolute or relative to /workspace (default /workspace); one that is not there is a 400"`
	Env      map[string]string `json:"env"`
	TimeoutS float64           `json:"timeout_s" doc:"wall-clock limit, seconds"`
	Stream   bool              `json:"stream" doc:"stream NDJSON events"`
	User     string            `json:"user" doc:"who runs it: user (default) or root, uid 0 of the sandbox's own user namespace, with no capability (native backend)"`
}

func (s *Server) command(w http.ResponseWriter, r *http.Request) {
	var req commandRequest
	if !decode(w, r, &req) {
		return
	}
	c := service.CommandRequest{Cmd: req.Cmd, Cwd: req.Cwd, Env: req.Env, Timeout: sandbox.Seconds(req.TimeoutS), User: req.User}
	if wantsStream(r, req.Stream) {
		st := s.newStream(w)
		res, err := s.svc.Command(r.Context(), owner(r), r.PathValue("id"), c, st)
		st.end(res, err)
		return
	}
	res, err := s.svc.Command(r.Context(), owner(r), r.PathValue("id"), c, nil)
	s.respond(w, res, err)
}

type runOnceRequest struct {
	Code     string            `json:"code" doc:"Python code"`
	Files    map[string]string `json:"files" doc:"files placed in the workspace first: name to base64 content"`
	Limits   LimitsRequest     `json:"limits"`
	TimeoutS float64           `json:"timeout_s" doc:"wall-clock limit, seconds"`
	Env      map[string]string `json:"env"`
	Stream   bool              `json:"stream" doc:"stream NDJSON events"`
	Backend  string            `json:"backend" doc:"isolation backend, one the server offers; default: the server's"`
	Network  netpolicy.Request `json:"network" doc:"network access through the sandbox's proxy, within the server's allowlist; default: none"`
	Template string            `json:"template" doc:"the template (an image of the server's store) to run the code in; default: the server's own Python"`
}

func (s *Server) runOnce(w http.ResponseWriter, r *http.Request) {
	var req runOnceRequest
	if !decode(w, r, &req) {
		return
	}
	job := sandbox.OneShot{
		Spec:    sandbox.Spec{Limits: req.Limits.limits(), Env: req.Env, Backend: req.Backend, Template: req.Template},
		Request: sandbox.ExecRequest{Code: req.Code},
	}
	if req.TimeoutS != 0 {
		job.Spec.Limits.Timeout = sandbox.Seconds(req.TimeoutS) // a negative one is refused
	}
	for name, b64 := range req.Files {
		data, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			writeError(w, apierr.InvalidRequest, fmt.Sprintf("files[%q]: not base64: %v", name, err))
			return
		}
		job.Files = append(job.Files, sandbox.InputFile{Name: name, Open: func() (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(string(data))), nil
		}})
	}
	if wantsStream(r, req.Stream) {
		st := s.newStream(w)
		job.Sink = st
		res, err := s.svc.RunOnceWithNetwork(r.Context(), owner(r), job, req.Network)
		st.end(res, err)
		return
	}
	res, err := s.svc.RunOnceWithNetwork(r.Context(), owner(r), job, req.Network)
	s.respond(w, res, err)
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	ws, done, err := s.svc.Workspace(owner(r), r.PathValue("id"))
	if err != nil {
		s.fail(w, err)
		return
	}
	defer done()
	dir := r.URL.Query().Get("path")
	if dir == "" {
		dir = "."
	}
	depth := 1
	if d := r.URL.Query().Get("depth"); d != "" {
		if depth, err = strconv.Atoi(d); err != nil || depth < 1 || depth > 64 {
			writeError(w, apierr.InvalidRequest, "depth must be an integer from 1 to 64")
			return
		}
	}
	entries, err := ws.ReadDir(dir, depth)
	if err != nil {
		s.fail(w, err)
		return
	}
	out := fileList{Path: dir, Entries: make([]fileEntry, 0, len(entries))}
	for _, e := range entries {
		out.Entries = append(out.Entries, fileEntry{Path: e.Path, Name: e.Path[strings.LastIndex(e.Path, "/")+1:], Size: e.Size,
			Type: e.Type, Modified: e.ModTime.UTC()})
	}
	writeJSON(w, 200, out)
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request) {
	b, err := s.svc.Get(owner(r), r.PathValue("id"))
	if err != nil {
		s.fail(w, err)
		return
	}
	ws, done, err := s.svc.Workspace(owner(r), r.PathValue("id"))
	if err != nil {
		s.fail(w, err)
		return
	}
	defer done()
	name := r.PathValue("path")
	md, err := s.fileMetadata(ws, r.Header)
	if err != nil {
		s.fail(w, err)
		return
	}
	if err := ws.WriteFile(name, r.Body, b.Limits().Disk); err != nil {
		s.fail(w, err)
		return
	}
	if len(md) > 0 {
		if err := ws.(sandbox.WorkspaceMetadata).SetFileMetadata(name, md); err != nil {
			s.fail(w, err)
			return
		}
	}
	fi, err := ws.Stat(name)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, fileWritten{Path: fi.Path, Size: fi.Size, Metadata: md})
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	ws, done, err := s.svc.Workspace(owner(r), r.PathValue("id"))
	if err != nil {
		s.fail(w, err)
		return
	}
	defer done()
	f, fi, err := ws.OpenFile(r.PathValue("path"))
	if err != nil {
		s.fail(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	setMetadataHeaders(w.Header(), ws, r.PathValue("path"))
	// The file may grow while it is sent: never more than its size then.
	io.Copy(w, io.LimitReader(f, fi.Size))
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) {
	ws, done, err := s.svc.Workspace(owner(r), r.PathValue("id"))
	if err != nil {
		s.fail(w, err)
		return
	}
	defer done()
	if err := ws.Remove(r.PathValue("path")); err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func wantsStream(r *http.Request, flag bool) bool {
	return flag || strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
}

// stream writes NDJSON events as output arrives. The response starts with
// the first event, so that an error before any output (an unknown sandbox,
// a busy one, a quota) is still answered with its own status code.
type stream struct {
	srv     *Server
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

func (s *Server) newStream(w http.ResponseWriter) *stream {
	return &stream{srv: s, w: w, rc: http.NewResponseController(w)}
}

func (s *stream) event(v any) {
	b, _ := json.Marshal(v)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/x-ndjson")
		s.w.Header().Set("X-Content-Type-Options", "nosniff")
		s.w.WriteHeader(http.StatusOK)
	}
	s.w.Write(append(b, '\n'))
	s.rc.Flush()
}

func (s *stream) Stdout(p []byte) {
	s.event(map[string]any{"type": "stdout", "text": string(p)})
}
func (s *stream) Stderr(p []byte) {
	s.event(map[string]any{"type": "stderr", "text": string(p)})
}
func (s *stream) Result(o sandbox.Output) {
	s.event(map[string]any{"type": "result", "result": o})
}

// end writes the error, if any, and the summary.
func (s *stream) end(res any, err error) {
	if err != nil {
		s.mu.Lock()
		started := s.started
		s.mu.Unlock()
		if !started {
			s.srv.fail(s.w, err)
			return
		}
		k, msg := apierr.Answer(s.srv.log, err)
		s.event(map[string]any{"type": "end", "error": map[string]any{"code": k.Code, "status": k.Status, "message": msg}})
		return
	}
	var e *sandbox.Error
	switch v := res.(type) {
	case *service.ExecResult:
		e = v.Error
	case *sandbox.Result:
		e = v.Error
	}
	if e != nil {
		s.event(map[string]any{"type": "error", "error": e})
	}
	s.event(map[string]any{"type": "end", "summary": res})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body := http.MaxBytesReader(w, r.Body, maxBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return true // an empty body means defaults
		}
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, apierr.TooLarge, fmt.Sprintf("request body over %d bytes", maxBody))
			return false
		}
		writeError(w, apierr.InvalidRequest, "invalid JSON body: "+jsonerr.Message(err))
		return false
	}
	if dec.More() {
		writeError(w, apierr.InvalidRequest, "invalid JSON body: more than one JSON value")
		return false
	}
	return true
}

func (s *Server) respond(w http.ResponseWriter, v any, err error) {
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// writeError answers an error of kind k with msg, a message for the
// client.
func writeError(w http.ResponseWriter, k *apierr.Kind, msg string) {
	var e errorBody
	e.Error.Code, e.Error.Message = k.Code, msg
	writeJSON(w, k.Status, e)
}

// fail answers with the error's status and a message for the caller. An
// unexpected error is logged in full and answered without its details,
// which may name internal paths.
func (s *Server) fail(w http.ResponseWriter, err error) {
	k, msg := apierr.Answer(s.log, err)
	writeError(w, k, msg)
}

// forkRequest is the body of POST /v1/sandboxes/{id}/fork.
type forkRequest struct {
	Count           int  `json:"count" doc:"how many copies, 1 to 64; default 1"`
	SameRandomState bool `json:"same_random_state" doc:"the copies keep the source's random generators (Python's random, numpy's); by default each reseeds from the OS"`
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req forkRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Count == 0 {
		req.Count = 1
	}
	copies, err := s.svc.Fork(r.Context(), owner(r), r.PathValue("id"), req.Count,
		sandbox.ForkOptions{SameRandomState: req.SameRandomState})
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, sandboxList{Sandboxes: copies})
}

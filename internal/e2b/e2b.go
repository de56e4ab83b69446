// Package e2b serves E2B's API over the service layer, so that programs
// written against E2B's SDKs (e2b and @e2b/code-interpreter) run unchanged
// against a Vivarium server once E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY point at it.
//
// E2B has three APIs, all served here under one prefix (/e2b):
//
//   - the control plane (E2B_API_URL = PREFIX): sandboxes are created,
//     listed, described, extended and killed, authenticated by the API key
//     in X-API-Key;
//   - envd, the sandbox's agent (E2B_SANDBOX_URL = PREFIX/sandbox, header
//     E2b-Sandbox-Port 49983): files over HTTP, and the Filesystem and
//     Process services over Connect RPC with JSON messages;
//   - the code interpreter (same URL, port 49999): code runs with results
//     streamed as JSON lines, in code contexts.
//
// The SDKs name the sandbox in every data-plane request with the
// E2b-Sandbox-Id header and authenticate it with the access token the
// control plane handed out (X-Access-Token, or E2B-Traffic-Access-Token
// for some code-interpreter calls). The token is the service's (its
// tokens.go): it opens that one sandbox while the sandbox and its key
// live, until it is rotated, and nothing once the server restarts.
//
// Paths: E2B's user is "user" with its home at /home/user, the sandbox's
// workspace (also at /workspace); relative paths are relative to it. The
// file API reaches any path of the sandbox's own disk (sandbox.FileSystem:
// /tmp, /etc, /root ...) as "user" or as "root", uid 0 of the sandbox's
// user namespace, which has no capability; it follows no link and crosses
// no mount. Backends without that reach the home alone.
//
// Volumes (volumes.go) are the service's: an owner's, persistent, mounted
// by name.
//
// Templates (templates.go) are built by the service, the key's own, as
// E2B's Template SDK asks; Sandbox.create(NAME) makes a sandbox of one,
// or of an image of the server's store.
//
// What E2B offers and Vivarium does not (E2B's MCP
// gateway, workload identity, E2B's teams and secrets: docs/e2b.md lists
// them) is answered with an error that says so, which the SDKs raise.
package e2b

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync"

	"github.com/vivarium-sandbox/vivarium/internal/fairgate"
	"github.com/vivarium-sandbox/vivarium/internal/route"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// Authenticator maps an API key to its owner.
type Authenticator interface {
	Owner(token string) (string, error)
}

// Config configures the adapter.
type Config struct {
	Service *service.Service
	// Auth checks API keys; nil serves everyone as DevOwner (vivarium
	// serve --dev).
	Auth     Authenticator
	DevOwner string
	Logger   *slog.Logger
	// Prefix is where the API is mounted ("/e2b").
	Prefix string
	// Domain is the preview domain of sandboxes' ports (ports.go), as
	// the control plane reports it; "": none.
	Domain string
	// Pausable makes every sandbox pausable (service.CreateRequest's
	// Pausable), as E2B's are: Sandbox.pause, createSnapshot and fork
	// work on any of them, not only on those made with lifecycle
	// onTimeout "pause". On the native backend such a sandbox is a Python
	// of its own rather than a fork of the zygote: about 70 MiB of memory
	// rather than 7, and about 0.5 s to make where no pool has one ready.
	Pausable bool
	// ForwardedFor: every request comes through a proxy of the
	// server's own (a cluster's gateway), which names the client in
	// X-Forwarded-For; signed URLs' scans are shared out by that
	// client's address rather than the proxy's.
	ForwardedFor bool
}

// Ports of the sandbox services, as the SDKs name them in E2b-Sandbox-Port.
const (
	envdPort        = "49983"
	interpreterPort = "49999"
)

// envdVersion is the envd version the control plane reports: the SDKs use
// the features of this version (file uploads as octet streams, closing
// stdin, watching with entries) and refuse to use newer ones.
const envdVersion = "0.6.4"

// Server is the E2B-compatible API.
type Server struct {
	cfg     Config
	svc     *service.Service
	log     *slog.Logger
	secret  []byte     // signs files upload URLs (templates.go)
	control *route.Mux // Routes
	envd    *http.ServeMux
	interp  *http.ServeMux

	mu        sync.Mutex
	templates map[string]templateOf // by sandbox ID
	// sweepingTemplates: a sweep of templates is under way
	// (rememberTemplate), from templateSweepAt (tests lower it) on.
	sweepingTemplates bool
	templateSweepAt   int
	// Requests that wait or poll on a sandbox's behalf without holding
	// one of its owner's execution slots (watches, executions waiting
	// their turn), by sandbox ID, so that a client cannot pile them up.
	waiting  map[string]int
	watchers map[string]*watcher // by ID
	// signGate shares out the scans of signed URLs (signed.go);
	// signScanning, when set, is called by each scan (tests hold one).
	signGate     *fairgate.Gate
	signScanning func(addr string)
}

// Bounds on what one sandbox's requests may hold on the server.
const (
	maxWatchesPerSandbox = 4
	maxQueuedPerSandbox  = 16
)

// hold counts one more waiting request of kind for sandbox id, within max;
// release gives it back.
func (s *Server) hold(kind, id string, max int) (release func(), ok bool) {
	key := kind + "\x00" + id
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting[key] >= max {
		return nil, false
	}
	s.waiting[key]++
	return sync.OnceFunc(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.waiting[key]--; s.waiting[key] <= 0 {
			delete(s.waiting, key)
		}
	}), true
}

// templateOf is the template a sandbox was created from.
type templateOf struct{ owner, name string }

// New returns the adapter's handler for requests under cfg.Prefix.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Prefix = strings.TrimSuffix(cfg.Prefix, "/")
	s := &Server{cfg: cfg, svc: cfg.Service, log: cfg.Logger,
		control: route.NewMux(Routes), envd: http.NewServeMux(), interp: http.NewServeMux(),
		templates: map[string]templateOf{}, templateSweepAt: templateSweepAt, waiting: map[string]int{}, watchers: map[string]*watcher{},
		signGate: fairgate.New(max(2, runtime.GOMAXPROCS(0)), maxSignQueued, signScanWait), secret: make([]byte, 32)}
	rand.Read(s.secret)
	s.routeControl()
	s.control.Complete()
	s.routeEnvd()
	s.routeInterpreter()
	return s
}

// sandboxPath is where the data plane is served below the prefix.
const sandboxPath = "/sandbox"

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, ok := strings.CutPrefix(r.URL.Path, s.cfg.Prefix)
	if !ok || (p != "" && !strings.HasPrefix(p, "/")) {
		http.NotFound(w, r)
		return
	}
	r2 := new(http.Request)
	*r2 = *r
	u := *r.URL
	r2.URL = &u
	if rest, ok := strings.CutPrefix(p, sandboxPath); ok && (rest == "" || strings.HasPrefix(rest, "/")) {
		r2.URL.Path, r2.URL.RawPath = rest, ""
		s.serveSandbox(w, r2)
		return
	}
	r2.URL.Path, r2.URL.RawPath = p, ""
	s.control.ServeHTTP(w, r2)
}

func randomID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// accessToken is the token that opens sandbox id of owner on the data
// plane (the service's: tokens.go); "" for a sandbox that is gone.
func (s *Server) accessToken(owner, id string) string {
	tok, _ := s.svc.AccessToken(owner, id)
	return tok
}

// owner authenticates a control-plane request by its API key.
func (s *Server) owner(r *http.Request) (string, bool) {
	if s.cfg.Auth == nil {
		return s.cfg.DevOwner, true
	}
	key := strings.TrimSpace(r.Header.Get("X-API-Key"))
	if key == "" {
		key, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		key = strings.TrimSpace(key)
	}
	if key == "" {
		return "", false
	}
	o, err := s.cfg.Auth.Owner(key)
	return o, err == nil
}

// target is the sandbox a data-plane request is for, authenticated.
type target struct {
	owner, id string
}

// serveSandbox routes a data-plane request by the port it names.
func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("E2b-Sandbox-Id")
	tok := r.Header.Get("X-Access-Token")
	if tok == "" {
		tok = r.Header.Get("E2B-Traffic-Access-Token")
	}
	if tok == "" && id != "" && r.URL.Path == "/files" && r.Header.Get("E2b-Sandbox-Port") == envdPort &&
		r.URL.Query().Has("signature") {
		// A signed file URL at the sandbox's own host (E2B_DOMAIN's
		// 49983-<id>.DOMAIN/files): checked against that sandbox alone.
		s.serveSigned(w, r, id)
		return
	}
	owner, ok, gone := s.svc.AccessTokenOwner(tok, id)
	if !ok && !gone {
		writeEnvdError(w, http.StatusUnauthorized,
			"a valid sandbox access token is required (X-Access-Token, as returned when the sandbox was created or connected to)")
		return
	}
	var b *service.Box
	var err error = service.ErrNotFound
	if ok {
		b, err = s.svc.Get(owner, id)
	}
	if err != nil {
		// What E2B's proxy answers for a sandbox that is gone: the SDKs
		// report that it was killed or timed out.
		writeEnvdError(w, http.StatusBadGateway, "sandbox "+id+" is not running: it was killed or reached its timeout")
		return
	}
	// Paused, and not to be resumed by traffic (Get resumed it
	// otherwise): E2B's proxy answers 502, which the SDKs read as not
	// running (isRunning), until connect or resume.
	if b.Paused() {
		writeEnvdError(w, http.StatusBadGateway, "sandbox "+id+" is paused: connect to it (or resume it) first")
		return
	}
	t := target{owner: owner, id: id}
	r = r.WithContext(withTarget(r.Context(), t))
	switch port := r.Header.Get("E2b-Sandbox-Port"); port {
	case envdPort:
		s.envd.ServeHTTP(w, r)
	case interpreterPort:
		s.interp.ServeHTTP(w, r)
	case "":
		writeEnvdError(w, http.StatusBadRequest, "the E2b-Sandbox-Port header is missing")
	default:
		writeEnvdError(w, http.StatusBadGateway, "port "+port+" is not reachable: vivarium sandboxes have no network; "+
			"only the sandbox API ("+envdPort+") and the code interpreter ("+interpreterPort+") are served")
	}
}

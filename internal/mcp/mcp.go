// Package mcp serves Vivarium's sandboxes to AI agents over the Model
// Context Protocol, as a thin adapter over the service layer built on the
// official Go SDK (github.com/modelcontextprotocol/go-sdk).
//
// Two transports: stdio, for one local agent that starts `vivarium mcp`
// itself, and streamable HTTP, mounted by `vivarium serve` at /mcp behind
// the same API keys as the HTTP API. Either way the owner of sandboxes is
// the caller (the key; a fixed owner on stdio), exactly as in httpapi, and
// the sandboxes a session created are closed when that session ends.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// Config configures the MCP server.
type Config struct {
	Service *service.Service
	Logger  *slog.Logger
	// Version is what the server tells clients it is.
	Version string
	// Limits of the sandboxes the tools create; zero fields are the
	// service's defaults. A tool call's timeout_s overrides Timeout.
	Limits sandbox.Limits
	// MaxText bounds each text block of a tool result, in bytes; the rest
	// is dropped with a note. Zero: DefaultMaxText.
	MaxText int
	// SessionTimeout closes HTTP sessions that send nothing for this long
	// (with their sandboxes): clients that vanish without ending their
	// session. Zero: 30 minutes.
	SessionTimeout time.Duration
	// MaxSessionsPerOwner and MaxSessions bound the HTTP sessions open at
	// once, per owner (key) and in all; an initialize that would start
	// one more fails with a JSON-RPC error saying so (sessions.go). Zero:
	// DefaultMaxSessionsPerOwner and DefaultMaxSessions.
	MaxSessionsPerOwner, MaxSessions int
	// Node, for a node of a cluster, is named in its HTTP sessions' ids
	// (sandboxid.NewSession), so that gateways send a session's requests
	// to it.
	Node string
}

func (c *Config) setDefaults() {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MaxText <= 0 {
		c.MaxText = DefaultMaxText
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 30 * time.Minute
	}
	if c.MaxSessionsPerOwner <= 0 {
		c.MaxSessionsPerOwner = DefaultMaxSessionsPerOwner
	}
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.Version == "" {
		c.Version = "dev"
	}
}

// sessionIDs makes a node's session ids; nil (the SDK's own) for a server
// on its own.
func sessionIDs(node string) func() string {
	if node == "" {
		return nil
	}
	return func() string { return sandboxid.NewSession(node) }
}

// Authenticator maps a bearer token to its owner (httpapi's, satisfied by
// the store's keyring).
type Authenticator interface {
	Owner(token string) (string, error)
}

// server is one SDK server with its tools, bound to a way of finding who
// calls, and the sandboxes each of its sessions created.
type server struct {
	cfg   Config
	svc   *service.Service
	log   *slog.Logger
	sdk   *sdk.Server
	owner func(*sdk.CallToolRequest) (string, error)
	// sessionOwner finds who starts an HTTP session; nil on stdio, whose
	// one session is not counted.
	sessionOwner func(*sdk.RequestExtra) (string, error)

	// decoders decode each tool's arguments (see checkArguments).
	decoders map[string]func(json.RawMessage) error

	mu       sync.Mutex
	sessions map[*sdk.ServerSession]*session

	limit *sessionLimit // HTTP sessions open (sessions.go)
}

// session is the set of sandboxes one MCP session created.
type session struct {
	owner  string
	boxes  map[string]bool
	closed bool
	ended  chan struct{} // closed once its sandboxes are
}

func newServer(cfg Config, owner func(*sdk.CallToolRequest) (string, error),
	sessionOwner func(*sdk.RequestExtra) (string, error)) *server {
	cfg.setDefaults()
	s := &server{cfg: cfg, svc: cfg.Service, log: cfg.Logger, owner: owner, sessionOwner: sessionOwner,
		sessions: map[*sdk.ServerSession]*session{}, decoders: map[string]func(json.RawMessage) error{},
		limit: newSessionLimit(cfg)}
	s.sdk = sdk.NewServer(&sdk.Implementation{Name: "vivarium", Title: "Vivarium Python sandboxes", Version: cfg.Version},
		&sdk.ServerOptions{
			Instructions: instructions,
			// The SDK logs every session's start and end at info level:
			// only its warnings and errors are worth a server's log.
			Logger: slog.New(quieter{cfg.Logger.Handler()}),
			// No logging capability: nothing is sent that way.
			Capabilities: &sdk.ServerCapabilities{},
			GetSessionID: sessionIDs(cfg.Node),
		})
	s.addTools()
	s.sdk.AddReceivingMiddleware(s.checkArguments, s.countSessions)
	return s
}

const instructions = `Vivarium runs Python in isolated Linux sandboxes with no network access.
Use run_python for one-off computations. For work in steps (load data, look at it, plot it),
call create_sandbox once and pass its sandbox_id to run_python, run_shell and the file tools:
variables, imports and files are kept between calls until close_sandbox. Print the values you
want to see; charts come back as images; save files under the working directory.`

// track records that sess created sandbox id, and starts watching the
// session so that its sandboxes are closed when it ends. A sandbox created
// by a session that has already ended is closed at once.
func (s *server) track(ss *sdk.ServerSession, owner, id string) {
	s.mu.Lock()
	sess := s.sessions[ss]
	if sess == nil {
		sess = &session{owner: owner, boxes: map[string]bool{}, ended: make(chan struct{})}
		s.sessions[ss] = sess
		go func() {
			ss.Wait()
			s.endSession(ss)
		}()
	}
	closed := sess.closed
	if !closed {
		sess.boxes[id] = true
	}
	s.mu.Unlock()
	if closed {
		s.svc.Delete(owner, id)
	}
}

func (s *server) untrack(ss *sdk.ServerSession, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess := s.sessions[ss]; sess != nil {
		delete(sess.boxes, id)
	}
}

// endSession closes the sandboxes a session created. The session stays in
// the map, marked closed, so that a creation racing with the end is undone.
func (s *server) endSession(ss *sdk.ServerSession) {
	s.mu.Lock()
	sess := s.sessions[ss]
	if sess == nil {
		s.mu.Unlock()
		return
	}
	if sess.closed {
		s.mu.Unlock()
		<-sess.ended
		return
	}
	sess.closed = true
	defer close(sess.ended)
	ids := make([]string, 0, len(sess.boxes))
	for id := range sess.boxes {
		ids = append(ids, id)
	}
	clear(sess.boxes)
	s.mu.Unlock()
	// Forget the session a while later: long enough for any creation in
	// flight when it ended to see it closed.
	time.AfterFunc(time.Minute, func() {
		s.mu.Lock()
		delete(s.sessions, ss)
		s.mu.Unlock()
	})
	for _, id := range ids {
		if err := s.svc.Delete(sess.owner, id); err != nil && !errors.Is(err, service.ErrNotFound) {
			s.log.Warn("mcp: close a session's sandbox", "id", id, "err", err)
		}
	}
	if len(ids) > 0 {
		s.log.Info("mcp session ended: its sandboxes are closed", "sandboxes", len(ids))
	}
}

// closeAll ends every session and closes their sandboxes.
func (s *server) closeAll() {
	for ss := range s.sdk.Sessions() {
		ss.Close()
	}
	s.mu.Lock()
	all := make([]*sdk.ServerSession, 0, len(s.sessions))
	for ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.Unlock()
	for _, ss := range all {
		s.endSession(ss)
	}
}

// ServeStdio serves one MCP session over the process's standard input and
// output, for owner, until the client closes it or ctx ends. The session's
// sandboxes are closed before it returns.
func ServeStdio(ctx context.Context, cfg Config, owner string) error {
	return ServeTransport(ctx, cfg, owner, &sdk.StdioTransport{})
}

// ServeTransport is ServeStdio over any single-session transport.
func ServeTransport(ctx context.Context, cfg Config, owner string, t sdk.Transport) error {
	s := newServer(cfg, func(*sdk.CallToolRequest) (string, error) { return owner, nil }, nil)
	defer s.closeAll()
	err := s.sdk.Run(ctx, t)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Handler serves MCP over streamable HTTP.
type Handler struct {
	srv  *server
	http http.Handler
}

// NewHandler returns the streamable HTTP handler. With auth, every request
// needs "Authorization: Bearer KEY" and the key owns the sandboxes; a
// session can only be used with the key that started it. Without auth
// (development mode) every caller is devOwner. The sessions open at once
// are bounded per key and in all (Config.MaxSessionsPerOwner), and a
// session idle for Config.SessionTimeout is closed, which gives its place
// back.
func NewHandler(cfg Config, a Authenticator, devOwner string) *Handler {
	owner := func(extra *sdk.RequestExtra) (string, error) {
		if a == nil {
			return devOwner, nil
		}
		if extra == nil || extra.TokenInfo == nil || extra.TokenInfo.UserID == "" {
			return "", ErrNoOwner
		}
		return extra.TokenInfo.UserID, nil
	}
	s := newServer(cfg, func(req *sdk.CallToolRequest) (string, error) { return owner(req.Extra) }, owner)
	var h http.Handler = sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return s.sdk },
		&sdk.StreamableHTTPOptions{Logger: slog.New(quieter{s.log.Handler()}), SessionTimeout: s.cfg.SessionTimeout})
	h = s.endSessions(h)
	if a != nil {
		verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
			o, err := a.Owner(strings.TrimSpace(token))
			if err != nil {
				return nil, fmt.Errorf("%w: a valid API key is required: Authorization: Bearer <key>", auth.ErrInvalidToken)
			}
			// UserID binds each session to the key that started it: the
			// SDK refuses the session to any other key.
			return &auth.TokenInfo{UserID: o}, nil
		}
		h = auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
	}
	return &Handler{srv: s, http: h}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.http.ServeHTTP(w, r) }

// Close ends every session and closes the sandboxes they created.
func (h *Handler) Close() { h.srv.closeAll() }

// quieter passes on warnings and errors only.
type quieter struct{ slog.Handler }

func (q quieter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && q.Handler.Enabled(ctx, l)
}

func (q quieter) WithAttrs(a []slog.Attr) slog.Handler { return quieter{q.Handler.WithAttrs(a)} }
func (q quieter) WithGroup(name string) slog.Handler   { return quieter{q.Handler.WithGroup(name)} }

package mcp

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds on the HTTP sessions open at once. A session holds memory and
// goroutines on the server for as long as it lasts, which its client
// decides: without a bound one key could open them until the server runs
// out.
const (
	DefaultMaxSessionsPerOwner = 32
	DefaultMaxSessions         = 1024
)

// sessionHeader names an HTTP request's session (the SDK's header).
const sessionHeader = "Mcp-Session-Id"

// codeQuota is the JSON-RPC error code of a refused session: one of the
// codes JSON-RPC leaves to servers.
const codeQuota = -32029

// sessionLimit counts the HTTP sessions open at once, per owner and in
// all: a session takes its place with its initialize request, the only way
// the SDK's stateful handler keeps a session (a request of the sessionless
// protocol is refused), and gives it back when it ends (DELETE by its
// client, its idle timeout, the server's end).
type sessionLimit struct {
	perOwner, max int
	idle          time.Duration // how long an idle session lasts, for messages

	mu      sync.Mutex
	byOwner map[string]int
	total   int
	open    map[string]*heldSession // by session id
}

// heldSession is the place of an open session.
type heldSession struct {
	ended chan struct{} // closed once the place is given back
}

func newSessionLimit(cfg Config) *sessionLimit {
	return &sessionLimit{perOwner: cfg.MaxSessionsPerOwner, max: cfg.MaxSessions, idle: cfg.SessionTimeout,
		byOwner: map[string]int{}, open: map[string]*heldSession{}}
}

// take takes a place for one more session of owner's, or says why not, in
// words for the client; release gives it back, once.
func (l *sessionLimit) take(owner string) (release func(), refusal string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byOwner[owner] >= l.perOwner {
		return nil, fmt.Sprintf("this key has %d MCP sessions open, the most it may: end one (an MCP client's close "+
			"ends its session) or wait: a session idle for %v is closed", l.perOwner, l.idle)
	}
	if l.total >= l.max {
		return nil, fmt.Sprintf("the server has its maximum of %d MCP sessions open; try again later", l.max)
	}
	l.byOwner[owner]++
	l.total++
	return sync.OnceFunc(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.byOwner[owner]--; l.byOwner[owner] == 0 {
			delete(l.byOwner, owner)
		}
		l.total--
	}), ""
}

// hold keeps the place release gives back for session ss until it ends.
func (l *sessionLimit) hold(ss *sdk.ServerSession, release func()) {
	id := ss.ID()
	h := &heldSession{ended: make(chan struct{})}
	l.mu.Lock()
	l.open[id] = h
	l.mu.Unlock()
	go func() {
		ss.Wait()
		l.mu.Lock()
		delete(l.open, id)
		l.mu.Unlock()
		release()
		close(h.ended)
	}()
}

// held returns the place session id holds; nil if it holds none.
func (l *sessionLimit) held(id string) *heldSession {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[id]
}

// countSessions is the middleware that bounds the sessions started over
// HTTP (those with an id): an initialize over the bounds fails with a
// JSON-RPC error saying which bound, which clients show (an HTTP status
// of their own would be shown by some as "Too Many Requests" alone), and
// the SDK then closes the session it had made for the request.
func (s *server) countSessions(next sdk.MethodHandler) sdk.MethodHandler {
	return func(ctx context.Context, method string, req sdk.Request) (sdk.Result, error) {
		ss, _ := req.GetSession().(*sdk.ServerSession)
		if method != "initialize" || s.sessionOwner == nil || ss == nil || ss.ID() == "" || s.limit.held(ss.ID()) != nil {
			return next(ctx, method, req)
		}
		owner, err := s.sessionOwner(req.GetExtra())
		if err != nil {
			return nil, err
		}
		release, refusal := s.limit.take(owner)
		if refusal != "" {
			return nil, &jsonrpc.Error{Code: codeQuota, Message: refusal}
		}
		res, err := next(ctx, method, req)
		if err != nil {
			release()
			return nil, err
		}
		s.limit.hold(ss, release)
		return res, nil
	}
}

// endSessions gives the place of a session its client ends (DELETE) back
// before the answer: a client at its bound can start another at once.
func (s *server) endSessions(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(sessionHeader)
		if r.Method != http.MethodDelete || id == "" {
			next.ServeHTTP(w, r)
			return
		}
		h := s.limit.held(id)
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if h != nil && sw.status == http.StatusNoContent {
			// The SDK closed the session: its end is at hand.
			select {
			case <-h.ended:
			case <-r.Context().Done():
			}
		}
	})
}

// statusWriter records the status of an answer that streams nothing (a
// DELETE's).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

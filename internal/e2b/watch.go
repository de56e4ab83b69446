package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Watching a directory (files.watchDir) compares listings of it, every
// watchInterval, through the workspace's confined API. Polling costs no
// host kernel resource a sandbox could exhaust (inotify instances and
// watches are per host user, shared with the host's own services), works
// with any backend's workspace, and sees what a sandbox does however it
// does it; it reports a rename as a removal and a creation, and changes
// that come and go within an interval not at all.
const (
	watchInterval = 250 * time.Millisecond
	// maxWatched bounds the entries one watch lists at every interval.
	maxWatched = 10_000
)

type watchRequest struct {
	Path              string `json:"path"`
	Recursive         bool   `json:"recursive"`
	IncludeEntry      bool   `json:"includeEntry"`
	IncludeEntrySnake bool   `json:"include_entry"`
}

// WatchDirResponse's fields are a oneof, which the JSON mapping puts in
// the message itself: {"start": {}}, {"filesystem": {...}}.
type (
	watchStart struct {
		Start struct{} `json:"start"`
	}
	watchKeepalive struct {
		Keepalive struct{} `json:"keepalive"`
	}
	watchFS struct {
		Filesystem fsEvent `json:"filesystem"`
	}
	fsEvent struct {
		Name  string     `json:"name"`
		Type  string     `json:"type"`
		Entry *entryInfo `json:"entry,omitempty"`
	}
)

// snapshot is a listing, by workspace path.
type snapshot map[string]sandbox.FileInfo

func scan(ws sandbox.Workspace, rel string, recursive bool) (snapshot, error) {
	depth := 1
	if recursive {
		depth = maxListDepth
	}
	infos, err := ws.ReadDir(rel, depth)
	if err != nil {
		return nil, err
	}
	if len(infos) > maxWatched {
		return nil, newConnectError(codeResourceExhausted,
			fmt.Sprintf("%s holds more than %d entries: too many to watch", toSandbox(rel), maxWatched))
	}
	snap := make(snapshot, len(infos))
	for _, fi := range infos {
		snap[fi.Path] = fi
	}
	return snap, nil
}

// diff lists what changed from old to cur, as E2B's event types: created
// (and written, for a file with content), written (size or time changed),
// permissions changed, removed.
func diff(old, cur snapshot, rel string, withEntry bool) []fsEvent {
	name := func(p string) string {
		if rel == "." {
			return p
		}
		return strings.TrimPrefix(p, rel+"/")
	}
	var out []fsEvent
	add := func(p, typ string, fi *sandbox.FileInfo) {
		ev := fsEvent{Name: name(p), Type: typ}
		if withEntry && fi != nil {
			e := entryOf(*fi)
			ev.Entry = &e
		}
		out = append(out, ev)
	}
	paths := make([]string, 0, len(cur))
	for p := range cur {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		now := cur[p]
		before, ok := old[p]
		switch {
		case !ok || before.Type != now.Type:
			add(p, "EVENT_TYPE_CREATE", &now)
			if now.Type == "file" && now.Size > 0 {
				// A file made with content: created, then written,
				// as inotify tells it in an E2B sandbox.
				add(p, "EVENT_TYPE_WRITE", &now)
			}
		case now.Type != "dir" && (before.Size != now.Size || !before.ModTime.Equal(now.ModTime)):
			add(p, "EVENT_TYPE_WRITE", &now)
		case before.Mode != now.Mode:
			add(p, "EVENT_TYPE_CHMOD", &now)
		}
	}
	var gone []string
	for p := range old {
		if now, ok := cur[p]; !ok || now.Type != old[p].Type {
			gone = append(gone, p)
		}
	}
	slices.Sort(gone)
	for _, p := range gone {
		add(p, "EVENT_TYPE_REMOVE", nil)
	}
	return out
}

func (s *Server) watchDir(r *http.Request, t target, msg []byte, st *rpcStream) error {
	var req watchRequest
	if err := decodeMessage(msg, &req); err != nil {
		return err
	}
	ws, rel, done, err := s.rpcWorkspace(r, t, req.Path)
	if err != nil {
		return err
	}
	// Watching does not keep the sandbox alive: it is marked used once.
	done()
	release, ok := s.hold("watch", t.id, maxWatchesPerSandbox)
	if !ok {
		return newConnectError(codeResourceExhausted,
			fmt.Sprintf("a sandbox is watched by at most %d watches at once; stop one first", maxWatchesPerSandbox))
	}
	defer release()
	withEntry := req.IncludeEntry || req.IncludeEntrySnake
	prev, err := scan(ws, rel, req.Recursive)
	if err != nil {
		if errors.Is(err, sandbox.ErrBadPath) && strings.Contains(err.Error(), "not a directory") {
			return newConnectError(codeInvalidArgument, toSandbox(rel)+" is not a directory")
		}
		return notFoundPath(rel, err)
	}
	if err := st.Send(watchStart{}); err != nil {
		return err
	}
	ctx := r.Context()
	kctx, stop := context.WithCancel(ctx)
	defer stop()
	st.KeepAlive(kctx, watchKeepalive{})
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		// Whether it is still there, not a use of it: a paused sandbox
		// stays paused.
		if !s.svc.Exists(t.owner, t.id) {
			return newConnectError(codeUnavailable, "the sandbox is gone: it was killed or reached its timeout")
		}
		cur, err := scan(ws, rel, req.Recursive)
		if err != nil {
			if errors.Is(err, sandbox.ErrBadPath) || strings.Contains(err.Error(), "no such file") {
				return newConnectError(codeNotFound, toSandbox(rel)+" was removed")
			}
			return notFoundPath(rel, err)
		}
		for _, ev := range diff(prev, cur, rel, withEntry) {
			if err := st.Send(watchFS{Filesystem: ev}); err != nil {
				return err
			}
		}
		prev = cur
	}
}

// Watchers polled by the client (CreateWatcher, GetWatcherEvents,
// RemoveWatcher; E2B's Python SDK watches so) keep the last listing and
// compare it with a new one at each GetWatcherEvents: nothing runs between
// calls.

type watcher struct {
	t         target
	ws        sandbox.Workspace
	rel       string
	recursive bool
	withEntry bool
	release   func()

	mu   sync.Mutex
	prev snapshot
}

type watcherRequest struct {
	WatcherID      string `json:"watcherId"`
	WatcherIDSnake string `json:"watcher_id"`
}

func (w watcherRequest) id() string {
	if w.WatcherID != "" {
		return w.WatcherID
	}
	return w.WatcherIDSnake
}

func (s *Server) createWatcher(r *http.Request, t target, msg []byte) (any, error) {
	var req watchRequest
	if err := decodeMessage(msg, &req); err != nil {
		return nil, err
	}
	ws, rel, done, err := s.rpcWorkspace(r, t, req.Path)
	if err != nil {
		return nil, err
	}
	done()
	prev, err := scan(ws, rel, req.Recursive)
	if err != nil {
		if errors.Is(err, sandbox.ErrBadPath) && strings.Contains(err.Error(), "not a directory") {
			return nil, newConnectError(codeInvalidArgument, toSandbox(rel)+" is not a directory")
		}
		return nil, notFoundPath(rel, err)
	}
	s.sweepWatchers()
	release, ok := s.hold("watcher", t.id, maxWatchesPerSandbox)
	if !ok {
		return nil, newConnectError(codeResourceExhausted,
			fmt.Sprintf("a sandbox has at most %d watchers at once; remove one first", maxWatchesPerSandbox))
	}
	id := randomID()
	s.mu.Lock()
	s.watchers[id] = &watcher{t: t, ws: ws, rel: rel, recursive: req.Recursive, withEntry: req.IncludeEntry || req.IncludeEntrySnake,
		release: release, prev: prev}
	s.mu.Unlock()
	return map[string]string{"watcherId": id}, nil
}

// watcherOf finds a watcher of the target sandbox: another sandbox's is
// not found.
func (s *Server) watcherOf(t target, msg []byte) (string, *watcher, error) {
	var req watcherRequest
	if err := decodeMessage(msg, &req); err != nil {
		return "", nil, err
	}
	s.mu.Lock()
	w := s.watchers[req.id()]
	s.mu.Unlock()
	if w == nil || w.t != t {
		return "", nil, newConnectError(codeNotFound, fmt.Sprintf("watcher %q not found", req.id()))
	}
	return req.id(), w, nil
}

func (s *Server) watcherEvents(r *http.Request, t target, msg []byte) (any, error) {
	_, w, err := s.watcherOf(t, msg)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	cur, err := scan(w.ws, w.rel, w.recursive)
	if err != nil {
		return nil, notFoundPath(w.rel, err)
	}
	events := diff(w.prev, cur, w.rel, w.withEntry)
	w.prev = cur
	if events == nil {
		events = []fsEvent{}
	}
	return map[string][]fsEvent{"events": events}, nil
}

func (s *Server) removeWatcher(r *http.Request, t target, msg []byte) (any, error) {
	id, w, err := s.watcherOf(t, msg)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	delete(s.watchers, id)
	s.mu.Unlock()
	w.release()
	return struct{}{}, nil
}

// sweepWatchers forgets the watchers of sandboxes that are gone. The
// service is asked outside s.mu, and without resuming anything (Exists):
// a watcher of another key's paused sandbox is left as it is.
func (s *Server) sweepWatchers() {
	s.mu.Lock()
	seen := make(map[string]target, len(s.watchers))
	for id, w := range s.watchers {
		seen[id] = w.t
	}
	s.mu.Unlock()
	var goneIDs []string
	for id, t := range seen {
		if !s.svc.Exists(t.owner, t.id) {
			goneIDs = append(goneIDs, id)
		}
	}
	var gone []*watcher
	s.mu.Lock()
	for _, id := range goneIDs {
		// Removed meanwhile by its client: released there.
		if w, ok := s.watchers[id]; ok {
			delete(s.watchers, id)
			gone = append(gone, w)
		}
	}
	s.mu.Unlock()
	for _, w := range gone {
		w.release() // takes s.mu
	}
}

package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
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

// diff lists what changed from old to cur, as E2B's event types: created,
// written (size or time changed), permissions changed, removed.
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
		if _, err := s.svc.Get(t.owner, t.id); err != nil {
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

// The polling variant of watching (CreateWatcher, GetWatcherEvents,
// RemoveWatcher) would keep state per watcher between calls; it is not
// offered.

func (s *Server) createWatcher(r *http.Request, t target, msg []byte) (any, error) {
	return nil, fmt.Errorf("%w: watchers polled with GetWatcherEvents (use the WatchDir stream)", errUnsupported)
}

func (s *Server) watcherEvents(r *http.Request, t target, msg []byte) (any, error) {
	return nil, fmt.Errorf("%w: watchers polled with GetWatcherEvents (use the WatchDir stream)", errUnsupported)
}

func (s *Server) removeWatcher(r *http.Request, t target, msg []byte) (any, error) {
	return nil, fmt.Errorf("%w: watchers polled with GetWatcherEvents (use the WatchDir stream)", errUnsupported)
}

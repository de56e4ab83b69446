package e2b

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// Listing (GET /v2/sandboxes, and the deprecated GET /sandboxes) as E2B
// answers it: filtered by state, metadata, start time and template, sorted
// by start time (newest first unless order=asc), and paged: a page holds
// limit sandboxes (100 at most, E2B's cap) and, when more follow, the
// X-Next-Token header names the cursor the SDK sends back as nextToken.
const (
	defaultListLimit = 100
	maxListLimit     = 100
)

// listQuery is a parsed listing request.
type listQuery struct {
	metadata     map[string]string
	startedAfter time.Time
	template     string
	desc         bool
	limit        int
	after        *cursor // the last sandbox of the previous page
}

func parseListQuery(q url.Values) (listQuery, error) {
	lq := listQuery{desc: true, limit: defaultListLimit, template: q.Get("template")}
	var err error
	if lq.metadata, err = metadataFilter(q.Get("metadata")); err != nil {
		return lq, err
	}
	if v := q.Get("startedAfter"); v != "" {
		if lq.startedAfter, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return lq, fmt.Errorf("startedAfter must be a time in RFC 3339 format, such as 2026-01-02T15:04:05Z")
		}
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		lq.desc = false
	default:
		return lq, fmt.Errorf("order must be asc or desc")
	}
	if v := q.Get("limit"); v != "" {
		if lq.limit, err = strconv.Atoi(v); err != nil || lq.limit < 1 || lq.limit > maxListLimit {
			return lq, fmt.Errorf("limit must be an integer from 1 to %d", maxListLimit)
		}
	}
	if v := q.Get("nextToken"); v != "" {
		c, err := parseCursor(v)
		if err != nil {
			return lq, err
		}
		lq.after = &c
	}
	return lq, nil
}

// cursor is a place in the list: a sandbox's start time and ID, which
// order the list with no ties. A cursor stays right when sandboxes come
// and go between pages, as an index would not.
type cursor struct {
	started time.Time
	id      string
}

func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.started.UnixNano(), 10) + "." + c.id))
}

func parseCursor(tok string) (cursor, error) {
	bad := fmt.Errorf("invalid nextToken: pass the X-Next-Token of the previous page unchanged")
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(raw) > 200 {
		return cursor{}, bad
	}
	ns, id, ok := strings.Cut(string(raw), ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return cursor{}, bad
	}
	return cursor{started: time.Unix(0, n), id: id}, nil
}

// compare orders two places oldest first.
func (c cursor) compare(o cursor) int {
	if d := c.started.Compare(o.started); d != 0 {
		return d
	}
	return strings.Compare(c.id, o.id)
}

func cursorOf(info service.Info) cursor { return cursor{started: info.CreatedAt, id: info.ID} }

func (s *Server) list(w http.ResponseWriter, r *http.Request, owner string) {
	q := r.URL.Query()
	out := []listedSandbox{}
	wanted := wantedStates(q["state"])
	lq, err := parseListQuery(q)
	if err != nil {
		writeEnvdError(w, http.StatusBadRequest, err.Error())
		return
	}
	var all []service.Info
	for _, info := range s.svc.List(owner) {
		if wanted[e2bState(info)] && lq.matches(info, s.template(info.ID)) {
			all = append(all, info)
		}
	}
	order := func(a, b service.Info) int { return cursorOf(a).compare(cursorOf(b)) }
	if lq.desc {
		order = func(a, b service.Info) int { return cursorOf(b).compare(cursorOf(a)) }
	}
	slices.SortFunc(all, order)
	start := 0
	if lq.after != nil {
		// The first sandbox past the cursor in this order.
		start = len(all)
		for i, info := range all {
			d := cursorOf(info).compare(*lq.after)
			if (lq.desc && d < 0) || (!lq.desc && d > 0) {
				start = i
				break
			}
		}
	}
	end := min(start+lq.limit, len(all))
	for _, info := range all[start:end] {
		out = append(out, s.listed(info))
	}
	if end < len(all) {
		w.Header().Set("X-Next-Token", cursorOf(all[end-1]).String())
	}
	writeJSON(w, http.StatusOK, out)
}

func (lq listQuery) matches(info service.Info, template string) bool {
	if lq.template != "" && lq.template != template {
		return false
	}
	if !lq.startedAfter.IsZero() && info.CreatedAt.Before(lq.startedAfter) {
		return false
	}
	for k, v := range lq.metadata {
		if got, ok := info.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// wantedStates is the list's state filter: running and paused when
// none is given, as E2B lists.
func wantedStates(states []string) map[string]bool {
	if len(states) == 0 {
		return map[string]bool{"running": true, "paused": true}
	}
	want := map[string]bool{}
	for _, st := range states {
		for one := range strings.SplitSeq(st, ",") {
			want[strings.TrimSpace(one)] = true
		}
	}
	return want
}

// e2bState is E2B's name for a sandbox's state: running or paused.
func e2bState(info service.Info) string {
	if info.State == "paused" {
		return "paused"
	}
	return "running"
}

// metadataFilter parses the list's metadata query: "k=v&k2=v2", whose keys
// and values the SDKs percent-encode once more.
func metadataFilter(q string) (map[string]string, error) {
	if q == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return nil, fmt.Errorf("invalid metadata filter: %v", err)
	}
	out := map[string]string{}
	for k, vs := range vals {
		key, err1 := url.QueryUnescape(k)
		if err1 != nil {
			key = k
		}
		for _, v := range vs {
			val, err2 := url.QueryUnescape(v)
			if err2 != nil {
				val = v
			}
			out[key] = val
		}
	}
	return out, nil
}

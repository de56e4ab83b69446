// Package route declares an API's routes once, beside the adapter that
// serves them (httpapi.Routes, e2b.Routes), with how a cluster's gateway
// forwards each: the adapter serves those routes and no others (Mux), and
// the gateway builds its routing from the same rows (internal/gateway),
// so that a route a node serves is one the gateway forwards.
package route

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// Route is one route of an API.
type Route struct {
	// Method is the HTTP method; "": any.
	Method string
	// Path is a pattern of net/http's ServeMux: {id} a segment, {rest...}
	// the rest, a trailing "/" a subtree. Where the route is for one
	// sandbox, snapshot or volume, the path's first wildcard names it.
	Path    string
	Forward Forward
}

// Pattern is the route as ServeMux reads it: "GET /v1/sandboxes".
func (r Route) Pattern() string {
	if r.Method == "" {
		return r.Path
	}
	return r.Method + " " + r.Path
}

// ID is the name of the path's first wildcard ("id" of
// /v1/sandboxes/{id}/files/{path...}); "": none.
func (r Route) ID() string {
	_, after, ok := strings.Cut(r.Path, "{")
	if !ok {
		return ""
	}
	name, _, _ := strings.Cut(after, "}")
	return strings.TrimSuffix(name, "...")
}

// Forward is how a cluster's gateway forwards a route's requests: to
// which node, or to every node. The zero Forward is none declared, which
// a gateway refuses to start with.
type Forward struct {
	to   to
	list string // Every's
}

type to int

const (
	undeclared to = iota
	local
	pick
	create
	sandbox
	sandboxHeader
	snapshot
	volume
	volumeID
	newVolume
	signed
	template
	templateOrSnapshot
	key
	every
)

var names = [...]string{undeclared: "undeclared", local: "local", pick: "pick", create: "create", sandbox: "sandbox",
	sandboxHeader: "sandbox header", snapshot: "snapshot", volume: "volume", volumeID: "volume id",
	newVolume: "new volume", signed: "signed", template: "template", templateOrSnapshot: "template or snapshot",
	key: "key", every: "every"}

// The forwards. A sandbox, a snapshot and a volume live on one node, which
// their ids name (internal/sandboxid); what is new goes where the load
// says.
var (
	// Local: each node answers it of itself (its health, its metrics),
	// so it is not forwarded.
	Local = Forward{to: local}
	// Pick: to the node the load picks: what makes something new that
	// lives nowhere yet (a one-shot, an import), or what any node answers
	// alike.
	Pick = Forward{to: pick}
	// Create: a new sandbox: to the node of the snapshot and the volumes
	// its body names, else to the node the load picks.
	Create = Forward{to: create}
	// Sandbox: to the node of the sandbox the path's first wildcard names.
	Sandbox = Forward{to: sandbox}
	// SandboxHeader: to the node of the sandbox the E2b-Sandbox-Id
	// header names (E2B's data plane).
	SandboxHeader = Forward{to: sandboxHeader}
	// Snapshot: to the node of the snapshot the path's first wildcard
	// names, by id or by name.
	Snapshot = Forward{to: snapshot}
	// Volume: to the node of the volume the path's first wildcard names,
	// by id or by name.
	Volume = Forward{to: volume}
	// VolumeID: as Volume, by id only: its clients send a volume's
	// token, not the key a name is looked up with.
	VolumeID = Forward{to: volumeID}
	// NewVolume: to the node the load picks, unless the key has a volume
	// of that name on any node.
	NewVolume = Forward{to: newVolume}
	// Signed: a signed file URL: to the node whose sandbox signed it.
	Signed = Forward{to: signed}
	// Key: to the node the request's key picks, the same for a key while
	// the nodes stay the same: a key's template builds, which live on
	// the node that makes them.
	Key = Forward{to: key}
	// Template: to the node the template id of the path's first
	// wildcard names (sandboxid.Template); a name, to the key's node.
	Template = Forward{to: template}
	// TemplateOrSnapshot: a snapshot's node, by the snapshot's id or
	// name; else as Template.
	TemplateOrSnapshot = Forward{to: templateOrSnapshot}
)

// Every: to every node, their answers joined: the arrays, or the objects,
// under the field list of each node's answer ({"sandboxes": [...]}), or
// the bare arrays where list is "".
func Every(list string) Forward { return Forward{to: every, list: list} }

// List is the field Every was given, and whether f is Every's.
func (f Forward) List() (string, bool) { return f.list, f.to == every }

func (f Forward) String() string {
	switch {
	case f.to == every:
		return fmt.Sprintf("every %q", f.list)
	case f.to < 0 || int(f.to) >= len(names):
		return fmt.Sprintf("forward(%d)", f.to)
	}
	return names[f.to]
}

// Mux is an http.ServeMux that serves only the routes it was given:
// registering a pattern none of them has panics, as ServeMux does two
// patterns that conflict, since a route served without a row is one a
// gateway does not forward.
type Mux struct {
	*http.ServeMux
	declared map[string]bool // by pattern: registered yet
}

// NewMux returns a Mux for routes.
func NewMux(routes []Route) *Mux {
	m := &Mux{ServeMux: http.NewServeMux(), declared: map[string]bool{}}
	for _, r := range routes {
		m.declared[r.Pattern()] = false
	}
	return m
}

// Handle registers h for pattern, which one of the routes must have.
func (m *Mux) Handle(pattern string, h http.Handler) {
	if _, ok := m.declared[pattern]; !ok {
		panic(fmt.Sprintf("route %q is served without being declared: add it to the routes, "+
			"with how a cluster's gateway forwards it (package route)", pattern))
	}
	m.declared[pattern] = true
	m.ServeMux.Handle(pattern, h)
}

// HandleFunc registers h for pattern, which one of the routes must have.
func (m *Mux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// Complete panics unless every route declared is registered: one that is
// not is a route gateways forward and nodes do not answer.
func (m *Mux) Complete() {
	var unserved []string
	for p, done := range m.declared {
		if !done {
			unserved = append(unserved, p)
		}
	}
	if len(unserved) > 0 {
		slices.Sort(unserved)
		panic(fmt.Sprintf("routes declared and not served: %q", unserved))
	}
}

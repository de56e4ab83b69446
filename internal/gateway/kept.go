package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/e2b"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
)

// Besides sandboxes, a node keeps snapshots and volumes, and they stay on
// it: a snapshot's memory and a volume's file system are files of the
// node's disk. Their ids name the node, as sandboxes' do; a volume, and a
// snapshot, may also be known by a name, which the gateway looks up in
// every node's list. A sandbox made from a snapshot, or mounting volumes,
// is made on their node.

// An api is one of the two APIs' shapes of what the gateway reads, and
// of the errors it answers.
type api struct {
	// e2b: E2B's API, whose errors are E2B's (fail).
	e2b                bool
	volumes, snapshots listing
	// create's fields: the snapshot it is made from, the volumes it mounts
	snapshot, mounts string
	// snapshotRef is the snapshot a create's snapshot field names: an
	// id, a name, or "" (none).
	snapshotRef func(string) string
}

// A listing is where a key's volumes, or snapshots, are listed, and how
// an item names itself.
type listing struct {
	kind  sandboxid.Kind
	path  string
	key   string // the list's key in the answer ("": a bare array)
	names func(json.RawMessage) []string
}

var (
	vivariumAPI = api{
		volumes:   listing{sandboxid.Volume, "/v1/volumes", "volumes", nameField},
		snapshots: listing{sandboxid.Snapshot, "/v1/snapshots", "snapshots", nameField},
		snapshot:  "from_snapshot", mounts: "volumes",
		snapshotRef: func(s string) string { return s },
	}
	e2bAPI = api{
		e2b:       true,
		volumes:   listing{sandboxid.Volume, e2b.Prefix + "/volumes", "", nameField},
		snapshots: listing{sandboxid.Snapshot, e2b.Prefix + "/snapshots", "", namesField},
		snapshot:  "templateID", mounts: "volumeMounts",
		snapshotRef: e2b.SnapshotRef,
	}
)

func nameField(it json.RawMessage) []string {
	var v struct{ Name string }
	json.Unmarshal(it, &v)
	return []string{v.Name}
}

func namesField(it json.RawMessage) []string {
	var v struct{ Names []string }
	json.Unmarshal(it, &v)
	return v.Names
}

// maxBody bounds a creation's body, which the gateway reads, before any
// key is checked, to route it: E2B's bound (a node's E2B API takes no
// more); a node's own API takes up to 32 MiB of JSON (environment,
// metadata), which through a gateway answers 413.
const maxBody = 1 << 20

// toKept sends r to the node that keeps ref, a snapshot or a volume: its
// id, or its name, looked up in l.
func (g *Gateway) toKept(w http.ResponseWriter, r *http.Request, a *api, l listing, ref string) {
	g.toKeptOr(w, r, a, l, ref, nil)
}

// toKeptOr is toKept, calling orElse (if not nil) where no node keeps
// ref.
func (g *Gateway) toKeptOr(w http.ResponseWriter, r *http.Request, a *api, l listing, ref string, orElse func()) {
	var name string
	found := false
	var err error
	if l.kind != sandboxid.Snapshot || sandboxid.Snapshot.Valid(ref) || sandboxid.ValidName(ref) {
		name, found, err = g.keptNode(r, l, &nameLists{}, ref)
	}
	switch {
	case err != nil:
		a.failList(w, l, ref, err)
		return
	case !found && orElse != nil:
		orElse()
		return
	case !found:
		a.fail(w, notFound(l.kind), fmt.Sprintf("no %s %q in this cluster", what(l.kind), ref))
		return
	}
	n, ok := g.cfg.Nodes.Node(name)
	if !ok {
		a.fail(w, apierr.StateLost,
			fmt.Sprintf("%s %s was on node %s, which is gone: it is lost", what(l.kind), ref, name))
		return
	}
	g.forward(w, r, a, n)
}

// notFound is the kind of error a node answers for a snapshot, or a
// volume, it does not have.
func notFound(kind sandboxid.Kind) *apierr.Kind {
	if kind == sandboxid.Volume {
		return apierr.VolumeNotFound
	}
	return apierr.SnapshotNotFound
}

func what(kind sandboxid.Kind) string {
	if kind == sandboxid.Volume {
		return "volume"
	}
	return "snapshot"
}

// toCreate sends a new sandbox to the node of what it is made from (a
// snapshot, volumes), else to the node the load picks.
func (g *Gateway) toCreate(w http.ResponseWriter, r *http.Request, a *api) {
	body, ok := readBody(w, r, a)
	if !ok {
		return
	}
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil {
		g.toPicked(w, r, a) // the node says what is wrong with it
		return
	}
	var from []string // "snapshot <id>", "volume <ref>", "template <id>": what names a node
	var nodes []string
	var snap string
	json.Unmarshal(req[a.snapshot], &snap)
	if id, _, _ := strings.Cut(snap, ":"); a.e2b && sandboxid.Template.Valid(id) {
		// A template by its id: on the node that built it, the one
		// that knows the id (every node knows the key's templates by
		// name, through the template registry).
		if node, ok := sandboxid.Template.Node(id); ok {
			from, nodes = append(from, "template "+id), append(nodes, node)
		}
	} else if ref := a.snapshotRef(snap); sandboxid.Snapshot.Valid(ref) || sandboxid.ValidName(ref) {
		n, found, err := g.keptNode(r, a.snapshots, &nameLists{}, ref)
		if err != nil {
			a.failList(w, a.snapshots, ref, err)
			return
		}
		if !found {
			g.toPicked(w, r, a) // not found: the node says so, in its API's shape
			return
		}
		from, nodes = append(from, "snapshot "+ref), append(nodes, n)
	}
	var mounts []struct {
		Name string `json:"name"`
	}
	json.Unmarshal(req[a.mounts], &mounts)
	if len(mounts) > sandbox.MaxVolumes {
		g.toPicked(w, r, a) // the node refuses it, in its API's shape
		return
	}
	vols := &nameLists{}
	for _, m := range mounts {
		n, found, err := g.keptNode(r, a.volumes, vols, m.Name)
		if err != nil {
			a.failList(w, a.volumes, m.Name, err)
			return
		}
		if !found {
			g.toPicked(w, r, a) // not found: the node says so, in its API's shape
			return
		}
		from, nodes = append(from, "volume "+m.Name), append(nodes, n)
	}
	if len(nodes) == 0 {
		g.toPicked(w, r, a)
		return
	}
	for i := range nodes {
		if nodes[i] != nodes[0] {
			a.fail(w, apierr.InvalidRequest,
				fmt.Sprintf("a sandbox is made on one node, and what it is made from is on several: %s on %s, %s on %s",
					from[0], nodes[0], from[i], nodes[i]))
			return
		}
	}
	n, ok := g.cfg.Nodes.Node(nodes[0])
	if !ok {
		a.fail(w, apierr.StateLost,
			fmt.Sprintf("%s was on node %s, which is gone: it is lost", from[0], nodes[0]))
		return
	}
	g.forward(w, r, a, n)
}

// readBody reads r's body (at most maxBody) and gives it back to r, to be
// forwarded as it came.
func readBody(w http.ResponseWriter, r *http.Request, a *api) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	r.Body.Close()
	if err != nil {
		a.fail(w, apierr.InvalidRequest, "reading the request: "+err.Error())
		return nil, false
	}
	if len(body) > maxBody {
		msg := fmt.Sprintf("the request is over %d bytes", maxBody)
		if a.e2b {
			// 413, as a node's E2B API answers a body past its bound:
			// too_large's E2B status (507) is an upload past the disk
			// limit, which E2B's SDKs raise as such.
			writeE2BError(w, http.StatusRequestEntityTooLarge, msg)
		} else {
			a.fail(w, apierr.TooLarge, msg)
		}
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength, r.TransferEncoding = int64(len(body)), nil // whole now, however it came
	return body, true
}

// toNewVolume sends a new volume to the node the load picks, unless the
// key has a volume of that name on any node: names are the key's, across
// the cluster, since sandboxes mount volumes by name.
func (g *Gateway) toNewVolume(w http.ResponseWriter, r *http.Request, a *api) {
	body, ok := readBody(w, r, a)
	if !ok {
		return
	}
	var req struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(body, &req) == nil && req.Name != "" {
		n, found, err := g.keptNode(r, a.volumes, &nameLists{}, req.Name)
		if err != nil && err != errAmbiguous {
			a.failList(w, a.volumes, req.Name, err)
			return
		}
		if found || err == errAmbiguous {
			a.fail(w, apierr.Exists,
				fmt.Sprintf("the key has a volume named %q already (on node %s)", req.Name, n))
			return
		}
	}
	g.toPicked(w, r, a)
}

var errAmbiguous = errors.New("ambiguous")

// nameLists are the nodes' lists of a key's volumes, or snapshots, by
// name, asked for once per request however many names it looks up.
type nameLists struct {
	done  bool
	names map[string][]string // name: the nodes that have one
	err   error
}

// keptNode finds the node of the key's volume, or snapshot, ref: an id,
// or a name looked up in every live node's list, with r's key.
func (g *Gateway) keptNode(r *http.Request, l listing, lists *nameLists, ref string) (node string, found bool, err error) {
	if l.kind.Valid(ref) {
		node, found = l.kind.Node(ref)
		return node, found, nil
	}
	if !lists.done {
		lists.done, lists.names = true, map[string][]string{}
		for _, n := range g.cfg.Nodes.Nodes() {
			part, err := g.list(r, n, l.path, "", l.key)
			var items []json.RawMessage
			if err == nil {
				err = json.Unmarshal(part, &items)
			}
			if err != nil {
				var st *statusError
				if !errors.As(err, &st) || st.code >= 500 {
					// A node that does not answer may hold it: say
					// so rather than guess.
					err = fmt.Errorf("node %s did not list its %ss: %w", n.Name, what(l.kind), err)
				}
				lists.err = err
				break
			}
			for _, it := range items {
				for _, name := range l.names(it) {
					if name != "" && !slices.Contains(lists.names[name], n.Name) {
						lists.names[name] = append(lists.names[name], n.Name)
					}
				}
			}
		}
	}
	if lists.err != nil {
		return "", false, lists.err
	}
	on := slices.Sorted(slices.Values(lists.names[ref]))
	switch len(on) {
	case 0:
		return "", false, nil
	case 1:
		return on[0], true, nil
	}
	return strings.Join(on, ", "), true, errAmbiguous
}

// failList answers err, a failed look-up of ref in l.
func (a *api) failList(w http.ResponseWriter, l listing, ref string, err error) {
	var st *statusError
	switch {
	case errors.As(err, &st):
		// The client's mistake (a bad key): as the node said it.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(st.code)
		w.Write(st.body)
	case err == errAmbiguous:
		a.fail(w, apierr.Conflict,
			fmt.Sprintf("the key has %ss named %q on several nodes: use an id", what(l.kind), ref))
	default:
		a.fail(w, apierr.NodeUnreachable, fmt.Sprintf("looking up %s %q: %v", what(l.kind), ref, err))
	}
}

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

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
)

// Besides sandboxes, a node keeps snapshots and volumes, and they stay on
// it: a snapshot's memory and a volume's file system are files of the
// node's disk. Their ids name the node, as sandboxes' do; a volume is also known
// by its name, which the gateway looks up in every node's list. A sandbox
// made from a snapshot, or mounting volumes, is made on their node.

// An api is one of the two APIs' shapes of what the gateway reads.
type api struct {
	volumes   string // the list of a key's volumes
	volumeKey string // its key ("": a bare array)
	// create's fields: the snapshot it is made from, the volumes it mounts
	snapshot, mounts string
}

var (
	vivarium = api{volumes: "/v1/volumes", volumeKey: "volumes", snapshot: "from_snapshot", mounts: "volumes"}
	e2b      = api{volumes: "/e2b/volumes", snapshot: "templateID", mounts: "volumeMounts"}
)

// maxBody bounds a creation's body, which the gateway reads, before any
// key is checked, to route it: E2B's bound (a node's E2B API takes no
// more); a node's own API takes up to 32 MiB of JSON (environment,
// metadata), which through a gateway answers 413.
const maxBody = 1 << 20

// toKept sends r to the node that keeps id, a snapshot or a volume.
func (g *Gateway) toKept(w http.ResponseWriter, r *http.Request, kind sandboxid.Kind, id string) {
	name, ok := kind.Node(id)
	if !ok {
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no %s %q in this cluster", what(kind), id))
		return
	}
	n, ok := g.cfg.Nodes.Node(name)
	if !ok {
		writeError(w, http.StatusGone, "state_lost",
			fmt.Sprintf("%s %s was on node %s, which is gone: it is lost", what(kind), id, name))
		return
	}
	g.forward(w, r, n)
}

func what(kind sandboxid.Kind) string {
	if kind == sandboxid.Volume {
		return "volume"
	}
	return "snapshot"
}

// toCreate sends a new sandbox to the node of what it is made from (a
// snapshot, volumes), else to the node the load picks.
func (g *Gateway) toCreate(w http.ResponseWriter, r *http.Request, a api) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil {
		g.toPicked(w, r) // the node says what is wrong with it
		return
	}
	var from []string // "snapshot <id>", "volume <ref>": what names a node
	var nodes []string
	var snap string
	if json.Unmarshal(req[a.snapshot], &snap) == nil && sandboxid.Snapshot.Valid(snap) {
		n, ok := sandboxid.Snapshot.Node(snap)
		if !ok {
			writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no snapshot %q in this cluster", snap))
			return
		}
		from, nodes = append(from, "snapshot "+snap), append(nodes, n)
	}
	var mounts []struct {
		Name string `json:"name"`
	}
	json.Unmarshal(req[a.mounts], &mounts)
	if len(mounts) > sandbox.MaxVolumes {
		g.toPicked(w, r) // the node refuses it, in its API's shape
		return
	}
	vols := &volumeLists{}
	for _, m := range mounts {
		n, found, err := g.volumeNode(r, a, vols, m.Name)
		if err != nil {
			writeVolumeError(w, m.Name, err)
			return
		}
		if !found {
			g.toPicked(w, r) // not found: the node says so, in its API's shape
			return
		}
		from, nodes = append(from, "volume "+m.Name), append(nodes, n)
	}
	if len(nodes) == 0 {
		g.toPicked(w, r)
		return
	}
	for i := range nodes {
		if nodes[i] != nodes[0] {
			writeError(w, http.StatusBadRequest, "invalid_request",
				fmt.Sprintf("a sandbox is made on one node, and what it is made from is on several: %s on %s, %s on %s",
					from[0], nodes[0], from[i], nodes[i]))
			return
		}
	}
	n, ok := g.cfg.Nodes.Node(nodes[0])
	if !ok {
		writeError(w, http.StatusGone, "state_lost",
			fmt.Sprintf("%s was on node %s, which is gone: it is lost", from[0], nodes[0]))
		return
	}
	g.forward(w, r, n)
}

// readBody reads r's body (at most maxBody) and gives it back to r, to be
// forwarded as it came.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	r.Body.Close()
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "reading the request: "+err.Error())
		return nil, false
	}
	if len(body) > maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the request is over %d bytes", maxBody))
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength, r.TransferEncoding = int64(len(body)), nil // whole now, however it came
	return body, true
}

// toNewVolume sends a new volume to the node the load picks, unless the
// key has a volume of that name on any node: names are the key's, across
// the cluster, since sandboxes mount volumes by name.
func (g *Gateway) toNewVolume(w http.ResponseWriter, r *http.Request, a api) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(body, &req) == nil && req.Name != "" {
		n, found, err := g.volumeNode(r, a, &volumeLists{}, req.Name)
		if err != nil && err != errAmbiguous {
			writeVolumeError(w, req.Name, err)
			return
		}
		if found || err == errAmbiguous {
			writeError(w, http.StatusConflict, "conflict",
				fmt.Sprintf("the key has a volume named %q already (on node %s)", req.Name, n))
			return
		}
	}
	g.toPicked(w, r)
}

// toVolume sends r to the node of volume ref, an id or a name.
func (g *Gateway) toVolume(w http.ResponseWriter, r *http.Request, a api, ref string) {
	if sandboxid.Volume.Valid(ref) {
		g.toKept(w, r, sandboxid.Volume, ref)
		return
	}
	name, found, err := g.volumeNode(r, a, &volumeLists{}, ref)
	switch {
	case err != nil:
		writeVolumeError(w, ref, err)
	case !found:
		writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no volume %q", ref))
	default:
		n, ok := g.cfg.Nodes.Node(name)
		if !ok {
			writeError(w, http.StatusGone, "state_lost", fmt.Sprintf("volume %s was on node %s, which is gone", ref, name))
			return
		}
		g.forward(w, r, n)
	}
}

var errAmbiguous = errors.New("ambiguous")

// volumeLists are the nodes' lists of a key's volumes, asked for once per
// request however many volumes it names.
type volumeLists struct {
	done  bool
	names map[string][]string // volume name: the nodes that have one
	err   error
}

// volumeNode finds the node of the key's volume ref (an id, or a name
// looked up in every live node's list, with r's key).
func (g *Gateway) volumeNode(r *http.Request, a api, vols *volumeLists, ref string) (node string, found bool, err error) {
	if sandboxid.Volume.Valid(ref) {
		node, found = sandboxid.Volume.Node(ref)
		return node, found, nil
	}
	if !vols.done {
		vols.done, vols.names = true, map[string][]string{}
		for _, n := range g.cfg.Nodes.Nodes() {
			items, err := g.list(r, n, a.volumes, "", a.volumeKey)
			if err != nil {
				var st *statusError
				if !errors.As(err, &st) || st.code >= 500 {
					// A node that does not answer may hold it: say
					// so rather than guess.
					err = fmt.Errorf("node %s did not list its volumes: %w", n.Name, err)
				}
				vols.err = err
				break
			}
			for _, it := range items {
				var v struct{ Name string }
				if json.Unmarshal(it, &v) == nil && v.Name != "" {
					vols.names[v.Name] = append(vols.names[v.Name], n.Name)
				}
			}
		}
	}
	if vols.err != nil {
		return "", false, vols.err
	}
	on := slices.Sorted(slices.Values(vols.names[ref]))
	switch len(on) {
	case 0:
		return "", false, nil
	case 1:
		return on[0], true, nil
	}
	return strings.Join(on, ", "), true, errAmbiguous
}

func writeVolumeError(w http.ResponseWriter, ref string, err error) {
	var st *statusError
	switch {
	case errors.As(err, &st):
		// The client's mistake (a bad key): as the node said it.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(st.code)
		w.Write(st.body)
	case err == errAmbiguous:
		writeError(w, http.StatusConflict, "conflict",
			fmt.Sprintf("the key has volumes named %q on several nodes: use a volume's id", ref))
	default:
		writeError(w, http.StatusBadGateway, "node_unreachable", fmt.Sprintf("looking up volume %q: %v", ref, err))
	}
}

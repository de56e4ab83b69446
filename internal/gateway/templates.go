package gateway

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/http"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/cluster"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
)

// A key's template builds (E2B's build API) live on the node that makes
// them: the build's state, its uploaded files and its log. The gateway
// sends a key's new builds, and what names its templates by name, to one
// node the key picks (keyNode: rendezvous hashing of the key over the
// nodes alive, so a key keeps its node while the nodes stay, and only
// the keys of a node that goes move); and what names a template by its
// id, which names its node (sandboxid.Template), to that node. The
// templates' images go to every node through the cluster's template
// registry (`vivarium serve --template-registry`).

// toKeyNode sends r to the node r's key picks.
func (g *Gateway) toKeyNode(w http.ResponseWriter, r *http.Request, a *api) {
	n, ok := keyNode(g.cfg.Nodes.Nodes(), requestKey(r))
	if !ok {
		a.fail(w, apierr.NoNode, "no node of the cluster is alive")
		return
	}
	g.forward(w, r, a, n)
}

// toTemplate sends r, about the template ref (an id, or a name with or
// without a tag), to the node its id names, else to the key's node.
func (g *Gateway) toTemplate(w http.ResponseWriter, r *http.Request, a *api, ref string) {
	id, _, _ := strings.Cut(ref, ":")
	node, ok := sandboxid.Template.Node(id)
	if !ok {
		g.toKeyNode(w, r, a)
		return
	}
	n, ok := g.cfg.Nodes.Node(node)
	if !ok {
		a.fail(w, apierr.StateLost, fmt.Sprintf("template %s was built on node %s, which is gone: build it again", id, node))
		return
	}
	g.forward(w, r, a, n)
}

// requestKey is the API key r carries: E2B's header, else a bearer
// token; "" for none (the node the empty key picks answers 401).
func requestKey(r *http.Request) string {
	if k := r.Header.Get("X-API-Key"); k != "" {
		return k
	}
	return r.Header.Get("Authorization")
}

// keyNode is the node of nodes that key picks: the highest digest of
// the key and the node's name.
func keyNode(nodes []cluster.Node, key string) (cluster.Node, bool) {
	var best cluster.Node
	var bestScore uint64
	for i, n := range nodes {
		h := sha256.New()
		h.Write([]byte(key))
		h.Write([]byte{0})
		h.Write([]byte(n.Name))
		score := binary.BigEndian.Uint64(h.Sum(nil))
		if i == 0 || score > bestScore {
			best, bestScore = n, score
		}
	}
	return best, len(nodes) > 0
}

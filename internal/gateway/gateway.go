// Package gateway is `vivarium gateway`: one endpoint for a cluster of
// Vivarium nodes (issue 16, docs/kubernetes.md). It keeps no state of its
// own: a new sandbox goes to the node the load picks (cluster.View.Pick),
// and every later request for it to the node its id names
// (internal/sandboxid), if that node's Lease holds; lists are gathered
// from every node. Any number of gateways may run side by side.
//
// What reaches a node is the client's request as it was (its key
// included: the node checks it) and the cluster's token, which nodes
// require of every request, so that only gateways reach them.
package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/cluster"
	"github.com/vivarium-sandbox/vivarium/internal/fairgate"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
)

// TokenHeader carries the cluster's token from a gateway to a node.
const TokenHeader = "Vivarium-Cluster-Token"

// Nodes is what the gateway knows of the nodes (cluster.View).
type Nodes interface {
	Nodes() []cluster.Node
	Node(name string) (cluster.Node, bool)
	Pick() (cluster.Node, func(), bool)
}

// Config of a gateway.
type Config struct {
	Nodes Nodes
	// Token is the cluster's token, sent to nodes with every request.
	Token  string
	Logger *slog.Logger
	// Domain is the preview domain of sandboxes' ports
	// (<port>-<id>.<Domain>); "": none.
	Domain string
}

// Gateway routes requests to nodes.
type Gateway struct {
	cfg   Config
	proxy *httputil.ReverseProxy
	// probes shares out the lookups of signed file URLs (toSigned).
	probes *fairgate.Gate
	// targets are the nodes' addresses parsed (targetOf).
	targets     sync.Map
	targetCount atomic.Int64
}

// New returns a gateway.
func New(cfg Config) *Gateway {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{cfg: cfg, probes: fairgate.New(4, 4, time.Second)}
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			target := pr.In.Context().Value(targetKey{}).(*url.URL)
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host // the node routes ports by Host, as a server on its own does
			pr.SetXForwarded()
			pr.Out.Header.Set(TokenHeader, cfg.Token)
		},
		// Streams (executions' events, process output: no length)
		// go out as they come; the proxy flushes those at once.
		FlushInterval: 0,
		BufferPool:    bufferPool{},
		Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 0, // executions answer when they end
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			node, _ := r.Context().Value(nodeKey{}).(string)
			g.cfg.Logger.Warn("gateway: node unreachable", "node", node, "err", err)
			writeError(w, apierr.NodeUnreachable,
				fmt.Sprintf("node %s did not answer: try again, or, for a sandbox, it may be lost", node))
		},
	}
	return g
}

// bufferPool lends the proxy its copy buffers (httputil.BufferPool).
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (bufferPool) Get() []byte  { return buffers.Get().(*[32 << 10]byte)[:] }
func (bufferPool) Put(b []byte) { buffers.Put((*[32 << 10]byte)(b)) }

type targetKey struct{}
type nodeKey struct{}

// ServeHTTP routes one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" {
		// Alive, and how many nodes it routes to.
		fmt.Fprintf(w, "ok: %d nodes\n", len(g.cfg.Nodes.Nodes()))
		return
	}
	// A sandbox's port: <port>-<id>.<domain>.
	if id, ok := g.portHost(r.Host); ok {
		g.toSandbox(w, r, id)
		return
	}
	p := r.URL.Path
	if path.Clean(p) != p && path.Clean(p)+"/" != p {
		// A route is read from the path as it is: a path that would
		// mean another once cleaned (sb_x/../../other) is refused.
		writeError(w, apierr.BadPath, "the path has . or .. segments, or empty ones")
		return
	}
	switch {
	case p == "/v1/sandboxes" && r.Method == http.MethodPost:
		g.toCreate(w, r, vivarium)
	case (p == "/e2b/sandboxes" || p == "/e2b/v2/sandboxes") && r.Method == http.MethodPost:
		g.toCreate(w, r, e2b)
	case p == "/v1/execute" && r.Method == http.MethodPost,
		p == "/v1/snapshots/import" && r.Method == http.MethodPost:
		g.toPicked(w, r)
	case p == "/v1/sandboxes" && r.Method == http.MethodGet:
		g.gather(w, r, "sandboxes")
	case (p == "/e2b/sandboxes" || p == "/e2b/v2/sandboxes") && r.Method == http.MethodGet:
		g.gather(w, r, "")
	case strings.HasPrefix(p, "/v1/sandboxes/"):
		g.toSandbox(w, r, segment(p, "/v1/sandboxes/"))
	case strings.HasPrefix(p, "/e2b/sandboxes/"):
		g.toSandbox(w, r, segment(p, "/e2b/sandboxes/"))
	case strings.HasPrefix(p, "/e2b/v2/sandboxes/"):
		g.toSandbox(w, r, segment(p, "/e2b/v2/sandboxes/"))
	// Snapshots and volumes live on the node that made them, which their
	// ids name; lists are every node's.
	case p == "/v1/snapshots" && r.Method == http.MethodGet:
		g.gather(w, r, "snapshots")
	case p == "/e2b/snapshots" && r.Method == http.MethodGet:
		g.gather(w, r, "")
	case strings.HasPrefix(p, "/v1/snapshots/"):
		g.toKept(w, r, vivarium.snapshots, segment(p, "/v1/snapshots/"))
	case strings.HasPrefix(p, "/e2b/templates/"):
		// Sandbox.deleteSnapshot (an id or a name); other templates are
		// E2B's cloud, which any node answers with E2B's error.
		if ref := e2bSnapshot(segment(p, "/e2b/templates/")); sandboxid.Snapshot.Valid(ref) || sandboxid.ValidName(ref) {
			g.toKept(w, r, e2b.snapshots, ref)
		} else {
			g.toPicked(w, r)
		}
	case p == "/v1/volumes" && r.Method == http.MethodGet:
		g.gather(w, r, "volumes")
	case p == "/e2b/volumes" && r.Method == http.MethodGet:
		g.gather(w, r, "")
	case p == "/v1/volumes" && r.Method == http.MethodPost:
		g.toNewVolume(w, r, vivarium)
	case p == "/e2b/volumes" && r.Method == http.MethodPost:
		g.toNewVolume(w, r, e2b)
	case strings.HasPrefix(p, "/v1/volumes/"):
		g.toKept(w, r, vivarium.volumes, segment(p, "/v1/volumes/"))
	case strings.HasPrefix(p, "/e2b/volumes/"):
		g.toKept(w, r, e2b.volumes, segment(p, "/e2b/volumes/"))
	case strings.HasPrefix(p, "/e2b/volumecontent/"):
		// The content API names a volume by id only (with its token).
		if id := segment(p, "/e2b/volumecontent/"); sandboxid.Volume.Valid(id) {
			g.toKept(w, r, e2b.volumes, id)
		} else {
			writeError(w, apierr.VolumeNotFound, fmt.Sprintf("no volume %q in this cluster", id))
		}
	case p == "/files":
		g.toSigned(w, r)
	case p == "/mcp":
		// MCP over HTTP: a new session on the node the load picks, its
		// later requests to the node its id names.
		if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
			g.toSession(w, r, sid)
		} else {
			g.toPicked(w, r)
		}
	case strings.HasPrefix(p, "/e2b/sandbox/") || p == "/e2b/sandbox":
		// E2B's envd and interpreter: the sandbox in a header.
		g.toSandbox(w, r, r.Header.Get("E2b-Sandbox-Id"))
	default:
		writeError(w, apierr.Unsupported,
			fmt.Sprintf("%s %s is not served through the gateway yet (docs/kubernetes.md says what is)", r.Method, p))
	}
}

// segment is the path segment after prefix.
func segment(p, prefix string) string {
	s, _, _ := strings.Cut(strings.TrimPrefix(p, prefix), "/")
	return s
}

// portHost reads <port>-<id>.<domain>.
func (g *Gateway) portHost(host string) (string, bool) {
	if g.cfg.Domain == "" {
		return "", false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+g.cfg.Domain)
	if !ok {
		return "", false
	}
	_, id, ok := strings.Cut(label, "-")
	return id, ok && sandboxid.Valid(id)
}

// toSandbox sends r to the node of sandbox id.
func (g *Gateway) toSandbox(w http.ResponseWriter, r *http.Request, id string) {
	name, ok := sandboxid.Node(id)
	if !ok {
		writeError(w, apierr.NotFound, fmt.Sprintf("no sandbox %q in this cluster", id))
		return
	}
	n, ok := g.cfg.Nodes.Node(name)
	if !ok {
		// Its node is gone (its Lease expired): what it held is lost.
		writeError(w, apierr.StateLost,
			fmt.Sprintf("sandbox %s was on node %s, which is gone: its state is lost", id, name))
		return
	}
	g.forward(w, r, n)
}

// toSession sends r to the node of MCP session sid.
func (g *Gateway) toSession(w http.ResponseWriter, r *http.Request, sid string) {
	name, ok := sandboxid.SessionNode(sid)
	if !ok {
		writeError(w, apierr.NotFound, "no such MCP session in this cluster")
		return
	}
	n, ok := g.cfg.Nodes.Node(name)
	if !ok {
		writeError(w, apierr.NotFound, fmt.Sprintf("the MCP session was on node %s, which is gone: start a new one", name))
		return
	}
	g.forward(w, r, n)
}

// toPicked sends r (a new sandbox, a one-shot) to the node the load picks.
func (g *Gateway) toPicked(w http.ResponseWriter, r *http.Request) {
	n, done, ok := g.cfg.Nodes.Pick()
	if !ok {
		writeError(w, apierr.NoNode, "no node of the cluster is alive")
		return
	}
	defer done()
	g.forward(w, r, n)
}

func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, n cluster.Node) {
	target, ok := g.targetOf(n.Addr)
	if !ok {
		writeError(w, apierr.NodeUnreachable, fmt.Sprintf("node %s has no usable address", n.Name))
		return
	}
	ctx := context.WithValue(context.WithValue(r.Context(), targetKey{}, target), nodeKey{}, n.Name)
	// A stream (Connect's server streams: process.Start, envd's
	// watchers) may answer before its request's body has all come: once
	// the answer's headers are flushed, an HTTP/1 server stops the body's
	// reads unless told that the handler reads and writes at once, and
	// the node's connection, still writing the request, was torn down
	// mid-answer (seen under load: E2B's commands.run cut, "terminated").
	http.NewResponseController(w).EnableFullDuplex()
	g.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// targetOf parses a node's address, once per address (read only, shared).
func (g *Gateway) targetOf(addr string) (*url.URL, bool) {
	if u, ok := g.targets.Load(addr); ok {
		return u.(*url.URL), true
	}
	u, err := url.Parse(addr)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, false
	}
	if g.targetCount.Add(1) > 4096 { // addresses gone: start again
		g.targets.Clear()
		g.targetCount.Store(0)
	}
	g.targets.Store(addr, u)
	return u, true
}

// gather asks every live node for the list and answers them together:
// {"sandboxes": [...]} under key, or a bare array where key is "" (E2B's
// list). A node that fails is left out and named in a header.
func (g *Gateway) gather(w http.ResponseWriter, r *http.Request, key string) {
	nodes := g.cfg.Nodes.Nodes()
	type answer struct {
		items []json.RawMessage
		err   error
	}
	answers := make([]answer, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			answers[i].items, answers[i].err = g.list(r, n, r.URL.Path, r.URL.RawQuery, key)
		})
	}
	wg.Wait()
	var all []json.RawMessage
	var failed []string
	for i, a := range answers {
		if a.err != nil {
			var st *statusError
			if errors.As(a.err, &st) && st.code < 500 {
				// The client's mistake (a bad key, a bad query): as
				// the node said it.
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(st.code)
				w.Write(st.body)
				return
			}
			failed = append(failed, nodes[i].Name)
			g.cfg.Logger.Warn("gateway: a node's list failed", "node", nodes[i].Name, "err", a.err)
			continue
		}
		all = append(all, a.items...)
	}
	if len(failed) > 0 {
		w.Header().Set("Vivarium-Nodes-Missing", strings.Join(failed, ","))
	}
	if all == nil {
		all = []json.RawMessage{}
	}
	var body any = all
	if key != "" {
		body = map[string]any{key: all}
	}
	writeJSON(w, http.StatusOK, body)
}

type statusError struct {
	code int
	body []byte
}

func (e *statusError) Error() string { return fmt.Sprintf("status %d", e.code) }

// list is one node's list at path, with r's key.
func (g *Gateway) list(r *http.Request, n cluster.Node, path, query, key string) ([]json.RawMessage, error) {
	u, err := url.Parse(n.Addr)
	if err != nil {
		return nil, err
	}
	u.Path, u.RawQuery = path, query
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"Authorization", "X-Api-Key", "Accept"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	req.Header.Set(TokenHeader, g.cfg.Token)
	resp, err := g.proxy.Transport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &statusError{code: resp.StatusCode, body: b}
	}
	var items []json.RawMessage
	if key == "" {
		err = json.Unmarshal(b, &items)
	} else {
		var m map[string][]json.RawMessage
		err = json.Unmarshal(b, &m)
		items = m[key]
	}
	return items, err
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	var b bytes.Buffer
	json.NewEncoder(&b).Encode(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(b.Bytes())
}

// writeError answers an error of kind k (apierr's table) with msg, as a
// node answers its own.
func writeError(w http.ResponseWriter, k *apierr.Kind, msg string) {
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e.Error.Code, e.Error.Message = k.Code, msg
	writeJSON(w, k.Status, e)
}

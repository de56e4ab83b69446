// Package gateway is `vivarium gateway`: one endpoint for a cluster of
// Vivarium nodes (issue 16, docs/kubernetes.md). It keeps no state of its
// own: a new sandbox goes to the node the load picks (cluster.View.Pick),
// and every later request for it to the node its id names
// (internal/sandboxid), if that node's Lease holds; lists are gathered
// from every node. Any number of gateways may run side by side.
//
// The routes are the nodes' as their adapters declare them (httpapi's and
// e2b's, package route), each with how it is forwarded: the gateway
// derives its routing from those tables (routes.go) and has none of its
// own.
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
	"maps"
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
	"github.com/vivarium-sandbox/vivarium/internal/e2b"
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
	// mux routes a request by its path (routes.go).
	mux *http.ServeMux
}

// New returns a gateway.
func New(cfg Config) *Gateway {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{cfg: cfg, probes: fairgate.New(4, 4, time.Second)}
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(hopKey{}).(*hop).target)
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
			h := r.Context().Value(hopKey{}).(*hop)
			g.cfg.Logger.Warn("gateway: node unreachable", "node", h.node, "err", err)
			h.api.fail(w, apierr.NodeUnreachable,
				fmt.Sprintf("node %s did not answer: try again, or, for a sandbox, it may be lost", h.node))
		},
	}
	g.mux = g.routes()
	return g
}

// bufferPool lends the proxy its copy buffers (httputil.BufferPool).
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

func (bufferPool) Get() []byte  { return buffers.Get().(*[32 << 10]byte)[:] }
func (bufferPool) Put(b []byte) { buffers.Put((*[32 << 10]byte)(b)) }

// A hop is where forward sends a request, for the proxy.
type hop struct {
	target *url.URL
	node   string
	api    *api // the API the request is of, in whose shape its errors are
}

type hopKey struct{}

// ServeHTTP routes one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A sandbox's port: <port>-<id>.<domain>.
	if id, ok := g.portHost(r.Host); ok {
		g.toSandbox(w, r, &vivariumAPI, id)
		return
	}
	p := r.URL.Path
	if path.Clean(p) != p && path.Clean(p)+"/" != p {
		// A route is read from the path as it is: a path that would
		// mean another once cleaned (sb_x/../../other) is refused.
		apiOf(p).fail(w, apierr.BadPath, "the path has . or .. segments, or empty ones")
		return
	}
	if r.URL.RawPath != "" && strings.HasPrefix(p, e2b.Prefix+"/") {
		// E2B's API routes its path as decoded (e2b.Server.ServeHTTP),
		// an escaped "/" as a "/": so does the gateway, or the node
		// would serve another route than the one it was chosen for.
		r2, u := *r, *r.URL
		u.RawPath = ""
		r2.URL = &u
		r = &r2
	}
	g.mux.ServeHTTP(w, r)
}

// apiOf is the API a path is of, by its prefix.
func apiOf(p string) *api {
	if strings.HasPrefix(p, e2b.Prefix+"/") || p == e2b.SignedFilesPath {
		return &e2bAPI
	}
	return &vivariumAPI
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
func (g *Gateway) toSandbox(w http.ResponseWriter, r *http.Request, a *api, id string) {
	name, ok := sandboxid.Node(id)
	if !ok {
		a.fail(w, apierr.NotFound, fmt.Sprintf("no sandbox %q in this cluster", id))
		return
	}
	n, ok := g.cfg.Nodes.Node(name)
	if !ok {
		// Its node is gone (its Lease expired): what it held is lost.
		a.fail(w, apierr.StateLost,
			fmt.Sprintf("sandbox %s was on node %s, which is gone: its state is lost", id, name))
		return
	}
	g.forward(w, r, a, n)
}

// toSession sends r to the node of MCP session sid.
func (g *Gateway) toSession(w http.ResponseWriter, r *http.Request, sid string) {
	name, ok := sandboxid.SessionNode(sid)
	if !ok {
		vivariumAPI.fail(w, apierr.NotFound, "no such MCP session in this cluster")
		return
	}
	n, ok := g.cfg.Nodes.Node(name)
	if !ok {
		vivariumAPI.fail(w, apierr.NotFound, fmt.Sprintf("the MCP session was on node %s, which is gone: start a new one", name))
		return
	}
	g.forward(w, r, &vivariumAPI, n)
}

// toPicked sends r (a new sandbox, a one-shot) to the node the load picks.
func (g *Gateway) toPicked(w http.ResponseWriter, r *http.Request, a *api) {
	n, done, ok := g.cfg.Nodes.Pick()
	if !ok {
		a.fail(w, apierr.NoNode, "no node of the cluster is alive")
		return
	}
	defer done()
	g.forward(w, r, a, n)
}

// forward sends r, of API a, to node n.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, a *api, n cluster.Node) {
	target, ok := g.targetOf(n.Addr)
	if !ok {
		a.fail(w, apierr.NodeUnreachable, fmt.Sprintf("node %s has no usable address", n.Name))
		return
	}
	ctx := context.WithValue(r.Context(), hopKey{}, &hop{target: target, node: n.Name, api: a})
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

// gather asks every live node for what r asks and answers them joined:
// the arrays, or the objects, under field list of each node's answer
// ({"sandboxes": [...]}), or the bare arrays where list is "" (E2B's
// lists). A node that fails is left out and named in a header.
func (g *Gateway) gather(w http.ResponseWriter, r *http.Request, list string) {
	nodes := g.cfg.Nodes.Nodes()
	type answer struct {
		part json.RawMessage
		err  error
	}
	answers := make([]answer, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			answers[i].part, answers[i].err = g.list(r, n, r.URL.Path, r.URL.RawQuery, list)
		})
	}
	wg.Wait()
	items := []json.RawMessage{}
	var fields map[string]json.RawMessage // where the nodes answer objects
	var failed []string
	for i, a := range answers {
		var st *statusError
		if errors.As(a.err, &st) && st.code < 500 {
			// The client's mistake (a bad key, a bad query): as the
			// node said it.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(st.code)
			w.Write(st.body)
			return
		}
		if a.err == nil {
			var arr []json.RawMessage
			var obj map[string]json.RawMessage
			if a.err = json.Unmarshal(a.part, &arr); a.err == nil {
				items = append(items, arr...)
				continue
			}
			if a.err = json.Unmarshal(a.part, &obj); a.err == nil {
				if fields == nil {
					fields = map[string]json.RawMessage{}
				}
				maps.Copy(fields, obj)
				continue
			}
		}
		failed = append(failed, nodes[i].Name)
		g.cfg.Logger.Warn("gateway: a node's list failed", "node", nodes[i].Name, "err", a.err)
	}
	if len(failed) > 0 {
		w.Header().Set("Vivarium-Nodes-Missing", strings.Join(failed, ","))
	}
	var body any = items
	if fields != nil {
		body = fields
	}
	if list != "" {
		body = map[string]any{list: body}
	}
	writeJSON(w, http.StatusOK, body)
}

type statusError struct {
	code int
	body []byte
}

func (e *statusError) Error() string { return fmt.Sprintf("status %d", e.code) }

// list is one node's answer at path, with r's key: its field list, or
// all of it where list is "".
func (g *Gateway) list(r *http.Request, n cluster.Node, path, query, list string) (json.RawMessage, error) {
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
	if list == "" {
		return b, nil
	}
	var m map[string]json.RawMessage
	err = json.Unmarshal(b, &m)
	return m[list], err
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	var b bytes.Buffer
	json.NewEncoder(&b).Encode(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(b.Bytes())
}

// fail answers an error of kind k (apierr's table) with msg, in a's
// shape, as a node answers its own: Vivarium's
// {"error": {"code": "state_lost", "message": ...}} at the kind's
// status, or E2B's {"code": 410, "message": ...} at its E2B status,
// which E2B's SDKs raise by.
func (a *api) fail(w http.ResponseWriter, k *apierr.Kind, msg string) {
	if a.e2b {
		writeE2BError(w, k.E2B(), msg)
		return
	}
	var e struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	e.Error.Code, e.Error.Message = k.Code, msg
	writeJSON(w, k.Status, e)
}

// writeE2BError answers E2B's error body (e2b's apiError).
func writeE2BError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

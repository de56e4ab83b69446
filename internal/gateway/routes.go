package gateway

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/e2b"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/route"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
)

// The gateway routes what the nodes serve, as the adapters that serve it
// declare it (package route): Vivarium's API (httpapi.ClusterRoutes) and
// E2B's (e2b.ClusterRoutes), each route to the node its Forward says; and
// MCP's one route, /mcp. Anything else answers 501: the gateway is not an
// open proxy.

// mcpPath is where `vivarium serve` serves MCP over HTTP.
const mcpPath = "/mcp"

// routes is the gateway's mux, derived from the adapters' routes.
func (g *Gateway) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for _, apis := range []struct {
		a      *api
		routes []route.Route
	}{{&vivariumAPI, httpapi.ClusterRoutes()}, {&e2bAPI, e2b.ClusterRoutes()}} {
		for _, rt := range apis.routes {
			h, err := g.handler(rt, apis.a)
			if err != nil {
				panic(err) // a route added to an adapter without a Forward the gateway knows
			}
			mux.Handle(rt.Pattern(), h)
		}
	}
	// MCP over HTTP: a new session on the node the load picks, its
	// later requests to the node its id names.
	mux.HandleFunc(mcpPath, func(w http.ResponseWriter, r *http.Request) {
		if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
			g.toSession(w, r, sid)
		} else {
			g.toPicked(w, r, &vivariumAPI)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		vivariumAPI.fail(w, apierr.Unsupported,
			fmt.Sprintf("%s %s is not served through the gateway (docs/kubernetes.md says what is)", r.Method, r.URL.Path))
	})
	return mux
}

// handler forwards rt's requests, of API a, as its Forward says.
func (g *Gateway) handler(rt route.Route, a *api) (http.HandlerFunc, error) {
	id := rt.ID()
	if id == "" && (rt.Forward == route.Sandbox || rt.Forward == route.Snapshot || rt.Forward == route.Template ||
		rt.Forward == route.TemplateOrSnapshot || rt.Forward == route.Volume || rt.Forward == route.VolumeID) {
		return nil, fmt.Errorf("gateway: route %q is forwarded by the id in its path, and its path has none", rt.Pattern())
	}
	switch rt.Forward {
	case route.Local:
		if rt.Pattern() == "GET /healthz" {
			// The gateway's own: alive, and how many nodes it routes to.
			return func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "ok: %d nodes\n", len(g.cfg.Nodes.Nodes()))
			}, nil
		}
		return func(w http.ResponseWriter, r *http.Request) {
			a.fail(w, apierr.Unsupported,
				fmt.Sprintf("%s is each node's own, not the cluster's: ask the nodes", r.URL.Path))
		}, nil
	case route.Pick:
		return func(w http.ResponseWriter, r *http.Request) { g.toPicked(w, r, a) }, nil
	case route.Create:
		return func(w http.ResponseWriter, r *http.Request) { g.toCreate(w, r, a) }, nil
	case route.Sandbox:
		return func(w http.ResponseWriter, r *http.Request) { g.toSandbox(w, r, a, r.PathValue(id)) }, nil
	case route.SandboxHeader:
		return func(w http.ResponseWriter, r *http.Request) { g.toSandbox(w, r, a, r.Header.Get("E2b-Sandbox-Id")) }, nil
	case route.Snapshot:
		return func(w http.ResponseWriter, r *http.Request) {
			ref := a.snapshotRef(r.PathValue(id))
			if ref == "" {
				// Not a snapshot (E2B's own templates): any node
				// says what it is.
				g.toPicked(w, r, a)
				return
			}
			g.toKept(w, r, a, a.snapshots, ref)
		}, nil
	case route.Key:
		return func(w http.ResponseWriter, r *http.Request) { g.toKeyNode(w, r, a) }, nil
	case route.Template:
		return func(w http.ResponseWriter, r *http.Request) { g.toTemplate(w, r, a, r.PathValue(id)) }, nil
	case route.TemplateOrSnapshot:
		return func(w http.ResponseWriter, r *http.Request) {
			v := r.PathValue(id)
			toTemplate := func() { g.toTemplate(w, r, a, v) }
			tplID, _, _ := strings.Cut(v, ":")
			if ref := a.snapshotRef(v); ref != "" && !sandboxid.Template.Valid(tplID) {
				g.toKeptOr(w, r, a, a.snapshots, ref, toTemplate)
				return
			}
			toTemplate()
		}, nil
	case route.Volume:
		return func(w http.ResponseWriter, r *http.Request) { g.toKept(w, r, a, a.volumes, r.PathValue(id)) }, nil
	case route.VolumeID:
		return func(w http.ResponseWriter, r *http.Request) {
			if v := r.PathValue(id); !sandboxid.Volume.Valid(v) {
				a.fail(w, apierr.VolumeNotFound, fmt.Sprintf("no volume %q in this cluster", v))
				return
			}
			g.toKept(w, r, a, a.volumes, r.PathValue(id))
		}, nil
	case route.NewVolume:
		return func(w http.ResponseWriter, r *http.Request) { g.toNewVolume(w, r, a) }, nil
	case route.Signed:
		return func(w http.ResponseWriter, r *http.Request) { g.toSigned(w, r, a) }, nil
	}
	if list, ok := rt.Forward.List(); ok {
		return func(w http.ResponseWriter, r *http.Request) { g.gather(w, r, list) }, nil
	}
	return nil, fmt.Errorf("gateway: route %q is forwarded %v, which the gateway does not know", rt.Pattern(), rt.Forward)
}

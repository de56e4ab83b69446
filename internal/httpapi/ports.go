package httpapi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/portproxy"
	"github.com/vivarium-sandbox/vivarium/internal/route"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// A sandbox's ports (see package portproxy): POST .../ports/{port} hands
// the owner a port token and the URLs it opens; the path form
// /v1/sandboxes/{id}/ports/{port}/... proxies to the port with that token
// (never the API key, which is not the sandbox's to see, and never
// without one).

// portRoutes is the API's side of ports.
type portRoutes struct {
	proxy  *portproxy.Proxy
	domain string // the host form's domain; "": none
}

// portsPath is the path form; {path...} is what the sandbox is asked for.
const portsPath = "/v1/sandboxes/{id}/ports/{port}/{path...}"

// portRoute is the path form's route, which is not an operation of the
// OpenAPI document (Routes): what it serves is the sandbox's.
var portRoute = route.Route{Path: portsPath, Forward: route.Sandbox}

// SetPortDomain gives the URLs of the host form, <port>-<id>.<domain>,
// in the answers of POST .../ports/{port} (vivarium serve --domain).
func (s *Server) SetPortDomain(domain string) { s.ports.domain = domain }

func (s *Server) routePorts() {
	s.ports.proxy = portproxy.New(s.log)
	s.mux.HandleFunc(portsPath, s.servePort)
}

// portAccess is what POST /v1/sandboxes/{id}/ports/{port} answers.
type portAccess struct {
	Port    int    `json:"port"`
	Token   string `json:"token" doc:"opens this port of this sandbox only: the Vivarium-Port-Token header, or ?vivarium_port_token= in a link"`
	PathURL string `json:"path_url" doc:"the port through this API (the path form); send the token in the header"`
	Host    string `json:"host,omitempty" doc:"<port>-<id>.<domain>, when the server has a --domain"`
	URL     string `json:"url,omitempty" doc:"a link to the port on its own host, token included (a browser's first visit turns it into a cookie)"`
}

func (s *Server) portToken(w http.ResponseWriter, r *http.Request) {
	port, err := pathPort(r)
	if err != nil {
		s.fail(w, err)
		return
	}
	var req portTokenRequest
	if !decode(w, r, &req) {
		return
	}
	id := r.PathValue("id")
	tok, err := s.svc.PortToken(owner(r), id, port)
	if req.Rotate {
		tok, err = s.svc.RotatePortToken(owner(r), id, port)
	}
	if err != nil {
		s.fail(w, err)
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	a := portAccess{Port: port, Token: tok, PathURL: fmt.Sprintf("%s://%s/v1/sandboxes/%s/ports/%d/", scheme, r.Host, id, port)}
	if s.ports.domain != "" {
		a.Host = fmt.Sprintf("%d-%s.%s", port, id, s.ports.domain)
		a.URL = fmt.Sprintf("%s://%s/?%s=%s", scheme, a.Host, portproxy.TokenParam, tok)
	}
	writeJSON(w, http.StatusOK, a)
}

func pathPort(r *http.Request) (int, error) {
	ps := r.PathValue("port")
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strings.HasPrefix(ps, "0") || strings.HasPrefix(ps, "+") {
		return 0, fmt.Errorf("%w: port %.10q is not a TCP port (1-65535)", sandbox.ErrInvalidSpec, ps)
	}
	return port, nil
}

// servePort is the path form: the port token in the Vivarium-Port-Token
// header or the vivarium_port_token parameter (no cookie: this origin is
// the API's, shared by every sandbox).
func (s *Server) servePort(w http.ResponseWriter, r *http.Request) {
	port, err := pathPort(r)
	if err != nil {
		portproxy.WriteError(w, err)
		return
	}
	id := r.PathValue("id")
	var who string
	for _, c := range portproxy.Credentials(r) {
		if c.From != "header" && c.From != "query" {
			continue
		}
		if o, ok := s.svc.PortTokenOwner(c.Value, id, port); ok {
			who = o
			break
		}
	}
	if who == "" && !s.svc.Known(id) {
		portproxy.WriteError(w, service.ErrNotFound)
		return
	}
	if who == "" {
		portproxy.WriteError(w, portproxy.Unauthorized("a token for this port of this sandbox is required: the "+
			portproxy.TokenHeader+" header or ?"+portproxy.TokenParam+"= (POST /v1/sandboxes/{id}/ports/{port} makes one)"))
		return
	}
	dial := func(ctx context.Context) (net.Conn, error) { return s.svc.DialPort(ctx, who, id, port) }
	s.ports.proxy.Serve(w, r, dial, portproxy.Target{Path: "/" + r.PathValue("path"), Host: s.svc.PortHost(who, id, port),
		Isolate: true})
}

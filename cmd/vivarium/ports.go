package main

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/e2b"
	"github.com/vivarium-sandbox/vivarium/internal/portproxy"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// withPorts serves sandboxes' ports on their own hosts,
// <port>-<id>.<domain> (--domain), in front of everything else: a port
// token opens one port, E2B's traffic token (in its header only) every
// port of its sandbox. Without a domain there is no host form; the path
// form (/v1/sandboxes/{id}/ports/{port}/) is the API's.
func withPorts(next http.Handler, svc *service.Service, e *e2b.Server, domain string, log *slog.Logger) http.Handler {
	if domain == "" {
		return next
	}
	hosts := &portproxy.Hosts{
		Domain: domain,
		Proxy:  portproxy.New(log),
		Authorize: func(c portproxy.Credential, id string, port int) (string, bool) {
			if c.From == "e2b-header" {
				// A token that also opens the sandbox's API: never
				// from a link or a cookie.
				return e.TrafficTokenOwner(c.Value, id)
			}
			return svc.PortTokenOwner(c.Value, id, port)
		},
		Dial:  svc.DialPort,
		Host:  svc.PortHost,
		Known: svc.Known,
		Next:  next,
	}
	return &e2bHosts{domain: domain, hosts: hosts, next: next}
}

// e2bHosts serves E2B's own hosts under the domain, for SDKs configured by
// E2B_DOMAIN alone (behind TLS, as E2B's SDKs use https then): api.DOMAIN
// is the control plane, 49983-<id>.DOMAIN and 49999-<id>.DOMAIN are envd
// and the code interpreter of sandbox <id>, never ports of the sandbox.
// They are handed to the server's handler at the E2B prefix, which
// authenticates them as when E2B_API_URL and E2B_SANDBOX_URL are set.
type e2bHosts struct {
	domain string
	hosts  http.Handler // every other host of the domain
	next   http.Handler
}

func (h *e2bHosts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if portproxy.IsHost(r.Host, "api", h.domain) {
		h.next.ServeHTTP(w, withPath(r, e2bPrefix+r.URL.Path))
		return
	}
	if id, port, ok := portproxy.ParseHost(r.Host, h.domain); ok && (port == 49983 || port == 49999) {
		if got := r.Header.Get("E2b-Sandbox-Id"); got != "" && got != id {
			http.Error(w, "the E2b-Sandbox-Id header names another sandbox than the host", http.StatusBadRequest)
			return
		}
		r = withPath(r, e2bPrefix+"/sandbox"+r.URL.Path)
		r.Header.Set("E2b-Sandbox-Id", id)
		r.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
		h.next.ServeHTTP(w, r)
		return
	}
	h.hosts.ServeHTTP(w, r)
}

// withPath is r (a copy) asking for path.
func withPath(r *http.Request, path string) *http.Request {
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = path, ""
	return r2
}

// checkDomain validates --domain: a host name, with a port if the server
// is reached on one; not an address (a wildcard DNS name must point at
// the server).
func checkDomain(d string) error {
	if d == "" {
		return nil
	}
	host := d
	if h, _, err := net.SplitHostPort(d); err == nil {
		host = h
	}
	if net.ParseIP(host) != nil || !strings.Contains(host, ".") && host != "localhost" ||
		strings.ContainsAny(host, "/ _*") || strings.HasPrefix(host, ".") || strings.HasSuffix(host, ".") {
		return errors.New("--domain must be a DNS name (with :PORT if the server is reached on one), such as preview.example.com, " +
			"whose subdomains *.preview.example.com all point at this server")
	}
	return nil
}

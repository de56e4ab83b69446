package main

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
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
	return &portproxy.Hosts{
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
		Dial: svc.DialPort,
		Next: next,
	}
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

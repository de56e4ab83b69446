package httpapi

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
)

// CheckHost refuses, on a connection to a loopback address, a request
// whose Host is not a loopback name (localhost, 127.0.0.1, [::1], with
// any port), one of allowed, or under domain (the server's --domain: its
// API host and sandboxes' hosts). A web page can point a name of its own
// at 127.0.0.1 (DNS rebinding) and then read what a server on loopback
// answers as if it were its own origin: its GETs carry no Origin for
// RefuseBrowsers to refuse, and a server with --dev asks for no key. The
// page's requests name its own host, which this refuses. Connections to
// other addresses are not checked: there, names are the operator's to
// give.
func CheckHost(h http.Handler, allowed []string, domain string) http.Handler {
	domainHost := strings.ToLower(hostOnly(domain))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		if local == nil || !loopbackAddr(local.String()) {
			h.ServeHTTP(w, r)
			return
		}
		host := strings.ToLower(hostOnly(r.Host))
		ok := host == "localhost" || strings.HasSuffix(host, ".localhost") || loopbackAddr(host) ||
			slices.Contains(allowed, host) ||
			(domainHost != "" && (host == domainHost || strings.HasSuffix(host, "."+domainHost)))
		if !ok {
			writeError(w, apierr.Forbidden, fmt.Sprintf("this server listens on loopback and answers requests "+
				"to localhost, 127.0.0.1 or [::1] only, not to %q (a web page may have pointed a name of its own at it); "+
				"an operator allows a name with --allow-host", hostOnly(r.Host)))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// hostOnly is a Host header's (or an address's) host, without its port
// or an IPv6 literal's brackets.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]")
}

// loopbackAddr reports whether an address (host or host:port) is a
// loopback IP.
func loopbackAddr(addr string) bool {
	ip := net.ParseIP(hostOnly(addr))
	return ip != nil && ip.IsLoopback()
}

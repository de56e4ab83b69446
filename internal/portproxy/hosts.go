package portproxy

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// Hosts serves the host form: a request for <port>-<id>.<Domain> goes to
// that port of that sandbox, every other request to Next. It must wrap
// the server's handler from the outside (before httpapi.RefuseBrowsers):
// each preview host is an origin of its own, whose pages make requests
// to themselves.
type Hosts struct {
	// Domain is the preview domain, host[:port] (the port is ignored
	// when matching).
	Domain string
	Proxy  *Proxy
	// Authorize returns the owner c opens port of sandbox id for.
	Authorize func(c Credential, id string, port int) (owner string, ok bool)
	// Dial connects to port of an owner's sandbox (service.DialPort).
	Dial func(ctx context.Context, owner, id string, port int) (net.Conn, error)
	// Host, when set, is the Host header that port of an owner's sandbox
	// gets ("": the client's; service.PortHost).
	Host func(owner, id string, port int) string
	// Known, when set, says whether sandbox id lives: a request no token
	// opens is then 404 for a sandbox that does not, as a request with
	// its token was (service.Known; sandboxes' ids are not secrets).
	Known func(id string) bool
	Next  http.Handler
}

func (h *Hosts) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, ok := ParseHost(r.Host, h.Domain)
	if !ok {
		h.Next.ServeHTTP(w, r)
		return
	}
	var owner string
	var cred Credential
	cookieRefused := false
	for _, c := range Credentials(r) {
		if c.From == "cookie" && !cookieAllowed(r) {
			cookieRefused = true
			continue
		}
		if o, ok := h.Authorize(c, id, port); ok {
			owner, cred = o, c
			break
		}
	}
	if owner == "" && h.Known != nil && !h.Known(id) {
		WriteError(w, service.ErrNotFound)
		return
	}
	if owner == "" {
		// 403, as E2B's proxy answers a request without its token.
		msg := "a token for this port of this sandbox is required: the " + TokenHeader +
			" header (or E2B's " + TrafficHeader + "), or ?" + TokenParam + "= in a link"
		if cookieRefused {
			msg += "; the preview's cookie opens it only to its own pages and to links followed, " +
				"not to requests from other pages (another preview's among them)"
		}
		WriteError(w, Forbidden(msg))
		return
	}
	if cred.From == "query" && (r.Method == http.MethodGet || r.Method == http.MethodHead) && !isUpgrade(r) {
		// A link to a preview: the token moves into a cookie of this
		// host, and out of the address bar, history and Referer.
		http.SetCookie(w, &http.Cookie{Name: TokenCookie, Value: cred.Value, Path: "/", HttpOnly: true,
			Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
		q := r.URL.Query()
		q.Del(TokenParam)
		// Never //host or /\host: not a redirect to elsewhere.
		loc := url.URL{Path: "/" + strings.TrimLeft(r.URL.Path, "/\\"), RawQuery: q.Encode()}
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, loc.RequestURI(), http.StatusSeeOther)
		return
	}
	dial := func(ctx context.Context) (net.Conn, error) { return h.Dial(ctx, owner, id, port) }
	t := Target{Path: r.URL.Path, Token: cred.Value}
	if h.Host != nil {
		t.Host = h.Host(owner, id, port)
	}
	h.Proxy.Serve(w, r, dial, t)
}

package pkgindex

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
)

// ErrRefusedAddress: the relay was sent (by a page's link, a redirect or
// a name's address) somewhere it does not fetch from.
var ErrRefusedAddress = errors.New("the package relay does not fetch from there")

// relay is how the index reaches an upstream index, from the host's own
// network: what the upstream says (its pages' links, its redirects, its
// names' addresses) must not turn the server into a way to reach the
// host's loopback, its cloud metadata service or its private network.
//
// Every connection is checked when it is made, on the address actually
// dialled (a net.Dialer Control), so that no name, redirect or DNS answer
// gets past it:
//  1. The configured index's own host and port (the origin) may be at any
//     loopback or private address: an operator's local mirror is there,
//     and its name is the operator's.
//  2. Every other connection (a file on another host, as PyPI's are on
//     files.pythonhosted.org; where a download is redirected) goes to a
//     public address only.
//  3. Link-local (169.254.0.0/16 and cloud metadata, fe80::/10),
//     unspecified, multicast and broadcast addresses are never dialled,
//     the origin's included.
//
// Redirects: a page of the index is followed only within its origin (a
// hostile index cannot send the relay to another host for its pages); a
// file may be redirected to another host (registries such as GitLab's
// and Artifactory's hand files out from object storage), over https if
// the link was, to a public address by rule 2, and pip checks its SHA-256
// against the page's.
//
// Behind an HTTP proxy of the server's environment (HTTPS_PROXY), the
// proxy resolves names: the relay dials the proxy (rule 1 applies to it,
// the operator's) and refuses only literal addresses that rule 2 refuses.
type relay struct {
	origin   string   // the configured index's host:port
	upstream *url.URL // the configured index

	mu      sync.Mutex
	proxies map[string]bool // host:port of the environment's proxies seen
}

func newRelay(upstream *url.URL) *relay {
	return &relay{origin: hostPort(upstream), upstream: upstream, proxies: map[string]bool{}}
}

// hostPort is a URL's host and port as the transport dials them (the
// scheme's port when none is given).
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// client is the relay's HTTP client.
func (r *relay) client() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = r.proxy
	t.DialContext = r.dial
	return &http.Client{Transport: t, Timeout: 5 * time.Minute, CheckRedirect: r.checkRedirect}
}

// proxy is the environment's proxy for req, if any, remembered as the
// operator's; a literal address rule 2 refuses is refused before it is
// sent there.
func (r *relay) proxy(req *http.Request) (*url.URL, error) {
	p, err := http.ProxyFromEnvironment(req)
	if err != nil || p == nil {
		return p, err
	}
	if hostPort(req.URL) != r.origin {
		if a, err := netip.ParseAddr(req.URL.Hostname()); err == nil {
			if err := r.allowed(a, false); err != nil {
				return nil, err
			}
		}
	}
	r.mu.Lock()
	r.proxies[hostPort(p)] = true
	r.mu.Unlock()
	return p, nil
}

// dial connects to addr (host:port as the URL or proxy names it), to an
// address the rules allow.
func (r *relay) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	key := net.JoinHostPort(strings.ToLower(host), port)
	r.mu.Lock()
	operators := key == r.origin || r.proxies[key]
	r.mu.Unlock()
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
		ControlContext: func(_ context.Context, _, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s is not an address", ErrRefusedAddress, address)
			}
			if err := r.allowed(ap.Addr(), operators); err != nil {
				return fmt.Errorf("%w (for %s)", err, host)
			}
			return nil
		}}
	return d.DialContext(ctx, network, addr)
}

// allowed applies rules 1 to 3 to an address; operators: it is the
// origin's, or a proxy's.
func (r *relay) allowed(a netip.Addr, operators bool) error {
	why, local := netpolicy.NonPublic(a)
	if why == "" || operators && local {
		return nil
	}
	if local {
		why += ", and only the configured index may be on one"
	}
	return fmt.Errorf("%w: %s is %s", ErrRefusedAddress, a, why)
}

// checkRedirect follows a page's redirects within the origin only, a
// file's to any host, never from https to http.
func (r *relay) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	from := via[len(via)-1].URL
	switch {
	case req.URL.Scheme != "http" && req.URL.Scheme != "https":
		return fmt.Errorf("%w: a redirect to %s", ErrRefusedAddress, req.URL.Scheme)
	case from.Scheme == "https" && req.URL.Scheme != "https":
		return fmt.Errorf("%w: a redirect from https to http", ErrRefusedAddress)
	case r.isPage(via[0].URL) && (req.URL.Scheme != r.upstream.Scheme || hostPort(req.URL) != r.origin):
		return fmt.Errorf("%w: the index's page %s redirects to another host (%s)", ErrRefusedAddress,
			via[0].URL.Path, req.URL.Host)
	}
	return nil
}

// isPage says whether u is one of the configured index's pages.
func (r *relay) isPage(u *url.URL) bool {
	return hostPort(u) == r.origin && strings.HasPrefix(u.Path, r.upstream.Path)
}

// Package portproxy serves HTTP (and WebSockets) to a port of a sandbox:
// a server the sandbox's code started, reached from outside through the
// server, what people call a preview URL. The connection to the sandbox is
// the service's (service.DialPort), made inside the sandbox's own network;
// this package is the HTTP side, shared by Vivarium's API (a path form,
// /v1/sandboxes/{id}/ports/{port}/...) and a host form,
// <port>-<id>.<domain>, as E2B's getHost(port) builds it.
//
// Every request needs a token, never none: a port token (the service's,
// for one port of one sandbox) in the Vivarium-Port-Token header, the
// vivarium_port_token query parameter or cookie, or E2B's traffic access
// token (one sandbox, every port) in its E2B-Traffic-Access-Token header.
// Tokens never reach the sandbox: they are taken out of the request.
//
// Everything the sandbox answers is hostile: its headers are bounded,
// its body is bounded per response, its time is bounded, and a page it
// serves on the server's own origin (the path form) is sandboxed by a
// Content-Security-Policy so that its scripts act as no one.
package portproxy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// Where a token may come from.
const (
	// TokenHeader carries a port token.
	TokenHeader = "Vivarium-Port-Token"
	// TrafficHeader is E2B's: its SDK users send the sandbox's
	// trafficAccessToken in it.
	TrafficHeader = "E2B-Traffic-Access-Token"
	// TokenParam is the query parameter of a link to a preview: in the
	// host form, a GET with it is answered by a redirect that moves the
	// token into a cookie (TokenCookie) and out of the address bar.
	TokenParam = "vivarium_port_token"
	// TokenCookie is the cookie, for that host only, HttpOnly.
	TokenCookie = "vivarium_port_token"
)

// Bounds on one proxied request.
const (
	MaxRequestBody = 64 << 20
	// MaxResponseBody is the most of one response's body passed on; a
	// longer one is cut (the connection to the client is aborted).
	MaxResponseBody = 256 << 20
	// MaxResponseHeader bounds the sandbox's response headers.
	MaxResponseHeader = 64 << 10
	// ResponseHeaderTimeout bounds the wait for the sandbox's answer to
	// begin; RequestTimeout the whole of a request that is not a
	// WebSocket (or another upgrade), which lasts as long as both sides
	// keep it.
	ResponseHeaderTimeout = 60 * time.Second
	RequestTimeout        = 10 * time.Minute
)

// Credential is a token a request carries, and where.
type Credential struct {
	Value string
	From  string // "header", "e2b-header", "query" or "cookie"
}

// maxCredentials bounds the tokens of one request that are tried.
const maxCredentials = 8

// Credentials lists the tokens r carries, in the order they should be
// tried: every value of the headers (a header sent twice is two), the
// link's parameter, then the cookies. Several cookies of the name may come
// (another host of the domain may have set one for the whole domain):
// each is a candidate. Where a cookie may be used is the caller's to
// decide (cookieAllowed).
func Credentials(r *http.Request) []Credential {
	var out []Credential
	for _, v := range r.Header.Values(TokenHeader) {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, Credential{v, "header"})
		}
	}
	for _, v := range r.Header.Values(TrafficHeader) {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, Credential{v, "e2b-header"})
		}
	}
	if v := r.URL.Query().Get(TokenParam); v != "" {
		out = append(out, Credential{v, "query"})
	}
	for _, c := range r.CookiesNamed(TokenCookie) {
		if c.Value != "" {
			out = append(out, Credential{c.Value, "cookie"})
		}
	}
	if len(out) > maxCredentials {
		out = out[:maxCredentials]
	}
	return out
}

// cookieAllowed reports whether the token cookie may authenticate r. All
// preview hosts <port>-<id>.<domain> are one site, and SameSite tells
// sites apart, not hosts: a page of one sandbox's port can make requests
// to another's preview host, and the browser adds that host's cookie. So
// a cookie opens only what its own pages ask for (Sec-Fetch-Site:
// same-origin: their scripts, images, fetches, WebSockets) and top-level
// navigations that change nothing (GET or HEAD of a document: a link
// followed, an address typed, a bookmark, the token link's redirect).
// Another origin's fetch, form post, frame or WebSocket is refused, as is
// every request of a client that sends no Fetch Metadata (a browser from
// before 2023, or a program, which uses the token header instead).
func cookieAllowed(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "same-origin":
		return true
	case "none", "same-site", "cross-site":
		return r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Header.Get("Sec-Fetch-Dest") == "document" &&
			(r.Method == http.MethodGet || r.Method == http.MethodHead)
	}
	return false
}

// DialFunc connects to the sandbox's port.
type DialFunc func(ctx context.Context) (net.Conn, error)

type dialKey struct{}

// Proxy forwards requests to sandboxes' ports.
type Proxy struct {
	rp          *httputil.ReverseProxy
	maxResponse int64 // MaxResponseBody; tests lower it
}

// New returns a Proxy logging to log.
func New(log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &http.Transport{
		// The request's own dial: never a connection pooled for another
		// request, which could be another sandbox's.
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return ctx.Value(dialKey{}).(DialFunc)(ctx)
		},
		DisableKeepAlives:      true,
		DisableCompression:     true,
		ResponseHeaderTimeout:  ResponseHeaderTimeout,
		MaxResponseHeaderBytes: MaxResponseHeader,
		ExpectContinueTimeout:  time.Second,
	}
	p := &Proxy{maxResponse: MaxResponseBody}
	p.rp = &httputil.ReverseProxy{
		Transport:      t,
		FlushInterval:  -1, // server-sent events and streams as they come
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		Rewrite:        rewrite,
		ModifyResponse: p.modifyResponse,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			WriteError(w, err)
		},
	}
	return p
}

type targetKey struct{}

// Target is what one request is proxied to, beyond its connection.
type Target struct {
	// Path is what the sandbox's server is asked for (with the request's
	// query, its token taken out).
	Path string
	// Host, when not empty, is the Host header the server gets instead
	// of the client's (service.PortOptions.Host).
	Host string
	// Isolate marks a response served on the server's own origin (the
	// path form): it is sandboxed.
	Isolate bool
	// Token is the token that opened the port, when known: besides the
	// places tokens come from, it is taken out of wherever else the
	// request holds it.
	Token string
}

// Serve proxies r to the sandbox's port that dial connects to, as t says.
func (p *Proxy) Serve(w http.ResponseWriter, r *http.Request, dial DialFunc, t Target) {
	ctx := context.WithValue(r.Context(), dialKey{}, dial)
	ctx = context.WithValue(ctx, targetKey{}, t)
	if !isUpgrade(r) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, RequestTimeout)
		defer cancel()
	}
	r = r.WithContext(ctx)
	if r.Body != nil {
		r.Body = http.MaxBytesReader(w, r.Body, MaxRequestBody)
	}
	// The sandbox's server may answer before it has read the request's
	// body (a stream); the body's reads go on as the answer is copied.
	http.NewResponseController(w).EnableFullDuplex()
	p.rp.ServeHTTP(w, r)
}

func isUpgrade(r *http.Request) bool {
	for _, v := range r.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), "upgrade") {
				return true
			}
		}
	}
	return false
}

func rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(targetKey{}).(Target)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = "sandbox" // never dialled: the request's DialFunc is
	out.URL.Path, out.URL.RawPath = t.Path, ""
	if !strings.HasPrefix(out.URL.Path, "/") {
		out.URL.Path = "/" + out.URL.Path
	}
	out.Host = pr.In.Host
	if t.Host != "" {
		out.Host = t.Host
	}
	stripCredentials(out, t.Token)
}

// credentialHeaders are the headers that carry a token or a key of the
// server's, by their names lower-cased with '_' as '-' (the forms
// servers other than Go's, a sandbox's among them, take for the same).
var credentialHeaders = map[string]bool{
	"vivarium-port-token": true, "e2b-traffic-access-token": true, "x-access-token": true, "x-api-key": true,
}

// normalName is a header's, parameter's or cookie's name as
// credentialHeaders has it.
func normalName(n string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimSpace(n)), "_", "-")
}

// stripCredentials takes out of a request to a sandbox every credential
// of the server's it carries, and what is near enough to one that a
// server might take it so: the tokens and keys' headers under any
// spelling of their names; every value, of any header, the query or a
// cookie, that holds one of the request's own tokens; Authorization
// values that hold an API key or a port token, whatever their scheme,
// case and spacing, base64-encoded too (Basic); the token cookie and
// parameter by any spelling. The sandbox's own credentials (Basic with
// its users, its tokens) pass. token is the one that opened the port.
func stripCredentials(out *http.Request, token string) {
	secrets := requestSecrets(out, token)
	holds := func(v string) bool {
		for _, s := range secrets {
			if strings.Contains(v, s) {
				return true
			}
		}
		return false
	}
	for name, vs := range out.Header {
		n := normalName(name)
		if credentialHeaders[n] {
			delete(out.Header, name)
			continue
		}
		var kept []string
		for _, v := range vs {
			switch {
			case n == "cookie":
				if v = withoutTokenCookies(v, holds); v != "" {
					kept = append(kept, v)
				}
			case holds(v):
			case n == "authorization" && carriesKey(v):
			default:
				kept = append(kept, v)
			}
		}
		if len(kept) == 0 {
			delete(out.Header, name)
		} else {
			out.Header[name] = kept
		}
	}
	out.URL.RawQuery = withoutTokenParams(out.URL.RawQuery, holds)
}

// minSecret is the shortest token that is looked for inside other
// values: a shorter one is no token of the server's, and would match
// anything.
const minSecret = 8

// requestSecrets lists the tokens to look for in the rest of a request:
// the token that opened the port, and every value of the credential
// headers. Not the other cookies' or the link's values, which a page of
// another preview host can choose (a cookie set for the whole domain, a
// link it made) and would thus take any header it likes out of the
// request.
func requestSecrets(r *http.Request, token string) []string {
	var out []string
	add := func(v string) {
		if v = strings.TrimSpace(v); len(v) >= minSecret && len(out) < 4*maxCredentials {
			out = append(out, v)
		}
	}
	add(token)
	for name, vs := range r.Header {
		if credentialHeaders[normalName(name)] {
			for _, v := range vs {
				add(v)
			}
		}
	}
	return out
}

// keyPrefixes start the server's API keys (store.TokenPrefix, and the
// legacy viv_) and port tokens (service's vp1.), lower-cased.
var keyPrefixes = []string{"e2b_", "viv_", "vp1."}

// carriesKey reports whether an Authorization value holds an API key or
// a port token: any word of it, under any scheme, in any case, with any
// spacing, or inside a word that decodes from base64 (Basic's
// user:password).
func carriesKey(v string) bool {
	if hasKeyWord(v) {
		return true
	}
	for _, w := range words(v) {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if b, err := enc.DecodeString(w); err == nil && hasKeyWord(string(b)) {
				return true
			}
		}
	}
	return false
}

func hasKeyWord(v string) bool {
	for _, w := range words(v) {
		w = strings.ToLower(w)
		for _, p := range keyPrefixes {
			if strings.HasPrefix(w, p) {
				return true
			}
		}
	}
	return false
}

// words splits v at everything that is not in a token's, a key's or
// base64's alphabet: spaces of every kind, commas, quotes, colons, '='.
func words(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-~+/", r))
	})
}

// withoutTokenCookies is a Cookie header's value without the token
// cookie (under any spelling of its name) and without any cookie that
// holds one of the request's tokens; the others pass as they came.
func withoutTokenCookies(v string, holds func(string) bool) string {
	var kept []string
	for pair := range strings.SplitSeq(v, ";") {
		name, _, _ := strings.Cut(pair, "=")
		if normalName(strings.Trim(name, `"`)) == normalName(TokenCookie) || holds(pair) {
			continue
		}
		if pair = strings.TrimSpace(pair); pair != "" {
			kept = append(kept, pair)
		}
	}
	return strings.Join(kept, "; ")
}

// withoutTokenParams is a query without the token parameter (under any
// spelling of its name, however the query is split) and without any
// parameter that holds one of the request's tokens. A query that has
// neither is passed as it came.
func withoutTokenParams(raw string, holds func(string) bool) string {
	plain := raw
	if u, err := url.QueryUnescape(raw); err == nil {
		plain = u
	}
	if !strings.Contains(normalName(plain), normalName(TokenParam)) && !holds(plain) && !holds(raw) {
		return raw
	}
	var kept []string
	for pair := range strings.FieldsFuncSeq(raw, func(r rune) bool { return r == '&' || r == ';' }) {
		k, v, _ := strings.Cut(pair, "=")
		uk, err := url.QueryUnescape(k)
		if err != nil {
			uk = k
		}
		uv, err := url.QueryUnescape(v)
		if err != nil {
			uv = v
		}
		if strings.Contains(normalName(uk), normalName(TokenParam)) || holds(pair) || holds(uk) || holds(uv) {
			continue
		}
		kept = append(kept, pair)
	}
	return strings.Join(kept, "&")
}

func (p *Proxy) modifyResponse(resp *http.Response) error {
	t := resp.Request.Context().Value(targetKey{}).(Target)
	// The sandbox may not set the server's cookie, for its host or (as a
	// Domain cookie) for other sandboxes' hosts.
	if sc := resp.Header.Values("Set-Cookie"); len(sc) > 0 {
		resp.Header.Del("Set-Cookie")
		for _, v := range sc {
			name, _, _ := strings.Cut(strings.TrimSpace(v), "=")
			if !strings.EqualFold(strings.TrimSpace(name), TokenCookie) {
				resp.Header.Add("Set-Cookie", v)
			}
		}
	}
	if t.Isolate {
		// A page served on the server's own origin: its scripts run in
		// an opaque origin, and its requests to the API are cross-origin
		// ones (refused: see httpapi.RefuseBrowsers).
		resp.Header.Set("Content-Security-Policy", "sandbox allow-scripts allow-forms allow-popups allow-downloads")
		resp.Header.Set("X-Content-Type-Options", "nosniff")
		resp.Header.Del("Set-Cookie")
	}
	if resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
		resp.Body = &limitedBody{rc: resp.Body, left: p.maxResponse}
	}
	return nil
}

// errResponseTooLarge cuts a response longer than MaxResponseBody.
var errResponseTooLarge = errors.New("the sandbox's response is longer than the server passes on")

type limitedBody struct {
	rc   io.ReadCloser
	left int64
}

func (l *limitedBody) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errResponseTooLarge
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.rc.Read(p)
	l.left -= int64(n)
	return n, err
}

func (l *limitedBody) Close() error { return l.rc.Close() }

// WriteError answers a request that could not be proxied, as Vivarium's
// API answers errors ({"error": {"code", "message"}}), with a message for
// the client; nothing of the sandbox's own words.
func WriteError(w http.ResponseWriter, err error) {
	k, msg := answer(err)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(k.Status)
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	body.Error.Code, body.Error.Message = k.Code, msg
	json.NewEncoder(w).Encode(body)
}

// answer is err's kind (apierr's table) and what the client is told, in
// the words of a request to a port. An error the table does not know is
// the sandbox's server's doing (a broken answer, a response too long),
// not the server's: bad_gateway, and nothing to log.
func answer(err error) (*apierr.Kind, string) {
	k, msg := apierr.Answer(nil, err)
	switch k {
	case apierr.Internal:
		k, msg = apierr.BadGateway, apierr.BadGateway.Message
	case apierr.NotFound:
		msg = "no such sandbox: it was closed, timed out, or is not yours"
	case apierr.PortClosed:
		msg = err.Error() + ": start a server on it (on 0.0.0.0 or 127.0.0.1) first"
	case apierr.TLSFailed:
		msg = strings.TrimPrefix(err.Error(), service.ErrPortTLS.Error()+": ")
	case apierr.Closed:
		msg = "the sandbox was closed"
	case apierr.TooLarge:
		msg = fmt.Sprintf("a request body to a sandbox's port is at most %d bytes", MaxRequestBody)
	case apierr.Timeout:
		msg = "the sandbox's server did not answer in time"
	}
	return k, msg
}

// Unauthorized is the error of a request without a valid token (401).
func Unauthorized(msg string) error { return apierr.New(apierr.Unauthorized, msg) }

// Forbidden is the same error as E2B's proxy answers it (403).
func Forbidden(msg string) error { return apierr.New(apierr.Forbidden, msg) }

// ParseHost splits a host of the form <port>-<id>.<domain> (any port of
// its own after a colon is ignored, as is case). ok is false for any other
// host.
func ParseHost(host, domain string) (id string, port int, ok bool) {
	if domain == "" {
		return "", 0, false
	}
	host, domain = stripPort(strings.ToLower(host)), stripPort(strings.ToLower(domain))
	label, ok := strings.CutSuffix(host, "."+domain)
	if !ok || label == "" || strings.Contains(label, ".") {
		return "", 0, false
	}
	ps, id, ok := strings.Cut(label, "-")
	if !ok || id == "" || ps == "" || len(ps) > 5 || ps[0] == '0' {
		return "", 0, false
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, false
	}
	for _, c := range ps {
		if c < '0' || c > '9' {
			return "", 0, false
		}
	}
	return id, port, true
}

// IsHost reports whether host is <label>.<domain> (ports and case
// ignored).
func IsHost(host, label, domain string) bool {
	return domain != "" && strings.EqualFold(stripPort(host), label+"."+stripPort(domain))
}

// stripPort drops a :port from a host (not from an IPv6 literal's colons).
func stripPort(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") && strings.Count(h, ":") == 1 {
		return h[:i]
	}
	return h
}

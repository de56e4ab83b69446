package portproxy

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func TestParseHost(t *testing.T) {
	for _, c := range []struct {
		host, domain string
		id           string
		port         int
	}{
		{"3000-sb_abc.preview.test", "preview.test", "sb_abc", 3000},
		{"3000-sb_abc.preview.test:8080", "preview.test:8080", "sb_abc", 3000},
		{"3000-SB_ABC.Preview.Test", "preview.test", "sb_abc", 3000},
		{"65535-x.d", "d", "x", 65535},
		{"1-x-y.d", "d", "x-y", 1},
		{"preview.test", "preview.test", "", 0},
		{"a.3000-sb_abc.preview.test", "preview.test", "", 0},
		{"3000-sb_abc.preview.test.evil", "preview.test", "", 0},
		{"3000-sb_abc.evilpreview.test", "preview.test", "", 0},
		{"3000sb_abc.preview.test", "preview.test", "", 0},
		{"-sb_abc.preview.test", "preview.test", "", 0},
		{"3000-.preview.test", "preview.test", "", 0},
		{"0-sb.preview.test", "preview.test", "", 0},
		{"03000-sb.preview.test", "preview.test", "", 0},
		{"65536-sb.preview.test", "preview.test", "", 0},
		{"+300-sb.preview.test", "preview.test", "", 0},
		{"3000-sb_abc.preview.test", "", "", 0},
		{"127.0.0.1:8080", "preview.test", "", 0},
	} {
		id, port, ok := ParseHost(c.host, c.domain)
		if ok != (c.id != "") || id != c.id || port != c.port {
			t.Errorf("ParseHost(%q, %q) = %q %d %v, want %q %d", c.host, c.domain, id, port, ok, c.id, c.port)
		}
	}
}

// world is a proxy in front of one "sandbox" server (a host listener the
// tests dial explicitly) under the domain preview.test, where the port
// tokens "good" and longToken open port 3000 of sandbox sb_a.
type world struct {
	proxy   *Proxy
	front   http.Handler
	backend *httptest.Server
	next    int // requests that went past the host form
}

func newWorld(t *testing.T, backend http.Handler) *world {
	w := &world{proxy: New(nil)}
	w.backend = httptest.NewServer(backend)
	t.Cleanup(w.backend.Close)
	w.front = &Hosts{
		Domain: "preview.test:8080",
		Proxy:  w.proxy,
		Authorize: func(c Credential, id string, port int) (string, bool) {
			return "alice", (c.Value == "good" || c.Value == longToken) && c.From != "e2b-header" && id == "sb_a" && port == 3000 ||
				c.Value == "e2b" && c.From == "e2b-header" && id == "sb_a"
		},
		Dial: func(ctx context.Context, owner, id string, port int) (net.Conn, error) {
			if port != 3000 {
				return nil, sandbox.ErrPortClosed
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", w.backend.Listener.Addr().String())
		},
		Next: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { w.next++; rw.WriteHeader(204) }),
	}
	return w
}

func (w *world) do(r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	w.front.ServeHTTP(rec, r)
	return rec
}

// echo answers what the sandbox was sent.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Add("Set-Cookie", "app=1")
	w.Header().Add("Set-Cookie", TokenCookie+"=forged; Domain=preview.test")
	json.NewEncoder(w).Encode(map[string]any{"path": r.URL.Path, "query": r.URL.RawQuery, "host": r.Host,
		"headers": r.Header})
})

func TestHostFormNeedsAToken(t *testing.T) {
	w := newWorld(t, echo)
	for name, r := range map[string]*http.Request{
		"none":                    httptest.NewRequest("GET", "http://3000-sb_a.preview.test:8080/", nil),
		"bad":                     withHeader(httptest.NewRequest("GET", "http://3000-sb_a.preview.test:8080/", nil), TokenHeader, "bad"),
		"another sandbox's":       withHeader(httptest.NewRequest("GET", "http://3000-sb_b.preview.test:8080/", nil), TokenHeader, "good"),
		"another port's":          withHeader(httptest.NewRequest("GET", "http://3001-sb_a.preview.test:8080/", nil), TokenHeader, "good"),
		"e2b's in our header":     withHeader(httptest.NewRequest("GET", "http://3000-sb_a.preview.test:8080/", nil), TokenHeader, "e2b"),
		"e2b's in the query":      httptest.NewRequest("GET", "http://3000-sb_a.preview.test:8080/?"+TokenParam+"=e2b", nil),
		"a port token as API key": withHeader(httptest.NewRequest("GET", "http://3000-sb_a.preview.test:8080/", nil), "Authorization", "Bearer good"),
	} {
		if rec := w.do(r); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "forbidden") {
			t.Errorf("%s: %d %s", name, rec.Code, rec.Body)
		}
	}
	if w.next != 0 {
		t.Errorf("%d requests went past the host form", w.next)
	}
	// Other hosts are not the form's.
	if rec := w.do(httptest.NewRequest("GET", "http://127.0.0.1:8080/v1/sandboxes", nil)); rec.Code != 204 || w.next != 1 {
		t.Errorf("the API's host: %d", rec.Code)
	}
}

// longToken is a port token long enough to be looked for elsewhere in a
// request (minSecret).
const longToken = "vp1.Z29vZA.a-port-token-of-sb_a"

func withHeader(r *http.Request, k, v string) *http.Request {
	r.Header.Set(k, v)
	return r
}

type echoed struct {
	Path, Query, Host string
	Headers           http.Header
}

func decode(t *testing.T, rec *httptest.ResponseRecorder) echoed {
	t.Helper()
	var e echoed
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatalf("%v: %s", err, rec.Body)
	}
	return e
}

// A request with a token is proxied with its tokens taken out; the
// sandbox cannot set the server's cookie.
func TestHostFormProxiesWithoutTokens(t *testing.T) {
	w := newWorld(t, echo)
	r := httptest.NewRequest("GET", "http://3000-sb_a.preview.test:8080/a/b?x=1", nil)
	r.Header.Set(TokenHeader, "good")
	r.Header.Set("X-Access-Token", "envd")
	r.Header.Set("Authorization", "Bearer e2b_0123456789abcdef0123456789abcdef01234567")
	r.Header.Add("Cookie", TokenCookie+"=junk; app=1")
	rec := w.do(r)
	e := decode(t, rec)
	if e.Path != "/a/b" || e.Query != "x=1" || e.Host != "3000-sb_a.preview.test:8080" {
		t.Errorf("%+v", e)
	}
	for _, h := range []string{TokenHeader, TrafficHeader, "X-Access-Token", "Authorization"} {
		if e.Headers.Get(h) != "" {
			t.Errorf("the sandbox was sent %s", h)
		}
	}
	if c := e.Headers.Get("Cookie"); c != "app=1" {
		t.Errorf("the sandbox was sent the cookies %q", c)
	}
	if sc := rec.Header().Values("Set-Cookie"); len(sc) != 1 || sc[0] != "app=1" {
		t.Errorf("Set-Cookie passed on: %q", sc)
	}
	// E2B's traffic token, in E2B's header; the app's own credentials
	// pass.
	r = httptest.NewRequest("GET", "http://3000-sb_a.preview.test:8080/", nil)
	r.Header.Set(TrafficHeader, "e2b")
	r.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
	if e := decode(t, w.do(r)); e.Headers.Get(TrafficHeader) != "" || e.Headers.Get("Authorization") != "Basic dXNlcjpwYXNz" {
		t.Errorf("the sandbox was sent E2B's token, or not its own credentials: %v", e.Headers)
	}
	// Nothing listens on the port.
	r = httptest.NewRequest("GET", "http://3001-sb_a.preview.test:8080/", nil)
	w.front.(*Hosts).Authorize = func(Credential, string, int) (string, bool) { return "alice", true }
	r.Header.Set(TokenHeader, "good")
	if rec := w.do(r); rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), "port_closed") {
		t.Errorf("a closed port: %d %s", rec.Code, rec.Body)
	}
}

// A link's token becomes a cookie of that host, and leaves the URL.
func TestHostFormLinkSetsACookie(t *testing.T) {
	w := newWorld(t, echo)
	for path, want := range map[string]string{
		"/page?" + TokenParam + "=good&x=1":       "/page?x=1",
		"//evil.example/?" + TokenParam + "=good": "/evil.example/",
		"/\\evil.example?" + TokenParam + "=good": "/evil.example",
	} {
		r := httptest.NewRequest("GET", "http://3000-sb_a.preview.test:8080"+path, nil)
		rec := w.do(r)
		if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != want {
			t.Errorf("%s: %d to %q, want %q", path, rec.Code, rec.Header().Get("Location"), want)
		}
		c := rec.Result().Cookies()
		if len(c) != 1 || c[0].Name != TokenCookie || c[0].Value != "good" || !c[0].HttpOnly || c[0].Domain != "" ||
			c[0].SameSite != http.SameSiteLaxMode {
			t.Errorf("%s: cookies %+v", path, c)
		}
	}
	// The cookie opens the port to the page's own requests; one another
	// host of the domain tossed in beside it does not get in the way.
	r := httptest.NewRequest("GET", "http://3000-sb_a.preview.test:8080/next", nil)
	r.Header.Add("Cookie", TokenCookie+"=tossed; "+TokenCookie+"=good")
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	if e := decode(t, w.do(r)); e.Path != "/next" || e.Headers.Get("Cookie") != "" {
		t.Errorf("%+v", e)
	}
	// A POST with the token in its query is served, not redirected.
	r = httptest.NewRequest("POST", "http://3000-sb_a.preview.test:8080/form?"+TokenParam+"=good", strings.NewReader("a=1"))
	if e := decode(t, w.do(r)); e.Query != "" {
		t.Errorf("the sandbox was sent the query %q", e.Query)
	}
}

// A target's Host replaces the client's (E2B's maskRequestHost).
func TestTargetHost(t *testing.T) {
	w := newWorld(t, echo)
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", w.backend.Listener.Addr().String())
	}
	for _, c := range []struct{ mask, want string }{{"", "3000-sb_a.preview.test"}, {"app.internal:3000", "app.internal:3000"}} {
		rec := httptest.NewRecorder()
		w.proxy.Serve(rec, httptest.NewRequest("GET", "http://3000-sb_a.preview.test/", nil), dial, Target{Path: "/", Host: c.mask})
		if e := decode(t, rec); e.Host != c.want {
			t.Errorf("mask %q: the server got Host %q, want %q", c.mask, e.Host, c.want)
		}
	}
}

// The path form's pages are sandboxed (the server's own origin).
func TestIsolatedResponse(t *testing.T) {
	w := newWorld(t, echo)
	rec := httptest.NewRecorder()
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", w.backend.Listener.Addr().String())
	}
	w.proxy.Serve(rec, httptest.NewRequest("GET", "http://127.0.0.1/v1/sandboxes/x/ports/3000/y", nil), dial,
		Target{Path: "/y", Isolate: true})
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.HasPrefix(csp, "sandbox") {
		t.Errorf("CSP %q", csp)
	}
	if sc := rec.Header().Values("Set-Cookie"); len(sc) != 0 {
		t.Errorf("Set-Cookie on the server's origin: %q", sc)
	}
	if e := decode(t, rec); e.Path != "/y" {
		t.Errorf("%+v", e)
	}
}

// A response longer than the bound is cut.
func TestResponseBound(t *testing.T) {
	w := newWorld(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		chunk := strings.Repeat("x", 1<<10)
		for range 1 << 10 { // 1 MiB
			if _, err := io.WriteString(rw, chunk); err != nil {
				return
			}
		}
	}))
	w.proxy.maxResponse = 64 << 10
	front := httptest.NewServer(w.front)
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/big", nil)
	req.Host = "3000-sb_a.preview.test:8080"
	req.Header.Set(TokenHeader, "good")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil || n > 64<<10 {
		t.Errorf("read %d bytes, err %v: the response was not cut at 64 KiB", n, err)
	}
}

// A WebSocket (any upgrade) goes through both ways.
func TestUpgrade(t *testing.T) {
	w := newWorld(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			rw.WriteHeader(400)
			return
		}
		c, brw, err := http.NewResponseController(rw).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprint(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		fmt.Fprint(brw, "echo "+line)
		brw.Flush()
	}))
	front := httptest.NewServer(w.front)
	defer front.Close()
	c, err := net.Dial("tcp", front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: 3000-sb_a.preview.test:8080\r\n%s: good\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", TokenHeader)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("%v %v", resp, err)
	}
	fmt.Fprint(c, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo hello\n" {
		t.Errorf("%q %v", line, err)
	}
}

// rawDo sends head to addr (testutil.RawHTTP) and returns the answer's
// status and body.
func rawDo(t *testing.T, addr, head string) (int, string) {
	t.Helper()
	code, _, body := testutil.RawHTTP(t, addr, head)
	return code, body
}

// The preview's cookie opens the port to its own pages' requests and to
// top-level navigations, as a browser marks them (Fetch Metadata): never
// to another preview host's page, which is the same site, nor to a client
// that says nothing of where a request comes from.
func TestHostFormCookieOnlyForItsOwnPages(t *testing.T) {
	w := newWorld(t, echo)
	front := httptest.NewServer(w.front)
	defer front.Close()
	addr := front.Listener.Addr().String()
	const host = "Host: 3000-sb_a.preview.test:8080\r\n"
	const cookie = "Cookie: " + TokenCookie + "=good\r\n"
	fetch := func(site, mode, dest string) string {
		return "Sec-Fetch-Site: " + site + "\r\nSec-Fetch-Mode: " + mode + "\r\nSec-Fetch-Dest: " + dest + "\r\n"
	}
	for _, c := range []struct {
		name, head string
		want       int
	}{
		// What the preview's own pages ask for, and links to it.
		{"its page's fetch", "POST /api HTTP/1.1\r\n" + host + cookie + fetch("same-origin", "cors", "empty") + "Content-Length: 0\r\n", 200},
		{"its page's script", "GET /app.js HTTP/1.1\r\n" + host + cookie + fetch("same-origin", "no-cors", "script"), 200},
		{"its page's WebSocket", "GET /ws HTTP/1.1\r\n" + host + cookie + fetch("same-origin", "websocket", "websocket"), 200},
		{"its own frame", "GET /inner HTTP/1.1\r\n" + host + cookie + fetch("same-origin", "navigate", "iframe"), 200},
		{"an address typed", "GET / HTTP/1.1\r\n" + host + cookie + fetch("none", "navigate", "document") + "Sec-Fetch-User: ?1\r\n", 200},
		{"a link from elsewhere", "GET /page HTTP/1.1\r\n" + host + cookie + fetch("cross-site", "navigate", "document"), 200},
		{"a link from another preview", "GET /page HTTP/1.1\r\n" + host + cookie + fetch("same-site", "navigate", "document"), 200},
		{"a HEAD navigation", "HEAD / HTTP/1.1\r\n" + host + cookie + fetch("none", "navigate", "document"), 200},
		// What another preview's page (the same site) makes its browser send.
		{"another preview's fetch", "GET /api/secret HTTP/1.1\r\n" + host + cookie + fetch("same-site", "cors", "empty"), 403},
		{"another preview's no-cors fetch", "POST /api/delete HTTP/1.1\r\n" + host + cookie + fetch("same-site", "no-cors", "empty") + "Content-Length: 0\r\n", 403},
		{"another preview's image", "GET /logout HTTP/1.1\r\n" + host + cookie + fetch("same-site", "no-cors", "image"), 403},
		{"another preview's script", "GET /data.js HTTP/1.1\r\n" + host + cookie + fetch("same-site", "no-cors", "script"), 403},
		{"another preview's form post", "POST /api/delete HTTP/1.1\r\n" + host + cookie + fetch("same-site", "navigate", "document") + "Content-Length: 0\r\n", 403},
		{"another preview's frame", "GET / HTTP/1.1\r\n" + host + cookie + fetch("same-site", "navigate", "iframe"), 403},
		{"another preview's WebSocket", "GET /ws HTTP/1.1\r\n" + host + cookie + fetch("same-site", "websocket", "websocket") +
			"Connection: Upgrade\r\nUpgrade: websocket\r\n", 403},
		{"another site's fetch", "GET /api/secret HTTP/1.1\r\n" + host + cookie + fetch("cross-site", "cors", "empty"), 403},
		{"another site's form post", "POST /api/delete HTTP/1.1\r\n" + host + cookie + fetch("cross-site", "navigate", "document") + "Content-Length: 0\r\n", 403},
		{"no Fetch Metadata", "GET / HTTP/1.1\r\n" + host + cookie, 403},
		{"a forged Sec-Fetch-Site", "GET / HTTP/1.1\r\n" + host + cookie + "Sec-Fetch-Site: Same-Origin\r\n", 403},
		// A token in the header is no ambient credential: it opens the
		// port whatever the request's origin.
		{"the token header from another preview", "GET /api HTTP/1.1\r\n" + host + TokenHeader + ": good\r\n" + fetch("same-site", "cors", "empty"), 200},
	} {
		code, body := rawDo(t, addr, c.head)
		if code != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.want)
		}
		if code == 403 && strings.HasPrefix(c.name, "another") && !strings.Contains(body, "not to requests from other pages") {
			t.Errorf("%s: the answer does not say why the cookie was refused: %s", c.name, body)
		}
	}
}

// No form of the server's credentials reaches the sandbox: the token and
// key headers under any spelling, an API key or port token in
// Authorization with any scheme, case and spacing, or base64-encoded,
// the request's own token wherever else it is, the token cookie and
// parameter however they are written. The sandbox's own credentials pass.
func TestHostFormPassesNoCredential(t *testing.T) {
	w := newWorld(t, echo)
	front := httptest.NewServer(w.front)
	defer front.Close()
	addr := front.Listener.Addr().String()
	const key = "e2b_0123456789abcdef0123456789abcdef01234567"
	b64 := base64.StdEncoding.EncodeToString
	// Never in what the sandbox gets, in any case.
	secrets := []string{key, "viv_", "vp1.", longToken, b64([]byte(key + ":")), b64([]byte("user:" + key)),
		"vivarium_port_token", "vivarium-port-token", "e2b-traffic", "e2b_traffic", "x-access-token", "x_access_token",
		"x-api-key", "x_api_key"}
	for name, c := range map[string]struct{ target, headers string }{
		"Bearer and a tab":            {"/", "Authorization: Bearer\t" + key},
		"Bearer and spaces":           {"/", "Authorization: Bearer    " + key},
		"bearer":                      {"/", "Authorization: bearer " + key},
		"BEARER":                      {"/", "Authorization: BEARER " + key},
		"no space after the colon":    {"/", "Authorization:Bearer " + key},
		"a key in capitals":           {"/", "Authorization: Bearer " + strings.ToUpper(key)},
		"another scheme":              {"/", "Authorization: Token " + key},
		"no scheme":                   {"/", "Authorization: " + key},
		"quoted":                      {"/", `Authorization: Bearer "` + key + `"`},
		"a parameter":                 {"/", "Authorization: Digest username=x, key=" + key},
		"Basic, the key as user":      {"/", "Authorization: Basic " + b64([]byte(key+":"))},
		"Basic, the key as password":  {"/", "Authorization: Basic " + b64([]byte("user:"+key))},
		"a legacy key":                {"/", "Authorization: Bearer viv_0123456789abcdef"},
		"a port token":                {"/", "Authorization: Bearer vp1.YWxpY2U.another-port-token"},
		"the request's token":         {"/", "Authorization: Bearer " + longToken},
		"repeated, Basic kept":        {"/", "Authorization: Basic dXNlcjpwYXNz\r\nAuthorization: Bearer\t" + key},
		"X-API-Key":                   {"/", "x-api-key: " + key},
		"X_API_KEY":                   {"/", "X_API_KEY: " + key},
		"X-Api_Key":                   {"/", "X-Api_Key: " + key},
		"X-Access-Token":              {"/", "x-access-token: an-envd-token"},
		"X_Access_Token":              {"/", "X_Access_Token: an-envd-token"},
		"E2B's header, underscored":   {"/", "E2B_Traffic_Access_Token: e2b"},
		"our header, underscored":     {"/", "Vivarium_Port_Token: " + longToken},
		"our header twice":            {"/", TokenHeader + ": " + longToken + "\r\n" + TokenHeader + ": another-value"},
		"the token in a header":       {"/", "X-Custom: " + longToken},
		"the token in a Referer":      {"/", "Referer: http://3000-sb_a.preview.test:8080/?vivarium_port_token=" + longToken},
		"the cookie, other case":      {"/", "Cookie: Vivarium_Port_Token=" + longToken + "; app=1"},
		"the cookie, quoted":          {"/", `Cookie: vivarium_port_token="` + longToken + `"; app=1`},
		"the cookie, malformed":       {"/", "Cookie: vivarium_port_token=a b c; app=1"},
		"the token in another cookie": {"/", "Cookie: session=" + longToken + "; app=1"},
		"the parameter after a ;":     {"/?x=1&y=2;vivarium_port_token=" + longToken, ""},
		"the parameter in capitals":   {"/?x=1&VIVARIUM_PORT_TOKEN=" + longToken, ""},
		"the parameter escaped":       {"/?x=1&vivarium%5Fport%5Ftoken=" + longToken, ""},
		"the parameter dashed":        {"/?x=1&vivarium-port-token=" + longToken, ""},
		"the token in a parameter":    {"/?x=1&t=" + longToken, ""},
	} {
		head := "GET " + c.target + " HTTP/1.1\r\nHost: 3000-sb_a.preview.test:8080\r\n" + TokenHeader + ": " + longToken + "\r\n" +
			"X-Custom-App: kept\r\n"
		if c.headers != "" {
			head += c.headers + "\r\n"
		}
		code, body := rawDo(t, addr, head)
		if code != 200 {
			t.Errorf("%s: %d %s", name, code, body)
			continue
		}
		low := strings.ToLower(body)
		for _, s := range secrets {
			if strings.Contains(low, strings.ToLower(s)) {
				t.Errorf("%s: the sandbox got %q: %s", name, s, body)
			}
		}
		var e echoed
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Headers.Get("X-Custom-App") != "kept" {
			t.Errorf("%s: the sandbox's own header did not pass: %s", name, body)
		}
		if strings.Contains(c.target, "x=1") && e.Query != "x=1" {
			t.Errorf("%s: the sandbox got the query %q, want x=1", name, e.Query)
		}
		if strings.Contains(c.headers, "app=1") && e.Headers.Get("Cookie") != "app=1" {
			t.Errorf("%s: the sandbox got the cookies %q, want app=1", name, e.Headers.Get("Cookie"))
		}
		if strings.HasPrefix(name, "repeated") && e.Headers.Get("Authorization") != "Basic dXNlcjpwYXNz" {
			t.Errorf("%s: the sandbox's own Basic credentials did not pass: %v", name, e.Headers["Authorization"])
		}
	}
	// The sandbox's own schemes pass as they came.
	for _, v := range []string{"Basic dXNlcjpwYXNz", "Bearer an-app-token", "token 0123456789abcdef"} {
		_, body := rawDo(t, addr, "GET / HTTP/1.1\r\nHost: 3000-sb_a.preview.test:8080\r\n"+TokenHeader+": good\r\nAuthorization: "+v+"\r\n")
		var e echoed
		if json.Unmarshal([]byte(body), &e) != nil || e.Headers.Get("Authorization") != v {
			t.Errorf("the sandbox's own Authorization %q did not pass: %s", v, body)
		}
	}
}

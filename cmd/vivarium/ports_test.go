package main

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/portproxy"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func TestCheckDomain(t *testing.T) {
	for d, ok := range map[string]bool{
		"": true, "preview.example.com": true, "preview.example.com:8080": true, "localhost:8080": true,
		"vivarium.test": true,
		"127.0.0.1":     false, "127.0.0.1:8080": false, "[::1]:8080": false, "example": false, "*.example.com": false,
		".example.com": false, "example.com.": false, "exa mple.com": false, "http://example.com": false,
	} {
		if err := checkDomain(d); (err == nil) != ok {
			t.Errorf("checkDomain(%q): %v", d, err)
		}
	}
}

// E2B's own hosts under the domain reach the E2B API, never a sandbox's
// ports; every other host goes on to the ports.
func TestE2BHosts(t *testing.T) {
	var got *http.Request
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r })
	ports := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = nil; w.WriteHeader(299) })
	h := &e2bHosts{domain: "preview.test:8080", hosts: ports, next: next}
	do := func(host, path string, hdr map[string]string) int {
		r := httptest.NewRequest("GET", "http://"+host+path, nil)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		got = nil
		h.ServeHTTP(w, r)
		return w.Code
	}
	do("api.preview.test", "/v2/sandboxes", nil)
	if got == nil || got.URL.Path != "/e2b/v2/sandboxes" {
		t.Errorf("the control plane: %+v", got)
	}
	do("49983-sb_a.preview.test:8080", "/files", nil)
	if got == nil || got.URL.Path != "/e2b/sandbox/files" || got.Header.Get("E2b-Sandbox-Id") != "sb_a" ||
		got.Header.Get("E2b-Sandbox-Port") != "49983" {
		t.Errorf("envd: %+v", got)
	}
	do("49999-sb_a.preview.test", "/execute", map[string]string{"E2b-Sandbox-Id": "sb_a"})
	if got == nil || got.URL.Path != "/e2b/sandbox/execute" || got.Header.Get("E2b-Sandbox-Port") != "49999" {
		t.Errorf("the code interpreter: %+v", got)
	}
	if code := do("49983-sb_a.preview.test", "/files", map[string]string{"E2b-Sandbox-Id": "sb_b"}); code != 400 || got != nil {
		t.Errorf("another sandbox's id in the header: %d", code)
	}
	for _, host := range []string{"8000-sb_a.preview.test", "api.other.test", "x.api.preview.test"} {
		if code := do(host, "/", nil); code != 299 {
			t.Errorf("%s did not go to the ports: %d", host, code)
		}
	}
}

// echoServer is a sandbox's HTTP server that answers with the request's
// head as it got it.
const echoServer = `
import asyncio, sys
async def handle(r, w):
    try:
        head = await r.readuntil(b"\r\n\r\n")
        w.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + head)
        await w.drain()
    except Exception:
        pass
    finally:
        w.close()
async def main():
    srv = await asyncio.start_server(handle, "0.0.0.0", int(sys.argv[1]))
    await srv.serve_forever()
asyncio.run(main())
`

// rawRequest sends head to the server at url (testutil.RawHTTP).
func rawRequest(t *testing.T, url, head string) (int, http.Header, string) {
	t.Helper()
	return testutil.RawHTTP(t, strings.TrimPrefix(url, "http://"), head)
}

// vivarium serve --domain, a sandbox's server that echoes what it gets,
// and the requests a client or a browser sends to its preview host: no
// form of the API key or of the port token reaches the sandbox, and the
// preview's cookie opens the port to its own pages and to links, not to
// another preview's page.
func TestServePortsToTheSandbox(t *testing.T) {
	needSandbox(t)
	dataDir := t.TempDir()
	key, _ := createKey(t, dataDir, "ports")
	srv := startServer(t, dataDir, "--domain", "vivarium.test", "--pool", "0")
	api := func(method, path, body string, want int) map[string]any {
		t.Helper()
		req, _ := http.NewRequest(method, srv.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		var out map[string]any
		json.Unmarshal(b, &out)
		return out
	}
	id := api("POST", "/v1/sandboxes", `{}`, 201)["id"].(string)
	api("PUT", "/v1/sandboxes/"+id+"/files/echo.py", echoServer, 201)
	api("POST", "/v1/sandboxes/"+id+"/processes", `{"cmd": "python3 echo.py 8000"}`, 201)
	tok := api("POST", "/v1/sandboxes/"+id+"/ports/8000", "", 200)["token"].(string)
	host := "Host: 8000-" + id + ".vivarium.test\r\n"
	testutil.WaitFor(t, 30*time.Second, "the sandbox's server to answer", func() bool {
		code, _, _ := rawRequest(t, srv.url, "GET / HTTP/1.1\r\n"+host+portproxy.TokenHeader+": "+tok+"\r\n")
		return code == 200
	})

	b64 := base64.StdEncoding.EncodeToString
	for name, c := range map[string]struct{ target, headers string }{
		"Bearer and a tab":           {"/", "Authorization: Bearer\t" + key},
		"bearer, spaces":             {"/", "Authorization: bearer   " + key},
		"no scheme":                  {"/", "Authorization: " + key},
		"Basic":                      {"/", "Authorization: Basic " + b64([]byte(key+":"))},
		"repeated":                   {"/", "Authorization: Basic dXNlcjpwYXNz\r\nAuthorization: Bearer\t" + key},
		"X_API_KEY":                  {"/", "X_API_KEY: " + key},
		"the port token as a bearer": {"/", "Authorization: Bearer " + tok},
		"the port token elsewhere":   {"/", "X-Token: " + tok},
		"the token cookie, any case": {"/", "Cookie: Vivarium_Port_Token=" + tok + "; app=1"},
		"the parameter, any case":    {"/?x=1&VIVARIUM_PORT_TOKEN=" + tok, ""},
		"the parameter, after a ;":   {"/?x=1&y=2;vivarium_port_token=" + tok, ""},
		"E2B's header, underscored":  {"/", "E2B_Traffic_Access_Token: " + tok},
		"the access token header":    {"/", "x_access_token: " + tok},
	} {
		head := "GET " + c.target + " HTTP/1.1\r\n" + host + portproxy.TokenHeader + ": " + tok + "\r\n"
		if c.headers != "" {
			head += c.headers + "\r\n"
		}
		code, _, got := rawRequest(t, srv.url, head)
		if code != 200 {
			t.Errorf("%s: %d %s", name, code, got)
			continue
		}
		low := strings.ToLower(got)
		for _, secret := range []string{key, tok, b64([]byte(key + ":")), "vivarium_port_token", "vivarium-port-token"} {
			if strings.Contains(low, strings.ToLower(secret)) {
				t.Errorf("%s: the sandbox got %q:\n%s", name, secret, got)
			}
		}
		if strings.Contains(c.headers, "dXNlcjpwYXNz") && !strings.Contains(got, "Authorization: Basic dXNlcjpwYXNz") {
			t.Errorf("%s: the sandbox's own credentials did not pass:\n%s", name, got)
		}
		if strings.Contains(c.headers, "app=1") && !strings.Contains(got, "Cookie: app=1\r\n") {
			t.Errorf("%s: the sandbox's own cookie did not pass:\n%s", name, got)
		}
	}

	// A browser: the link moves the token into a cookie, which its pages
	// and links then use; another preview's page cannot.
	code, hdr, _ := rawRequest(t, srv.url, "GET /?"+portproxy.TokenParam+"="+tok+" HTTP/1.1\r\n"+host+
		"Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\n")
	cookie, _, _ := strings.Cut(hdr.Get("Set-Cookie"), ";")
	if code != http.StatusSeeOther || !strings.HasPrefix(cookie, portproxy.TokenCookie+"=") {
		t.Fatalf("the link: %d, Set-Cookie %q", code, hdr.Get("Set-Cookie"))
	}
	fetch := func(site, mode, dest string) string {
		return "Cookie: " + cookie + "\r\nSec-Fetch-Site: " + site + "\r\nSec-Fetch-Mode: " + mode + "\r\nSec-Fetch-Dest: " + dest + "\r\n"
	}
	for _, c := range []struct {
		name, head string
		want       int
	}{
		{"the redirect followed", "GET / HTTP/1.1\r\n" + host + fetch("cross-site", "navigate", "document"), 200},
		{"its page's fetch", "POST /api HTTP/1.1\r\n" + host + fetch("same-origin", "cors", "empty") + "Content-Length: 0\r\n", 200},
		{"a link from another preview", "GET / HTTP/1.1\r\n" + host + fetch("same-site", "navigate", "document"), 200},
		{"another preview's fetch", "GET /api HTTP/1.1\r\n" + host + fetch("same-site", "cors", "empty"), 403},
		{"another preview's form post", "POST /api HTTP/1.1\r\n" + host + fetch("same-site", "navigate", "document") + "Content-Length: 0\r\n", 403},
		{"another preview's frame", "GET / HTTP/1.1\r\n" + host + fetch("same-site", "navigate", "iframe"), 403},
		{"no Fetch Metadata", "GET / HTTP/1.1\r\n" + host + "Cookie: " + cookie + "\r\n", 403},
	} {
		code, _, body := rawRequest(t, srv.url, c.head)
		if code != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.want)
		}
		if code == 200 && strings.Contains(strings.ToLower(body), strings.ToLower(tok)) {
			t.Errorf("%s: the sandbox got the token:\n%s", c.name, body)
		}
	}
}

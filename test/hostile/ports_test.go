//go:build linux

package hostile

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/portproxy"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// hostileServer is a sandbox's HTTP server that attacks what proxies it:
// a megabyte of headers, the server's own cookie for every host of the
// domain, a response that is not HTTP, and a page that would call the API
// from the server's origin.
const hostileServer = `
import socket, sys, threading
def handle(c):
    req = b""
    while b"\r\n\r\n" not in req:
        d = c.recv(4096)
        if not d:
            return
        req += d
    path = req.split(b" ")[1]
    if path == b"/headers":
        c.sendall(b"HTTP/1.1 200 OK\r\n" + b"X-Junk: " + b"x" * 1000 + b"\r\n")
        for _ in range(1100):
            c.sendall(b"X-Junk: " + b"x" * 1000 + b"\r\n")
        c.sendall(b"\r\nbody")
    elif path == b"/cookie":
        c.sendall(b"HTTP/1.1 200 OK\r\nSet-Cookie: vivarium_port_token=evil; Domain=preview.test; Path=/\r\n"
                  b"Set-Cookie: app=1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    elif path == b"/garbage":
        c.sendall(b"\x00\xff not http at all\r\n\r\n")
    elif path == b"/page":
        body = b"<script>fetch('/v1/sandboxes', {method: 'POST'})</script>"
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    else:
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
    c.close()
s = socket.create_server(("0.0.0.0", int(sys.argv[1])))
while True:
    conn, _ = s.accept()
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
`

// A sandbox's ports, attacked from both sides, on the native backend
// (gvisor's and docker's go through a relay in the sandbox, tested in
// their packages; wasm has no sockets and its ports are refused as
// unsupported, see service.TestDialPortUnsupported). From the
// outside: the host's canary ports and the server's own port, asked for
// as ports of the sandbox, are closed ports of the sandbox's own network.
// From the inside: the sandbox's server answers what a proxy must
// survive, and nothing of it reaches the client beyond the bounds.
func TestHostilePorts(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	// Canaries and host users of this test's own: the table (TestHostile)
	// may run at the same time in another process.
	canaries := testutil.SetupCanaries(t)
	listener := listenCounting(t, "tcp", "127.0.0.1:0")
	const parent = "vivarium-hostile-ports"
	base := suite.UIDBase + testutil.UIDSpan
	testutil.RemoveStaleCgroups(parent)
	b, err := native.New(native.Config{CgroupParent: parent, UIDBase: base, UIDRanges: testutil.UIDRanges,
		Zygote: testutil.ZygoteMode()})
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{Backend: b})
	api := httpapi.New(svc, nil, nil)
	front := httptest.NewServer(&portproxy.Hosts{
		Domain: "preview.test", Proxy: portproxy.New(nil), Next: httpapi.RefuseBrowsers(api, nil),
		Authorize: func(c portproxy.Credential, id string, port int) (string, bool) {
			return svc.PortTokenOwner(c.Value, id, port)
		},
		Dial: svc.DialPort,
	})
	defer func() {
		front.Close()
		svc.Close()
		b.Close()
		left := testutil.ProcessesOwnedBy(int(base), int(base)+testutil.UIDSpan)
		if left = append(left, testutil.CgroupsUnder(parent)...); len(left) > 0 {
			t.Errorf("left behind on the host: %v", left)
		}
		canaries.Check(t)
	}()

	info, err := svc.Create(context.Background(), service.CreateRequest{Owner: httpapi.DevOwner})
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	box, _ := svc.Get(httpapi.DevOwner, id)
	if err := box.Sandbox().Workspace().WriteFile("server.py", strings.NewReader(hostileServer), 1<<20); err != nil {
		t.Fatal(err)
	}
	_, sub, err := svc.StartProcess(context.Background(), httpapi.DevOwner, id, service.ProcessRequest{Argv: []string{"python3", "server.py", "8000"}})
	if err != nil {
		t.Fatal(err)
	}
	if sub != nil {
		sub.Close()
	}
	token := func(port int) string {
		tok, err := svc.PortToken(httpapi.DevOwner, id, port)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	get := func(port int, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", front.URL+path, nil)
		req.Host = fmt.Sprintf("%d-%s.preview.test", port, id)
		req.Header.Set(portproxy.TokenHeader, token(port))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp, string(body)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, _ := get(8000, "/"); resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox's server does not answer")
		}
	}

	// From outside: ports of the host, and the API's own, are the
	// sandbox's closed ports.
	_, apiPort, _ := net.SplitHostPort(front.Listener.Addr().String())
	var apiPortN int
	fmt.Sscan(apiPort, &apiPortN)
	for _, port := range []int{apiPortN, listener.addr.(*net.TCPAddr).Port} {
		resp, body := get(port, "/v1/sandboxes")
		if resp.StatusCode != 502 || !strings.Contains(body, "port_closed") {
			t.Errorf("port %d of the host: %d %s", port, resp.StatusCode, body)
		}
	}
	if n := listener.n.Load(); n > 0 {
		t.Errorf("the host's listener accepted %d connections", n)
	}

	// From inside: what the proxy must survive.
	if resp, body := get(8000, "/headers"); resp.StatusCode != 502 || strings.Contains(body, "xxxx") {
		t.Errorf("a megabyte of headers: %d %.100s", resp.StatusCode, body)
	}
	if resp, _ := get(8000, "/cookie"); strings.Join(resp.Header.Values("Set-Cookie"), ";") != "app=1" {
		t.Errorf("the sandbox set cookies %q", resp.Header.Values("Set-Cookie"))
	}
	if resp, body := get(8000, "/garbage"); resp.StatusCode != 502 || strings.Contains(body, "not http") {
		t.Errorf("a response that is not HTTP: %d %q", resp.StatusCode, body)
	}
	// The path form serves on the API's origin: the page is sandboxed,
	// and its request to the API, from an opaque origin, is refused.
	req, _ := http.NewRequest("GET", fmt.Sprintf("%s/v1/sandboxes/%s/ports/8000/page", front.URL, id), nil)
	req.Header.Set(portproxy.TokenHeader, token(8000))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "sandbox ") || strings.Contains(csp, "allow-same-origin") {
		t.Errorf("the page's CSP: %q", csp)
	}
	req, _ = http.NewRequest("POST", front.URL+"/v1/sandboxes", nil)
	req.Header.Set("Origin", "null")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 403 {
		t.Errorf("the page's request to the API: %v %v", resp.StatusCode, err)
	}
	if n := len(svc.List(httpapi.DevOwner)); n != 1 {
		t.Errorf("%d sandboxes", n)
	}

	// The sandbox still serves: nothing above broke the proxy.
	if resp, body := get(8000, "/"); resp.StatusCode != 200 || body != "hello" {
		t.Errorf("afterwards: %d %q", resp.StatusCode, body)
	}
}

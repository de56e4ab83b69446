package httpapi_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/pkgindex"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/store"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// netWorld is a server whose operator allows a few hosts and one package,
// with those hosts played by an HTTP and an HTTPS server on loopback:
// the proxies' resolver gives the names public addresses, and their
// dialler sends what the policy let through to the test servers.
type netWorld struct {
	url     string
	certPEM string

	mu    sync.Mutex
	audit []store.Record
}

func (w *netWorld) records(kind string) []store.Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []store.Record
	for _, r := range w.audit {
		if r.Kind == kind {
			out = append(out, r)
		}
	}
	return out
}

type nameTable map[string]string

func (n nameTable) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := n[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func newNetWorld(t *testing.T, zygote bool) *netWorld {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	plain := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "plain hello via %s", r.Host)
	}))
	t.Cleanup(plain.Close)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "tls hello via %s", r.Host)
	}))
	t.Cleanup(tlsSrv.Close)

	wheels := t.TempDir()
	testutil.Wheel(t, wheels, "vivtestpkg", "1.0", map[string]string{"vivtestpkg/__init__.py": "ANSWER = 42\n"})
	testutil.Wheel(t, wheels, "vivtestpkg", "2.0", map[string]string{"vivtestpkg/__init__.py": "ANSWER = 2\n"})
	testutil.Wheel(t, wheels, "forbidden", "1.0", map[string]string{"forbidden/__init__.py": ""})
	allowed, err := pkgindex.ParseAllowed("vivtestpkg==1.0")
	if err != nil {
		t.Fatal(err)
	}
	ix, err := pkgindex.New(pkgindex.Config{Dir: wheels, Allowed: []pkgindex.Allowed{allowed}})
	if err != nil {
		t.Fatal(err)
	}
	// The operator allows metadata too, by mistake: it stays refused.
	rules, err := netpolicy.ParseRules([]string{"*.example.com", "example.com", "169.254.169.254", "rebind.example.org"})
	if err != nil {
		t.Fatal(err)
	}
	w := &netWorld{certPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tlsSrv.Certificate().Raw}))}
	b, err := native.New(native.Config{CgroupParent: "vivarium-httpapi-net-test", UIDBase: native.DefaultUIDBase + 20<<24, UIDRanges: testutil.UIDRanges,
		Zygote: zygote})
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(service.Config{Backend: b, MaxPerOwner: 3,
		Network: service.NetworkConfig{
			Policy:   &netpolicy.Server{Rules: rules},
			Packages: ix,
			Resolver: nameTable{"example.com": "93.184.215.14", "api.example.com": "93.184.215.15",
				"rebind.example.org": "127.0.0.1"},
			Dial: func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
				target := plain.Listener.Addr().String()
				if ap.Port() == 443 {
					target = tlsSrv.Listener.Addr().String()
				}
				var d net.Dialer
				return d.DialContext(ctx, "tcp", target)
			},
		},
		Audit: func(r store.Record) {
			w.mu.Lock()
			w.audit = append(w.audit, r)
			w.mu.Unlock()
		},
	})
	srv := httptest.NewServer(httpapi.New(svc, keys{"alice-key": "alice", "bob-key": "bob"}, nil))
	t.Cleanup(func() {
		srv.Close()
		svc.Close()
		b.Close() // the zygote, and its cgroup
	})
	w.url = srv.URL
	return w
}

const netProbe = `
import urllib.request, urllib.error, socket, errno
def attempt(label, f):
    try:
        print(label, "ok", f())
    except urllib.error.HTTPError as e:
        print(label, e.code, e.read().decode().strip())
    except urllib.error.URLError as e:
        print(label, "URLError", e.reason)
    except OSError as e:
        print(label, type(e).__name__, errno.errorcode.get(e.errno, ""))
def fetch(url):
    return urllib.request.urlopen(url, timeout=10).read().decode()
`

// A sandbox created with network access reaches the allowed hosts over
// HTTP and HTTPS through its proxy, and nothing else; every attempt is in
// the audit log under the sandbox.
func TestNetworkSandbox(t *testing.T) {
	w := newNetWorld(t, false)
	c := client{t, w.url, "alice-key"}
	sb := c.json("POST", "/v1/sandboxes", map[string]any{
		"network": map[string]any{"allow": []string{"api.example.com", "example.com:443", "169.254.169.254", "rebind.example.org"}},
	}, 201)
	id := sb["id"].(string)
	base := "/v1/sandboxes/" + id
	netInfo, _ := sb["network"].(map[string]any)
	if netInfo == nil || netInfo["proxy"] != "127.0.0.1:3128" || len(netInfo["allow"].([]any)) != 4 {
		t.Fatalf("network info: %v", sb["network"])
	}
	c.json("PUT", base+"/files/ca.pem", []byte(w.certPEM), 201)
	res := c.json("POST", base+"/execute", map[string]any{"env": map[string]string{"SSL_CERT_FILE": "/workspace/ca.pem"}, "code": netProbe + `
attempt("http", lambda: fetch("http://api.example.com/a"))
attempt("https", lambda: fetch("https://example.com/b"))
attempt("not allowed", lambda: fetch("http://other.example.net/"))
attempt("port", lambda: fetch("http://example.com:8080/"))
attempt("metadata", lambda: fetch("http://169.254.169.254/latest/meta-data/"))
attempt("rebind", lambda: fetch("http://rebind.example.org/"))
attempt("direct", lambda: socket.create_connection(("93.184.215.14", 443), timeout=3))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))
`}, 200)
	want := []string{
		"http ok plain hello via api.example.com",
		"https ok tls hello via example.com",
		"not allowed 403 vivarium: other.example.net port 80 is not in this sandbox's network allowlist",
		"port 403 vivarium: example.com port 8080 is not in this sandbox's network allowlist",
		"metadata 403 vivarium: 169.254.169.254 port 80 is always refused: a link-local address (cloud metadata lives there)",
		"rebind 403 vivarium: rebind.example.org port 80 is refused: rebind.example.org resolves to 127.0.0.1, a loopback address",
		"direct OSError ENETUNREACH",
		"raw PermissionError EPERM",
	}
	if got := strings.Split(strings.TrimSpace(res["stdout"].(string)), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s\n%v", res["stdout"], strings.Join(want, "\n"), res)
	}
	// A command goes through the same proxy.
	cmd := c.json("POST", base+"/commands", map[string]any{"cmd": `python3 -c 'import urllib.request; print(urllib.request.urlopen("http://api.example.com/c").read().decode())'`}, 200)
	if cmd["stdout"] != "plain hello via api.example.com\n" {
		t.Errorf("command: %v", cmd)
	}
	c.json("DELETE", base, nil, 204)

	var got []string
	for _, r := range w.records("net") {
		if r.SandboxID != id || r.KeyID != "alice" {
			t.Errorf("record of another sandbox or owner: %+v", r)
		}
		if r.Status == "allowed" && r.BytesIn == 0 {
			t.Errorf("allowed connection with no bytes in: %+v", r)
		}
		got = append(got, fmt.Sprintf("%s:%d %s", r.Host, r.Port, r.Status))
	}
	slices.Sort(got)
	wantAudit := []string{"169.254.169.254:80 refused", "api.example.com:80 allowed", "api.example.com:80 allowed",
		"example.com:443 allowed", "example.com:8080 refused", "other.example.net:80 refused", "rebind.example.org:80 refused"}
	if !slices.Equal(got, wantAudit) {
		t.Errorf("audit:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantAudit, "\n"))
	}
}

// What the server does not allow is refused at creation, in words the
// client can act on; a sandbox without network has none.
func TestNetworkRefused(t *testing.T) {
	w := newNetWorld(t, false)
	c := client{t, w.url, "alice-key"}
	cases := []struct {
		network map[string]any
		code    int
		msg     string
	}{
		{map[string]any{"allow": []string{"evil.test"}}, 403, "evil.test:80,443 not within the server's allowlist"},
		{map[string]any{"allow": []string{"example.com:22"}}, 403, "example.com:22 not within the server's allowlist"},
		{map[string]any{"allow": []string{"example.com"}, "max_connections": 100000}, 403, "max_connections 100000 is over the server's limit"},
		{map[string]any{"allow": []string{"exa mple.com"}}, 400, "is not allowed in a host name"},
	}
	for _, tc := range cases {
		code, body := c.do("POST", "/v1/sandboxes", map[string]any{"network": tc.network})
		if code != tc.code || !strings.Contains(string(body), tc.msg) {
			t.Errorf("%v: %d %s, want %d %q", tc.network, code, body, tc.code, tc.msg)
		}
	}
	sb := c.json("POST", "/v1/sandboxes", nil, 201)
	if sb["network"] != nil {
		t.Errorf("network of a plain sandbox: %v", sb["network"])
	}
	res := c.json("POST", "/v1/sandboxes/"+sb["id"].(string)+"/execute", map[string]any{"code": netProbe + `
import os
print(sorted(k for k in os.environ if "proxy" in k.lower()))
attempt("proxy", lambda: socket.create_connection(("127.0.0.1", 3128), timeout=3))
`}, 200)
	if res["stdout"] != "[]\nproxy ConnectionRefusedError ECONNREFUSED\n" {
		t.Errorf("sandbox without network: %v", res)
	}
	code, body := c.do("POST", "/v1/sandboxes/"+sb["id"].(string)+"/packages", map[string]any{"name": "vivtestpkg"})
	if code != 403 || !strings.Contains(string(body), "created without package installs") {
		t.Errorf("install into a sandbox without packages: %d %s", code, body)
	}
}

// A one-shot run takes a network too; its connections are audited under
// the run's own id.
func TestNetworkRunOnce(t *testing.T) {
	w := newNetWorld(t, false)
	c := client{t, w.url, "alice-key"}
	res := c.json("POST", "/v1/execute", map[string]any{"network": map[string]any{"allow": []string{"api.example.com:80"}},
		"code": netProbe + `
attempt("http", lambda: fetch("http://api.example.com/once"))
attempt("https", lambda: fetch("https://api.example.com/once"))
`}, 200)
	want := "http ok plain hello via api.example.com\n" +
		"https URLError Tunnel connection failed: 403 vivarium: api.example.com port 443 is not in this sandbox's network allowlist\n"
	if res["stdout"] != want {
		t.Errorf("got %q, want %q (%v)", res["stdout"], want, res)
	}
	runs := w.records("run_once")
	nets := w.records("net")
	if len(runs) != 1 || !strings.HasPrefix(runs[0].SandboxID, "run_") || len(nets) != 2 {
		t.Fatalf("audit: %+v %+v", runs, nets)
	}
	for _, r := range nets {
		if r.SandboxID != runs[0].SandboxID {
			t.Errorf("net record %+v not under the run %s", r, runs[0].SandboxID)
		}
	}
}

// An allowed package is installed from the server's index through the
// sandbox's proxy, into that sandbox only; anything else is refused.
// Both ways of starting an interpreter (classic and forked from a zygote)
// find what was installed.
func TestPackageInstall(t *testing.T) {
	t.Run("classic", func(t *testing.T) { testPackageInstall(t, false) })
	t.Run("zygote", func(t *testing.T) { testPackageInstall(t, true) })
}

func testPackageInstall(t *testing.T, zygote bool) {
	w := newNetWorld(t, zygote)
	testutil.RequirePythonModules(t, "pip")
	c := client{t, w.url, "alice-key"}
	id := c.json("POST", "/v1/sandboxes", map[string]any{"network": map[string]any{"packages": true}}, 201)["id"].(string)
	other := c.json("POST", "/v1/sandboxes", map[string]any{"network": map[string]any{"packages": true}}, 201)["id"].(string)
	base := "/v1/sandboxes/" + id

	for _, tc := range []struct {
		req  map[string]any
		code int
		msg  string
	}{
		{map[string]any{"name": "forbidden"}, 403, "forbidden is not on this server's package allowlist (it allows: vivtestpkg==1.0)"},
		{map[string]any{"name": "vivtestpkg", "version": "2.0"}, 403, "vivtestpkg 2.0 is not allowed; allowed versions: 1.0"},
		{map[string]any{"name": "bad name!"}, 400, "bad name!"},
		{map[string]any{}, 400, "name is required"},
	} {
		code, body := c.do("POST", base+"/packages", tc.req)
		if code != tc.code || !strings.Contains(string(body), tc.msg) {
			t.Errorf("%v: %d %s, want %d %q", tc.req, code, body, tc.code, tc.msg)
		}
	}

	res := c.json("POST", base+"/packages", map[string]any{"name": "vivtestpkg"}, 200)
	if res["status"] != "ok" || !strings.Contains(res["output"].(string), "Successfully installed vivtestpkg-1.0") {
		t.Fatalf("install: %v", res)
	}
	out := c.json("POST", base+"/execute", map[string]any{"code": "import vivtestpkg; print(vivtestpkg.ANSWER)"}, 200)
	if out["stdout"] != "42\n" {
		t.Errorf("import after install: %v", out)
	}
	// The interpreter started anew finds it too.
	c.json("POST", base+"/restart", nil, 200)
	out = c.json("POST", base+"/execute", map[string]any{"code": "import vivtestpkg; print(vivtestpkg.ANSWER)"}, 200)
	if out["stdout"] != "42\n" {
		t.Errorf("import after restart: %v", out)
	}
	// The other sandbox has not got it; and the index serves nothing
	// that is not allowed, even to pip run by the sandbox's own code.
	out = c.json("POST", "/v1/sandboxes/"+other+"/execute", map[string]any{"code": `
import importlib.util, subprocess, sys
print(importlib.util.find_spec("vivtestpkg"))
r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--target", "/workspace/x",
    "--index-url", "http://packages.vivarium.internal/simple/", "forbidden"], capture_output=True, text=True)
print(r.returncode, "No matching distribution found for forbidden" in r.stderr)
`}, 200)
	if out["stdout"] != "None\n1 True\n" {
		t.Errorf("other sandbox: %v", out)
	}

	var pkgs []string
	for _, r := range w.records("package") {
		pkgs = append(pkgs, r.SandboxID+" "+r.Status)
	}
	if !slices.Equal(pkgs, []string{id + " ok"}) {
		t.Errorf("package records: %v", pkgs)
	}
	var hosts []string
	for _, r := range w.records("net") {
		if r.SandboxID == id && r.Status == "allowed" {
			hosts = append(hosts, r.Host)
		}
	}
	if len(hosts) == 0 || slices.ContainsFunc(hosts, func(h string) bool { return h != pkgindex.Host }) {
		t.Errorf("installing sandbox's connections: %v", hosts)
	}
}

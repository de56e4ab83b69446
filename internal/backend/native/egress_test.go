package native_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// egressWorld is a sandbox's outside: an HTTP and an HTTPS server on the
// host's loopback, and a proxy whose resolver gives names public
// addresses that its dialler sends to those servers. The sandbox reaches
// the servers only through its proxy: its own namespace has no route.
type egressWorld struct {
	plain, tls *httptest.Server
	certPEM    string

	mu     sync.Mutex
	events []netproxy.Event
	closed int
}

var publicAddr = netip.MustParseAddr("93.184.215.14")

func newEgressWorld(t *testing.T) *egressWorld {
	w := &egressWorld{}
	w.plain = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "plain hello via %s", r.Host)
	}))
	t.Cleanup(w.plain.Close)
	w.tls = httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "tls hello via %s", r.Host)
	}))
	t.Cleanup(w.tls.Close)
	w.certPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: w.tls.Certificate().Raw}))
	return w
}

// proxy makes the proxy of one sandbox.
func (w *egressWorld) proxy(t *testing.T, allow ...string) sandbox.Egress {
	rules, err := netpolicy.ParseRules(allow)
	if err != nil {
		t.Fatal(err)
	}
	p, err := netproxy.New(netproxy.Config{
		Checker: &netpolicy.Checker{
			Policy: &netpolicy.Policy{Rules: rules},
			Resolver: resolverFunc(func(host string) []netip.Addr {
				switch host {
				case "example.com", "api.example.com":
					return []netip.Addr{publicAddr}
				case "rebind.example.com":
					return []netip.Addr{netip.MustParseAddr("127.0.0.1")}
				}
				return nil
			}),
		},
		Dial: func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
			target := w.plain.Listener.Addr().String()
			if ap.Port() == 443 {
				target = w.tls.Listener.Addr().String()
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", target)
		},
		Audit: func(e netproxy.Event) {
			w.mu.Lock()
			w.events = append(w.events, e)
			w.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return &closeCounting{Proxy: p, w: w}
}

type closeCounting struct {
	*netproxy.Proxy
	w *egressWorld
}

func (c *closeCounting) Close() error {
	c.w.mu.Lock()
	c.w.closed++
	c.w.mu.Unlock()
	return c.Proxy.Close()
}

type resolverFunc func(string) []netip.Addr

func (f resolverFunc) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a := f(host); len(a) > 0 {
		return a, nil
	}
	return nil, fmt.Errorf("no such host %s", host)
}

const egressProbe = `
import errno, os, socket, ssl, urllib.request, urllib.error
def attempt(label, f):
    try:
        r = f()
        print(label, "ok", r)
    except urllib.error.HTTPError as e:
        print(label, "HTTPError", e.code, e.reason)
    except OSError as e:
        print(label, type(e).__name__, errno.errorcode.get(e.errno, "") if e.errno else "", e.strerror or e)
def fetch(url):
    return urllib.request.urlopen(url, timeout=10).read().decode()
`

func TestEgress(t *testing.T) {
	t.Parallel()
	w := newEgressWorld(t)
	port := w.plain.Listener.Addr().(*net.TCPAddr).Port
	res := run(t, egressProbe+`
print("proxy", os.environ["HTTPS_PROXY"], os.environ["NO_PROXY"])
attempt("http", lambda: fetch("http://api.example.com/x"))
attempt("https", lambda: fetch("https://example.com/"))
attempt("refused http", lambda: fetch("http://evil.test/"))
attempt("refused https", lambda: fetch("https://evil.test/"))
attempt("rebind", lambda: fetch("http://rebind.example.com/"))
attempt("metadata", lambda: fetch("http://169.254.169.254/latest/meta-data/"))
attempt("direct", lambda: socket.create_connection(("93.184.215.14", 443), timeout=3))
attempt("host loopback", lambda: socket.create_connection(("127.0.0.1", int(os.environ["PORT"])), timeout=3))
attempt("squat", lambda: socket.socket().bind(("127.0.0.1", 3128)))
attempt("squat any", lambda: socket.socket().bind(("0.0.0.0", 3128)))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))
`, func(j *sandbox.OneShot) {
		j.Spec.Egress = w.proxy(t, "api.example.com:80", "example.com:443", "rebind.example.com", "169.254.169.254")
		j.Request.Env = map[string]string{"SSL_CERT_FILE": "/workspace/ca.pem", "PORT": fmt.Sprint(port)}
		j.Files = []sandbox.InputFile{{Name: "ca.pem", Open: func() (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(w.certPEM)), nil
		}}}
	})
	wantStatus(t, res, sandbox.StatusOK, 0)
	want := []string{
		"proxy http://127.0.0.1:3128 localhost,127.0.0.1,::1",
		"http ok plain hello via api.example.com",
		"https ok tls hello via example.com",
		"refused http HTTPError 403 vivarium: evil.test port 80 is not in this sandbox's network allowlist",
		"refused https URLError  <urlopen error Tunnel connection failed: 403 vivarium: evil.test port 443 is not in this sandbox's network allowlist>",
		"rebind HTTPError 403 vivarium: rebind.example.com port 80 is refused: rebind.example.com resolves to 127.0.0.1, a loopback address",
		"metadata HTTPError 403 vivarium: 169.254.169.254 port 80 is always refused: a link-local address (cloud metadata lives there)",
		"direct OSError ENETUNREACH Network is unreachable",
		"host loopback ConnectionRefusedError ECONNREFUSED Connection refused",
		"squat OSError EADDRINUSE Address already in use",
		"squat any OSError EADDRINUSE Address already in use",
		"raw PermissionError EPERM Operation not permitted",
	}
	if got := strings.Split(strings.TrimSpace(res.Stdout), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s\nstderr: %s", res.Stdout, strings.Join(want, "\n"), res.Stderr)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed == 0 {
		t.Error("the sandbox did not close its proxy")
	}
	var summary []string
	for _, e := range w.events {
		summary = append(summary, fmt.Sprintf("%s %s:%d %s", e.Method, e.Host, e.Port, e.Outcome))
	}
	// Each connection's event comes when it ends, in whatever order
	// their ends are seen.
	slices.Sort(summary)
	wantEvents := "CONNECT evil.test:443 refused|CONNECT example.com:443 allowed|GET 169.254.169.254:80 refused|" +
		"GET api.example.com:80 allowed|GET evil.test:80 refused|GET rebind.example.com:80 refused"
	if got := strings.Join(summary, "|"); got != wantEvents {
		t.Errorf("audit events:\n%s\nwant\n%s", got, wantEvents)
	}
}

// A stateful sandbox keeps its proxy across executions and restarts, and
// closes it with itself.
func TestEgressStateful(t *testing.T) {
	t.Parallel()
	w := newEgressWorld(t)
	sb, err := newBackend(t).Create(context.Background(), sandbox.Spec{
		Limits: sandbox.Limits{Timeout: 30 * time.Second},
		Egress: w.proxy(t, "api.example.com:80"),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	fetch := `import urllib.request; print(urllib.request.urlopen("http://api.example.com/", timeout=10).read().decode())`
	for i := range 2 {
		res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: fetch}, nil)
		if err != nil || res.Stdout != "plain hello via api.example.com\n" {
			t.Fatalf("execution %d: %v %+v", i, err, res)
		}
		if err := sb.Restart(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// A command too: it gets the same environment.
	p, err := sb.Start(context.Background(), sandbox.Command{Argv: []string{"/bin/sh", "-c", "echo $HTTP_PROXY"}})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout())
	<-p.Done()
	if string(out) != "http://127.0.0.1:3128\n" {
		t.Errorf("command's HTTP_PROXY: %q", out)
	}
	sb.Close()
	w.mu.Lock()
	closed := w.closed
	w.mu.Unlock()
	if closed == 0 {
		t.Error("the sandbox did not close its proxy")
	}
}

// A backend without network support refuses a spec with an Egress
// instead of dropping it.
func TestEgressRefusedElsewhere(t *testing.T) {
	w := newEgressWorld(t)
	e := w.proxy(t, "api.example.com")
	defer e.Close()
	err := sandbox.CheckEgress(noNetBackend{}, sandbox.Spec{Egress: e})
	if err == nil || !strings.Contains(err.Error(), "the plain backend cannot give a sandbox network access") {
		t.Errorf("CheckEgress: %v", err)
	}
	if err := sandbox.CheckEgress(newBackend(t), sandbox.Spec{Egress: e}); err != nil {
		t.Errorf("native: %v", err)
	}
}

type noNetBackend struct{}

func (noNetBackend) Name() string { return "plain" }
func (noNetBackend) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return nil, nil
}

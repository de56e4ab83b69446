package netproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
)

// The tests' world: names resolve (through the test resolver) to public
// addresses, and the test dialler sends those addresses to real servers
// on this host's loopback, which the policy itself would always refuse.
// Everything but the final connect is the production path.
var (
	publicHTTP  = netip.MustParseAddr("93.184.215.14")
	publicOther = netip.MustParseAddr("93.184.215.15")
)

type resolver map[string][]string

func (r resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range r[host] {
		out = append(out, netip.MustParseAddr(s))
	}
	if len(out) == 0 {
		return nil, errors.New("no such host")
	}
	return out, nil
}

type world struct {
	t       *testing.T
	plain   *httptest.Server
	tls     *httptest.Server
	proxy   *Proxy
	addr    string // the proxy's listener
	dialled atomic.Int64

	mu     sync.Mutex
	events []Event
	hosts  []string // Host headers the plain server saw
}

func newWorld(t *testing.T, rules []string, limits netpolicy.Limits, tweak func(*Config)) *world {
	t.Helper()
	w := &world{t: t}
	w.plain = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.mu.Lock()
		w.hosts = append(w.hosts, r.Host)
		w.mu.Unlock()
		switch {
		case strings.HasPrefix(r.URL.Path, "/big/"):
			var n int
			fmt.Sscan(strings.TrimPrefix(r.URL.Path, "/big/"), &n)
			rw.Write([]byte(strings.Repeat("x", n)))
		case r.URL.Path == "/echo":
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(rw, "%s %d %s", r.Method, len(b), b)
		default:
			fmt.Fprintf(rw, "hello from %s", r.Host)
		}
	}))
	t.Cleanup(w.plain.Close)
	w.tls = httptest.NewTLSServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "secret hello from %s", r.Host)
	}))
	t.Cleanup(w.tls.Close)
	rs, err := netpolicy.ParseRules(rules)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Checker: &netpolicy.Checker{
			Policy: &netpolicy.Policy{Rules: rs, Limits: limits},
			Resolver: resolver{
				"api.example.com":          {publicHTTP.String()},
				"example.com":              {publicHTTP.String()},
				"other.example.com":        {publicOther.String()},
				"rebind.example.com":       {"127.0.0.1"},
				"meta.example.com":         {"169.254.169.254"},
				"metadata.google.internal": {publicHTTP.String()},
			},
		},
		Dial: func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
			w.dialled.Add(1)
			if ap.Addr() != publicHTTP {
				return nil, fmt.Errorf("dial %s: connection refused", ap)
			}
			target := w.plain.Listener.Addr().String()
			if ap.Port() == 443 {
				target = w.tls.Listener.Addr().String()
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", target)
		},
		Audit: func(e Event) {
			w.mu.Lock()
			w.events = append(w.events, e)
			w.mu.Unlock()
		},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.proxy = p
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.addr = l.Addr().String()
	served := make(chan struct{})
	go func() {
		defer close(served)
		p.Serve(l)
	}()
	t.Cleanup(func() {
		p.Close()
		<-served
	})
	return w
}

func (w *world) client() *http.Client {
	u, _ := url.Parse("http://" + w.addr)
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			Proxy:           http.ProxyURL(u),
			TLSClientConfig: &tls.Config{RootCAs: w.tlsRoots()},
		},
	}
}

func (w *world) tlsRoots() *x509.CertPool {
	return w.tls.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
}

// get fetches a URL through the proxy and returns the status line's code
// and reason and the body.
func (w *world) get(u string) (int, string, string) {
	w.t.Helper()
	client := w.client()
	defer client.CloseIdleConnections()
	resp, err := client.Get(u)
	if err != nil {
		return 0, err.Error(), ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Status, string(b)
}

// lastEvent waits for the audit event of the latest connection.
func (w *world) waitEvents(n int) []Event {
	w.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		ev := append([]Event(nil), w.events...)
		w.mu.Unlock()
		if len(ev) >= n || time.Now().After(deadline) {
			if len(ev) < n {
				w.t.Fatalf("%d audit events, want %d: %+v", len(ev), n, ev)
			}
			return ev
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAllowedHTTPAndHTTPS(t *testing.T) {
	w := newWorld(t, []string{"api.example.com", "example.com:443"}, netpolicy.Limits{}, nil)
	code, _, body := w.get("http://api.example.com/hi")
	if code != 200 || body != "hello from api.example.com" {
		t.Fatalf("plain: %d %q", code, body)
	}
	code, _, body = w.get("https://example.com/")
	if code != 200 || body != "secret hello from example.com" {
		t.Fatalf("https: %d %q", code, body)
	}
	// Each connection's event is sent when its handler returns, which
	// may be after the client saw its answer: the order is not known.
	ev := w.waitEvents(2)
	if ev[0].Method == http.MethodConnect {
		ev[0], ev[1] = ev[1], ev[0]
	}
	for i, want := range []struct {
		method, host string
		port         int
	}{{"GET", "api.example.com", 80}, {"CONNECT", "example.com", 443}} {
		e := ev[i]
		if e.Outcome != Allowed || e.Method != want.method || e.Host != want.host || e.Port != want.port ||
			e.BytesIn == 0 || e.BytesOut == 0 || e.Addr == "" {
			t.Errorf("event %d: %+v", i, e)
		}
	}
	// A body goes out and comes back, counted.
	client := w.client()
	defer client.CloseIdleConnections()
	resp, err := client.Post("http://api.example.com/echo", "text/plain", strings.NewReader("ping"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "POST 4 ping" {
		t.Errorf("echo: %q", b)
	}
	if used := w.proxy.Used(); used < 200 {
		t.Errorf("bytes used %d", used)
	}
}

func TestRefused(t *testing.T) {
	w := newWorld(t, []string{"*.example.com", "metadata.google.internal", "169.254.169.254", "example.com:443"},
		netpolicy.Limits{}, nil)
	for _, c := range []struct {
		url, reason string
	}{
		{"http://evil.test/", "evil.test port 80 is not in this sandbox's network allowlist"},
		{"https://evil.test/", "evil.test port 443 is not in this sandbox's network allowlist"},
		{"http://api.example.com:8080/", "api.example.com port 8080 is not in"},
		{"http://rebind.example.com/", "rebind.example.com resolves to 127.0.0.1, a loopback address"},
		{"https://rebind.example.com/", "rebind.example.com resolves to 127.0.0.1, a loopback address"},
		{"http://meta.example.com/latest/meta-data/", "resolves to 169.254.169.254, a link-local address"},
		{"http://169.254.169.254/latest/meta-data/", "169.254.169.254 port 80 is always refused"},
		{"http://metadata.google.internal/", "metadata.google.internal port 80 is always refused: a cloud metadata service"},
		{"http://127.0.0.1:1/", "127.0.0.1 port 1 is always refused: a loopback address"},
		{"http://[::1]/", "::1 port 80 is always refused"},
		{"http://127.1/", "looks like an IP address"},
		{"http://2130706433/", "looks like an IP address"},
	} {
		code, status, _ := w.get(c.url)
		if !strings.Contains(status, c.reason) || (code != 403 && code != 0) {
			t.Errorf("%s: %d %q, want 403 with %q", c.url, code, status, c.reason)
		}
	}
	if n := w.dialled.Load(); n != 0 {
		t.Errorf("%d dials for refused destinations", n)
	}
	for _, e := range w.waitEvents(12) {
		if e.Outcome != Refused || e.Reason == "" || e.BytesIn != 0 {
			t.Errorf("event %+v", e)
		}
	}
}

func TestDialFailure(t *testing.T) {
	w := newWorld(t, []string{"other.example.com"}, netpolicy.Limits{}, nil)
	code, status, _ := w.get("http://other.example.com/")
	if code != 502 || !strings.Contains(status, "could not connect to other.example.com port 80") {
		t.Errorf("%d %q", code, status)
	}
	if e := w.waitEvents(1)[0]; e.Outcome != Failed {
		t.Errorf("event %+v", e)
	}
}

// raw sends bytes to the proxy and returns what it answers before it
// closes (or 5 s pass).
func (w *world) raw(send string, wait time.Duration) string {
	w.t.Helper()
	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		w.t.Fatal(err)
	}
	defer c.Close()
	if send != "" {
		io.WriteString(c, send)
	}
	if wait > 0 {
		time.Sleep(wait)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

func TestHostileRequests(t *testing.T) {
	w := newWorld(t, []string{"api.example.com"}, netpolicy.Limits{}, func(c *Config) {
		c.HeaderTimeout = 300 * time.Millisecond
		c.MaxHeaderBytes = 4096
	})
	for _, c := range []struct {
		name, send, want string
	}{
		{"origin form", "GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n", "400 this is the sandbox's HTTP proxy"},
		{"https absolute", "GET https://api.example.com/ HTTP/1.1\r\nHost: x\r\n\r\n", "400 https:// URLs go through CONNECT"},
		{"ftp", "GET ftp://api.example.com/ HTTP/1.1\r\nHost: x\r\n\r\n", "400 scheme \"ftp\" is not proxied"},
		{"credentials", "GET http://u:p@api.example.com/ HTTP/1.1\r\nHost: x\r\n\r\n", "400 URLs with credentials"},
		{"connect without port", "CONNECT api.example.com HTTP/1.1\r\nHost: x\r\n\r\n", "400 CONNECT needs HOST:PORT"},
		{"connect port 0", "CONNECT api.example.com:0 HTTP/1.1\r\n\r\n", "400 CONNECT needs a port"},
		{"garbage", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", "400 malformed request"},
		{"huge header", "GET http://api.example.com/ HTTP/1.1\r\nX: " + strings.Repeat("a", 10000) + "\r\n\r\n", "431 the request head is over 4096 bytes"},
		{"many headers", "GET http://api.example.com/ HTTP/1.1\r\n" + strings.Repeat("X-A: b\r\n", 2000) + "\r\n", "431"},
		{"slowloris", "GET http://api.example.com/ HTTP/1.1\r\nX-Slow: 1\r\n", "408 no complete request within 300ms"},
		{"header injection in host", "GET http://api.example.com\r\nX: y/ HTTP/1.1\r\n\r\n", "400"},
		{"control chars in host", "CONNECT a\x01b.example.com:443 HTTP/1.1\r\n\r\n", "400"},
		{"metadata via connect", "CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n", "403 vivarium: 169.254.169.254 port 80 is always refused"},
		{"metadata v6 via connect", "CONNECT [fd00:ec2::254]:80 HTTP/1.1\r\n\r\n", "403 vivarium: fd00:ec2::254 port 80 is always refused"},
		{"loopback via connect", "CONNECT localhost:22 HTTP/1.1\r\n\r\n", "403 vivarium: localhost port 22 is always refused"},
	} {
		got := w.raw(c.send, 0)
		if !strings.HasPrefix(got, "HTTP/1.1 "+c.want) {
			t.Errorf("%s: got %q, want HTTP/1.1 %s...", c.name, truncate(got, 200), c.want)
		}
	}
	if n := w.dialled.Load(); n != 0 {
		t.Errorf("%d dials for hostile requests", n)
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// A request smuggled behind another (conflicting Content-Length and
// Transfer-Encoding, or simply pipelined) never reaches the server: the
// proxy forwards one request, written anew, and closes.
func TestSmuggling(t *testing.T) {
	w := newWorld(t, []string{"api.example.com"}, netpolicy.Limits{}, nil)
	got := w.raw("POST http://api.example.com/echo HTTP/1.1\r\nHost: evil.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"+
		"0\r\n\r\nGET http://api.example.com/smuggled HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 0)
	if !strings.HasPrefix(got, "HTTP/1.1 200") || strings.Count(got, "HTTP/1.1") != 1 {
		t.Errorf("answer: %q", got)
	}
	got = w.raw("GET http://api.example.com/one HTTP/1.1\r\nHost: evil.test\r\n\r\nGET http://api.example.com/two HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 0)
	if strings.Count(got, "HTTP/1.1 200") != 1 {
		t.Errorf("pipelined: %q", got)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// The Host header upstream is the checked destination's, never the
	// client's own.
	if len(w.hosts) != 2 || w.hosts[0] != "api.example.com" || w.hosts[1] != "api.example.com" {
		t.Errorf("the server saw Host headers %q", w.hosts)
	}
}

func TestByteLimit(t *testing.T) {
	w := newWorld(t, []string{"api.example.com"}, netpolicy.Limits{MaxBytes: 20000}, nil)
	code, _, body := w.get("http://api.example.com/big/100000")
	if code == 200 && len(body) >= 100000 {
		t.Fatalf("got all %d bytes over a 20000-byte limit", len(body))
	}
	code, status, _ := w.get("http://api.example.com/")
	if code != 403 || !strings.Contains(status, "used its 20000 bytes") {
		t.Errorf("after the limit: %d %q", code, status)
	}
	if used := w.proxy.Used(); used > 20000 {
		t.Errorf("used %d bytes over a limit of 20000", used)
	}
	ev := w.waitEvents(2)
	if ev[0].Reason != errBudget.Error() || ev[1].Outcome != Refused {
		t.Errorf("events %+v", ev)
	}
}

func TestRateLimit(t *testing.T) {
	w := newWorld(t, []string{"api.example.com"}, netpolicy.Limits{Rate: 100 << 10}, nil)
	start := time.Now()
	code, _, body := w.get("http://api.example.com/big/307200")
	took := time.Since(start)
	if code != 200 || len(body) != 307200 {
		t.Fatalf("%d, %d bytes", code, len(body))
	}
	// A burst of 100 KiB, then 100 KiB/s: at least two seconds (a lower
	// bound, which a slow machine only makes longer).
	if took < 1900*time.Millisecond {
		t.Errorf("300 KiB at 100 KiB/s took %v", took)
	}
}

func TestConnectionLimit(t *testing.T) {
	w := newWorld(t, []string{"example.com:443"}, netpolicy.Limits{MaxConns: 2}, nil)
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", w.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "CONNECT example.com:443 HTTP/1.1\r\n\r\n")
		line, err := bufio.NewReader(c).ReadString('\n')
		if !strings.HasPrefix(line, "HTTP/1.1 200") {
			t.Fatalf("tunnel: %q %v", line, err)
		}
		held = append(held, c)
	}
	got := w.raw("CONNECT example.com:443 HTTP/1.1\r\n\r\n", 0)
	if !strings.HasPrefix(got, "HTTP/1.1 429 vivarium: too many connections at once: this sandbox may have 2") {
		t.Errorf("third: %q", got)
	}
	held[0].Close()
	// The slot frees when the first tunnel's end is seen. A tunnel once
	// open stays open: its first line is all there is to read.
	connect := func() string {
		c, err := net.Dial("tcp", w.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "CONNECT example.com:443 HTTP/1.1\r\n\r\n")
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got = connect()
		if strings.HasPrefix(got, "HTTP/1.1 200") || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.HasPrefix(got, "HTTP/1.1 200") {
		t.Errorf("after one closed: %q", truncate(got, 100))
	}
}

// Close ends open tunnels at once and returns when every goroutine has.
func TestCloseEndsEverything(t *testing.T) {
	w := newWorld(t, []string{"example.com:443"}, netpolicy.Limits{}, nil)
	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "CONNECT example.com:443 HTTP/1.1\r\n\r\n")
	br := bufio.NewReader(c)
	if line, _ := br.ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("tunnel: %q", line)
	}
	done := make(chan struct{})
	go func() {
		w.proxy.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadAll(br); err != nil {
		t.Errorf("the tunnel did not end: %v", err)
	}
	if _, err := net.DialTimeout("tcp", w.addr, time.Second); err == nil {
		t.Error("the listener still accepts")
	}
	if e := w.waitEvents(1)[0]; e.Outcome != Allowed {
		t.Errorf("event %+v", e)
	}
}

func TestServices(t *testing.T) {
	svc := NewInProcess(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(rw, "index at %s%s", r.Host, r.URL.Path)
	}), nil)
	defer svc.Close()
	w := newWorld(t, []string{"api.example.com"}, netpolicy.Limits{}, func(c *Config) {
		c.Services = map[string]func(context.Context) (net.Conn, error){"packages.vivarium.internal": svc.Dial}
	})
	code, _, body := w.get("http://packages.vivarium.internal/simple/")
	if code != 200 || body != "index at packages.vivarium.internal/simple/" {
		t.Errorf("%d %q", code, body)
	}
	if e := w.waitEvents(1)[0]; e.Outcome != Allowed || e.Host != "packages.vivarium.internal" || e.BytesIn == 0 {
		t.Errorf("event %+v", e)
	}
	if w.dialled.Load() != 0 {
		t.Error("a service was dialled over the network")
	}
}

// Whatever bytes a sandbox sends, the proxy dials nothing the policy
// does not allow, and answers or closes.
func FuzzRequest(f *testing.F) {
	for _, s := range []string{
		"GET http://api.example.com/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"CONNECT api.example.com:443 HTTP/1.1\r\n\r\n",
		"CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n",
		"POST http://api.example.com/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	} {
		f.Add(s)
	}
	rs, _ := netpolicy.ParseRules([]string{"api.example.com"})
	f.Fuzz(func(t *testing.T, s string) {
		p, err := New(Config{
			Checker: &netpolicy.Checker{Policy: &netpolicy.Policy{Rules: rs},
				Resolver: resolver{"api.example.com": {publicHTTP.String()}, "x.example.com": {"127.0.0.1"}}},
			Dial: func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
				if ap.Addr() != publicHTTP || (ap.Port() != 80 && ap.Port() != 443) {
					t.Errorf("dialled %s", ap)
				}
				a, b := net.Pipe()
				go func() {
					b.SetDeadline(time.Now().Add(time.Second))
					io.Copy(io.Discard, b)
					b.Close()
				}()
				return a, nil
			},
			HeaderTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() {
			p.ServeConn(server)
			close(done)
		}()
		go func() {
			client.SetWriteDeadline(time.Now().Add(time.Second))
			io.WriteString(client, s)
		}()
		client.SetReadDeadline(time.Now().Add(2 * time.Second))
		io.Copy(io.Discard, client)
		client.Close()
		<-done
	})
}

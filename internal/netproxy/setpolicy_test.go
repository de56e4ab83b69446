package netproxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
)

// tunnel opens a CONNECT tunnel to host:port through the proxy and
// checks the proxy answered 200.
func (w *world) tunnel(hostport string) (net.Conn, *bufio.Reader) {
	w.t.Helper()
	c, err := net.Dial("tcp", w.addr)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { c.Close() })
	io.WriteString(c, "CONNECT "+hostport+" HTTP/1.1\r\nHost: "+hostport+"\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		w.t.Fatalf("CONNECT %s: %v %v", hostport, resp, err)
	}
	return c, br
}

// roundTrip sends a plain GET through an open tunnel to the test's
// plain server and returns the body, or the error.
func roundTrip(c net.Conn, br *bufio.Reader) (string, error) {
	c.SetDeadline(time.Now().Add(10 * time.Second)) // a bound on failure, not a timing assertion
	if _, err := io.WriteString(c, "GET /tunnelled HTTP/1.1\r\nHost: api.example.com\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(len("hello from api.example.com"))))
	return string(b), err
}

func policy(t *testing.T, allow, deny, except []string) *netpolicy.Policy {
	t.Helper()
	rs, err := netpolicy.ParseRules(allow)
	if err != nil {
		t.Fatal(err)
	}
	d, err := netpolicy.ParseRulesAnyPort(deny)
	if err != nil {
		t.Fatal(err)
	}
	e, err := netpolicy.ParseRulesAnyPort(except)
	if err != nil {
		t.Fatal(err)
	}
	return &netpolicy.Policy{Rules: rs, Deny: d, Except: e}
}

// TestSetPolicy: a policy change decides every later connection, and
// closes the open ones it refuses (their events say why), leaving the
// others alone.
func TestSetPolicy(t *testing.T) {
	w := newWorld(t, []string{"*.example.com:*", "93.184.215.0/24:*"}, netpolicy.Limits{}, nil)
	if code, _, body := w.get("http://api.example.com/"); code != 200 {
		t.Fatalf("before: %d %s", code, body)
	}
	kept, keptBr := w.tunnel("api.example.com:80")
	doomed, doomedBr := w.tunnel(publicHTTP.String() + ":80")
	for _, c := range []struct {
		conn net.Conn
		br   *bufio.Reader
	}{{kept, keptBr}, {doomed, doomedBr}} {
		if body, err := roundTrip(c.conn, c.br); err != nil || body != "hello from api.example.com" {
			t.Fatalf("through a tunnel before the change: %q %v", body, err)
		}
	}

	// Deny the address: the tunnel to the IP literal closes; the tunnel
	// to the name, which reached the same address, stays, since an
	// exception lists the name.
	w.proxy.SetPolicy(policy(t, []string{"*.example.com:*", "93.184.215.0/24:*"}, []string{"93.184.215.14"}, []string{"api.example.com"}))
	if _, err := roundTrip(doomed, doomedBr); err == nil {
		t.Error("a tunnel to a denied address carried on after the change")
	}
	if body, err := roundTrip(kept, keptBr); err != nil || body != "hello from api.example.com" {
		t.Errorf("a tunnel the new policy allows was disturbed: %q %v", body, err)
	}
	if code, status, _ := w.get("http://" + publicHTTP.String() + "/"); code != 403 || !strings.Contains(status, "deny list") {
		t.Errorf("a new connection to the denied address: %d %s", code, status)
	}
	if code, _, body := w.get("http://api.example.com/"); code != 200 {
		t.Errorf("a new connection to the excepted name: %d %s", code, body)
	}

	// Nothing at all: the kept tunnel closes too, new connections are
	// refused.
	w.proxy.SetPolicy(nil)
	if _, err := roundTrip(kept, keptBr); err == nil {
		t.Error("a tunnel carried on after the policy was taken away")
	}
	if code, status, _ := w.get("http://api.example.com/"); code != 403 || !strings.Contains(status, "no network access") {
		t.Errorf("after the policy was taken away: %d %s", code, status)
	}
	// And back.
	w.proxy.SetPolicy(policy(t, []string{"api.example.com"}, nil, nil))
	if code, _, body := w.get("http://api.example.com/"); code != 200 {
		t.Errorf("after access was given back: %d %s", code, body)
	}
	// The two tunnels' events say why they closed. (A plain request
	// whose response was sent, but whose handler had not yet returned
	// when the policy changed, may say so too.)
	closed := 0
	for _, ev := range w.waitEvents(7) {
		if ev.Method == http.MethodConnect && strings.Contains(ev.Reason, "closed when the sandbox's network policy changed") {
			closed++
		}
	}
	if closed != 2 {
		t.Errorf("%d tunnels' events say a policy change closed them, want 2: %+v", closed, w.waitEvents(7))
	}
}

// flipResolver answers a name with one address, then with another: DNS
// rebinding.
type flipResolver struct {
	mu    sync.Mutex
	n     int
	first netip.Addr
	then  netip.Addr
}

func (f *flipResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if f.n == 1 {
		return []netip.Addr{f.first}, nil
	}
	return []netip.Addr{f.then}, nil
}

// A name that rebinds to an address of the sandbox's deny list is refused
// there and never dialled; an open connection is judged by the address it
// was made to, the name not being resolved again.
func TestDenyRebinding(t *testing.T) {
	flip := &flipResolver{first: publicHTTP, then: publicOther}
	w := newWorld(t, []string{"*.example.com:*"}, netpolicy.Limits{}, func(c *Config) {
		c.Checker.Resolver = flip
		c.Checker.Policy.Deny = policy(t, nil, []string{publicOther.String()}, nil).Deny
	})
	conn, br := w.tunnel("flip.example.com:80")
	if body, err := roundTrip(conn, br); err != nil || body != "hello from api.example.com" {
		t.Fatalf("through the tunnel: %q %v", body, err)
	}
	dialled := w.dialled.Load()
	if code, status, _ := w.get("http://flip.example.com/"); code != 403 ||
		!strings.Contains(status, "resolves to "+publicOther.String()+", an address in this sandbox's deny list") {
		t.Errorf("after rebinding: %d %s", code, status)
	}
	if w.dialled.Load() != dialled {
		t.Error("the denied address was dialled")
	}
	// A change that denies the name's new address leaves the open tunnel,
	// made to its old one, alone; one that denies the old address closes it.
	w.proxy.SetPolicy(policy(t, []string{"*.example.com:*"}, []string{publicOther.String()}, nil))
	if body, err := roundTrip(conn, br); err != nil || body != "hello from api.example.com" {
		t.Errorf("the tunnel after an unrelated change: %q %v", body, err)
	}
	w.proxy.SetPolicy(policy(t, []string{"*.example.com:*"}, []string{publicHTTP.String() + "/31"}, nil))
	if _, err := roundTrip(conn, br); err == nil {
		t.Error("the tunnel to a now denied address carried on")
	}
}

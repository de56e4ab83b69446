package pkgindex

import (
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// target is a server on another loopback port that a hostile index would
// send the relay to: it counts the connections it gets.
type target struct {
	addr  string
	conns atomic.Int64
}

func newTarget(t *testing.T) *target {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tg := &target{addr: l.Addr().String()}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tg.conns.Add(1)
			c.Close()
		}
	}()
	return tg
}

// A hostile index (here on loopback, an operator's local mirror) cannot
// send the relay anywhere but itself and the public internet: not by
// redirecting its pages or its files to another loopback port, to the
// metadata address or to a name that leads to loopback, nor by linking
// files there. The targets get no connection. Its own redirects within
// itself are followed.
func TestRelayRefusesToBeSentToLocalAddresses(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(testutil.Wheel(t, dir, "tiny-pkg", "1.0", map[string]string{"tiny_pkg/__init__.py": ""}))
	if err != nil {
		t.Fatal(err)
	}
	sum := fmt.Sprintf("%x", sha256.Sum256(data))
	tg := newTarget(t)
	_, tgPort, _ := net.SplitHostPort(tg.addr)
	elsewhere := map[string]string{ // where each project's page or file is sent
		"loopback-port": "http://" + tg.addr,
		"by-name":       "http://localhost:" + tgPort,
		"metadata":      "http://169.254.169.254",
		"metadata-v6":   "http://[fe80::a9fe:a9fe]",
	}
	wheel := func(project string) string { return strings.ReplaceAll(project, "-", "_") + "-1.0-py3-none-any.whl" }
	index := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dir, rest, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		project := strings.TrimSuffix(rest, "/")
		kind, name, _ := strings.Cut(project, "-") // redirect-, link-, file-, moved-
		switch {
		case dir == "simple" && kind == "moved":
			// A page moved within the index: followed.
			http.Redirect(w, r, "/mirror/"+project+"/", http.StatusFound)
		case dir == "simple" && kind == "redirect":
			// A page sent elsewhere.
			http.Redirect(w, r, elsewhere[name]+"/simple/"+project+"/", http.StatusFound)
		case dir == "simple" || dir == "mirror":
			// A page whose file is the index's own, linked elsewhere, or
			// redirected elsewhere (by /files/).
			href := "/files/" + project + "/" + wheel(project)
			if kind == "link" {
				href = elsewhere[name] + "/" + wheel(project)
			}
			fmt.Fprintf(w, `<a href="%s#sha256=%s">%s</a>`, href, sum, wheel(project))
		case dir == "files" && strings.HasPrefix(project, "file-"):
			p, _, _ := strings.Cut(project, "/")
			_, name, _ := strings.Cut(p, "-")
			http.Redirect(w, r, elsewhere[name]+"/"+wheel(p), http.StatusFound)
		case dir == "files":
			w.Write(data)
		default:
			http.NotFound(w, r)
		}
	}))
	defer index.Close()
	var allowed []Allowed
	names := []string{"tiny-pkg", "moved-tiny-pkg"}
	for name := range elsewhere {
		names = append(names, "redirect-"+name, "link-"+name, "file-"+name)
	}
	for _, n := range names {
		allowed = append(allowed, Allowed{Name: n})
	}
	var logged testutil.Buffer
	ix, err := New(Config{Upstream: index.URL + "/simple/", Allowed: allowed, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// fetch lists a project and fetches its one file; the codes of both.
	fetch := func(project string) (int, int) {
		code, body := get(t, ix, "/simple/"+project+"/")
		links := linkRE.FindAllStringSubmatch(body, -1)
		if code != 200 || len(links) != 1 {
			return code, 0
		}
		code2, _ := get(t, ix, links[0][1])
		return code, code2
	}

	// The index's own, and its pages moved within it: served.
	for _, p := range []string{"tiny-pkg", "moved-tiny-pkg"} {
		if page, file := fetch(p); page != 200 || file != 200 {
			t.Errorf("%s: page %d, file %d; want 200 and 200", p, page, file)
		}
	}
	for name := range elsewhere {
		// A page redirected elsewhere: the page fails.
		if page, _ := fetch("redirect-" + name); page != http.StatusBadGateway {
			t.Errorf("a page redirected to %s: %d, want 502", name, page)
		}
		// A file linked or redirected elsewhere: the page lists it, its
		// fetch fails on the address.
		for _, how := range []string{"link-", "file-"} {
			before := strings.Count(logged.String(), ErrRefusedAddress.Error())
			if page, file := fetch(how + name); page != 200 || file != http.StatusBadGateway {
				t.Errorf("%s%s: page %d, file %d; want 200 and 502", how, name, page, file)
			}
			if strings.Count(logged.String(), ErrRefusedAddress.Error()) != before+1 {
				t.Errorf("%s%s: the relay did not refuse the address itself:\n%s", how, name, logged.String())
			}
		}
	}
	if n := tg.conns.Load(); n != 0 {
		t.Errorf("the other loopback port got %d connections", n)
	}
	t.Logf("log:\n%s", logged.String())
}

// Which addresses a relay reaches: the configured index's own at any
// loopback or private address, every other host at public ones only,
// nobody at link-local, metadata, unspecified or multicast ones.
func TestRelayAddresses(t *testing.T) {
	r := newRelay(mustURL(t, "http://mirror.internal:3141/simple/"))
	for _, c := range []struct {
		addr            string
		origin, another bool
	}{
		{"93.184.215.14", true, true},
		{"2606:2800:220:1::1", true, true},
		{"127.0.0.1", true, false},
		{"::1", true, false},
		{"10.1.2.3", true, false},
		{"192.168.0.10", true, false},
		{"fd00::1", true, false},
		{"::ffff:127.0.0.1", true, false},
		{"169.254.169.254", false, false},
		{"fe80::1", false, false},
		{"fd00:ec2::254", false, false},
		{"100.100.100.200", false, false},
		{"0.0.0.0", false, false},
		{"::", false, false},
		{"224.0.0.1", false, false},
		{"ff02::1", false, false},
		{"255.255.255.255", false, false},
	} {
		a := netip.MustParseAddr(c.addr)
		if err := r.allowed(a, true); (err == nil) != c.origin {
			t.Errorf("%s for the index: %v", c.addr, err)
		}
		if err := r.allowed(a, false); (err == nil) != c.another {
			t.Errorf("%s for another host: %v", c.addr, err)
		}
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

package e2b

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func newSignedServer(t *testing.T) (*httptest.Server, *Server) {
	t.Helper()
	svc := service.New(service.Config{Backend: fakeBackend{t.TempDir()}})
	t.Cleanup(func() { svc.Close() })
	h := New(Config{Service: svc, Auth: keys{"key-a": "a", "key-b": "b"}, Prefix: "/e2b"})
	mux := http.NewServeMux()
	mux.Handle("/e2b/", h)
	mux.Handle("/files", h.SignedFiles())
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts, h
}

// signedURL builds a URL as E2B's SDK does (Sandbox.downloadUrl and
// uploadUrl).
func signedURL(base, path, op, user, token string, expires int64) string {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("username", user)
	}
	exp := ""
	if expires != 0 {
		exp = strconv.FormatInt(expires, 10)
		q.Set("signature_expiration", exp)
	}
	q.Set("signature", fileSignature(path, op, user, token, exp))
	return base + "/files?" + q.Encode()
}

func TestSignedURLs(t *testing.T) {
	ts, _ := newSignedServer(t)
	c := client{t, ts.URL}
	a := c.create("key-a", `{"secure":true}`)
	b := c.create("key-b", `{"secure":true}`) // another owner's
	h := sandboxHeaders(a, envdPort)
	h["Content-Type"] = "application/octet-stream"
	c.do("POST", "/e2b/sandbox/files?path=hello.txt", strings.NewReader("hello world"), h)
	c.do("POST", "/e2b/sandbox/files?path=secret.txt", strings.NewReader("secret"), h)
	later := time.Now().Add(time.Hour).Unix()

	get := func(u string) (int, string) {
		t.Helper()
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var sb strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp.StatusCode, sb.String()
	}
	if code, body := get(signedURL(ts.URL, "hello.txt", "read", "", a.EnvdAccessToken, later)); code != 200 || body != "hello world" {
		t.Fatalf("download: %d %s", code, body)
	}
	if code, body := get(signedURL(ts.URL, "hello.txt", "read", "user", a.EnvdAccessToken, 0)); code != 200 || body != "hello world" {
		t.Fatalf("download without expiry, as user: %d %s", code, body)
	}
	if code, body := get(signedURL(ts.URL, "hello.txt", "read", "", a.EnvdAccessToken, time.Now().Add(-time.Minute).Unix())); code != 401 ||
		body != `{"code":401,"message":"signature is already expired"}`+"\n" {
		t.Fatalf("expired: %d %s", code, body)
	}

	// Upload: multipart, the part without a file name, as a browser form.
	up := signedURL(ts.URL, "up.txt", "write", "", a.EnvdAccessToken, later)
	body := "--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nfile content\r\n--B--\r\n"
	resp, out := c.do("POST", strings.TrimPrefix(up, ts.URL), strings.NewReader(body), map[string]string{"Content-Type": "multipart/form-data; boundary=B"})
	if resp.StatusCode != 200 || string(out) != `[{"name":"up.txt","type":"file","path":"/home/user/up.txt"}]`+"\n" {
		t.Fatalf("upload: %d %s", resp.StatusCode, out)
	}
	if code, body := get(signedURL(ts.URL, "up.txt", "read", "", a.EnvdAccessToken, 0)); code != 200 || body != "file content" {
		t.Fatalf("uploaded: %d %s", code, body)
	}

	// What a signature does not open.
	good := signedURL(ts.URL, "hello.txt", "read", "", a.EnvdAccessToken, later)
	for name, u := range map[string]string{
		"another path":           strings.Replace(good, "path=hello.txt", "path=secret.txt", 1),
		"another expiry":         strings.Replace(good, strconv.FormatInt(later, 10), strconv.FormatInt(later+3600, 10), 1),
		"no expiry":              strings.Replace(good, "signature_expiration="+strconv.FormatInt(later, 10), "", 1),
		"another user":           good + "&username=root",
		"another sandbox's file": signedURL(ts.URL, "hello.txt", "read", "", b.EnvdAccessToken+"x", later),
		"forged":                 signedURL(ts.URL, "hello.txt", "read", "", "not-a-token", later),
		"no signature":           ts.URL + "/files?path=hello.txt",
		"no path":                signedURL(ts.URL, "", "read", "", a.EnvdAccessToken, later),
	} {
		if code, body := get(u); code != 401 && code != 400 {
			t.Errorf("%s: %d %s", name, code, body)
		}
	}
	// A write signature does not read, and a read signature does not write.
	w := signedURL(ts.URL, "hello.txt", "write", "", a.EnvdAccessToken, later)
	if code, _ := get(w); code != 401 {
		t.Errorf("a write URL read: %d", code)
	}
	r := signedURL(ts.URL, "evil.txt", "read", "", a.EnvdAccessToken, later)
	if resp, _ := c.do("POST", strings.TrimPrefix(r, ts.URL), strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream"}); resp.StatusCode != 401 {
		t.Errorf("a read URL wrote: %d", resp.StatusCode)
	}
	// The other owner's sandbox's own URL opens its files, not a's.
	if code, _ := get(signedURL(ts.URL, "hello.txt", "read", "", b.EnvdAccessToken, later)); code != 404 {
		t.Errorf("b's signature on a's file name: %d, want 404 (b has no such file)", code)
	}
	// A gateway's probe: 204 for the URL of a sandbox held here, and
	// nothing read or written; the answer to a forged one is unchanged.
	probe := func(method, u, body string) int {
		resp, _ := c.do(method, strings.TrimPrefix(u, ts.URL), strings.NewReader(body),
			map[string]string{SignedProbeHeader: "1", "Content-Type": "application/octet-stream"})
		return resp.StatusCode
	}
	if code := probe("POST", signedURL(ts.URL, "probed.txt", "write", "", a.EnvdAccessToken, later), "x"); code != 204 {
		t.Errorf("a probe of a write URL: %d, want 204", code)
	}
	if code, _ := get(signedURL(ts.URL, "probed.txt", "read", "", a.EnvdAccessToken, 0)); code != 404 {
		t.Errorf("a probe wrote the file: %d, want 404", code)
	}
	if code := probe("GET", signedURL(ts.URL, "hello.txt", "read", "", "not-a-token", later), ""); code != 401 {
		t.Errorf("a probe of a forged URL: %d, want 401", code)
	}
	// A killed sandbox's URLs open nothing.
	c.do("DELETE", "/e2b/sandboxes/"+a.SandboxID, nil, map[string]string{"X-API-Key": "key-a"})
	if code, _ := get(good); code != 401 {
		t.Errorf("after kill: %d", code)
	}
}

// clientFrom is an HTTP client whose connections come from the local
// address ip (any of 127/8 reaches the test server).
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

// A flood of forged signed URLs from one address holds one scan at a
// time, however many it sends: another address's valid download and
// upload are served while the flood's scan is held, and a URL sent to its
// sandbox's own host is checked without a scan.
func TestSignedFloodStallsNoOne(t *testing.T) {
	ts, h := newSignedServer(t)
	c := client{t, ts.URL}
	a := c.create("key-a", `{}`)
	hdr := sandboxHeaders(a, envdPort)
	hdr["Content-Type"] = "application/octet-stream"
	c.do("POST", "/e2b/sandbox/files?path=hello.txt", strings.NewReader("hello world"), hdr)
	later := time.Now().Add(time.Hour).Unix()

	// The flood's scans wait in the hook until the test is done: each
	// holds its slot as long as a slow scan would.
	held, release := make(chan struct{}), make(chan struct{})
	var heldOnce sync.Once
	var mu sync.Mutex
	scans := map[string]int{}
	h.signScanning = func(addr string) {
		mu.Lock()
		scans[addr]++
		mu.Unlock()
		if addr == "127.0.0.2" {
			heldOnce.Do(func() { close(held) })
			<-release
		}
	}
	released := sync.OnceFunc(func() { close(release) })
	defer released()

	flooder := clientFrom("127.0.0.2")
	stop := make(chan struct{})
	var refused atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := flooder.Get(signedURL(ts.URL, "hello.txt", "read", "", "forged-"+randomID(), later))
				if err != nil {
					return
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					refused.Add(1)
				}
			}
		})
	}
	defer func() { close(stop); released(); wg.Wait() }()
	<-held
	// Another address, meanwhile: its URLs are checked and served. (A
	// server with one scan at a time would keep them waiting until the
	// client's deadline.)
	other := clientFrom("127.0.0.1")
	other.Timeout = 30 * time.Second
	get := func(u string) (int, string) {
		t.Helper()
		resp, err := other.Get(u)
		if err != nil {
			t.Fatalf("127.0.0.1's request during the flood: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(signedURL(ts.URL, "hello.txt", "read", "", a.EnvdAccessToken, later)); code != 200 || body != "hello world" {
		t.Fatalf("a valid download during the flood: %d %s", code, body)
	}
	form := "--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nuploaded\r\n--B--\r\n"
	resp, err := other.Post(signedURL(ts.URL, "up.txt", "write", "", a.EnvdAccessToken, later), "multipart/form-data; boundary=B",
		strings.NewReader(form))
	if err != nil {
		t.Fatalf("a valid upload during the flood: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a valid upload during the flood: %d", resp.StatusCode)
	}
	if code, body := get(signedURL(ts.URL, "up.txt", "read", "", a.EnvdAccessToken, 0)); code != 200 || body != "uploaded" {
		t.Fatalf("the upload: %d %s", code, body)
	}
	if code, _ := get(signedURL(ts.URL, "hello.txt", "read", "", "forged", later)); code != http.StatusUnauthorized {
		t.Errorf("127.0.0.1's forged URL during the flood: %d, want 401", code)
	}

	// The flood's other requests are refused, not queued.
	testutil.WaitFor(t, time.Minute, "the flood's other requests to be answered 429", func() bool { return refused.Load() > 0 })

	// At the sandbox's own host (what cmd/vivarium's e2bHosts makes of
	// 49983-<id>.DOMAIN/files): that sandbox's token alone, no scan.
	mu.Lock()
	before := scans["127.0.0.1"]
	mu.Unlock()
	hostForm := func(u string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", strings.Replace(u, ts.URL+"/files", ts.URL+"/e2b/sandbox/files", 1), nil)
		req.Header.Set("E2b-Sandbox-Id", a.SandboxID)
		req.Header.Set("E2b-Sandbox-Port", envdPort)
		resp, err := other.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := hostForm(signedURL(ts.URL, "hello.txt", "read", "", a.EnvdAccessToken, later)); code != 200 || body != "hello world" {
		t.Fatalf("a valid download at the sandbox's host: %d %s", code, body)
	}
	if code, _ := hostForm(signedURL(ts.URL, "hello.txt", "read", "", "forged", later)); code != http.StatusUnauthorized {
		t.Errorf("a forged URL at the sandbox's host: %d, want 401", code)
	}
	b := c.create("key-b", `{}`)
	if code, _ := hostForm(signedURL(ts.URL, "hello.txt", "read", "", b.EnvdAccessToken, later)); code != http.StatusUnauthorized {
		t.Errorf("another sandbox's URL at this sandbox's host: %d, want 401", code)
	}
	mu.Lock()
	after := scans["127.0.0.1"]
	mu.Unlock()
	if after != before {
		t.Errorf("URLs at the sandbox's host scanned %d times", after-before)
	}
	mu.Lock()
	if n := scans["127.0.0.2"]; n != 1 {
		t.Errorf("the flood ran %d scans at once, want 1", n)
	}
	mu.Unlock()
}

// The parsing of signed URLs refuses what it must with a message, and
// its check (a hash of the part no token changes, cloned for each token)
// agrees with the SDK's signature made in full.
func FuzzSignedURL(f *testing.F) {
	const token = "a2V5X2E.bWFj"
	query := func(path, op, user string, expires int64, tok string) string {
		_, q, _ := strings.Cut(signedURL("", path, op, user, tok, expires), "?")
		return q
	}
	for _, s := range []struct{ method, query string }{
		{"GET", query("hello.txt", "read", "", 0, token)},
		{"GET", query("/home/user/a b.txt", "read", "user", 1795934094, token)},
		{"POST", query("up.txt", "write", "root", -1, token)},
		{"POST", query("up.txt", "read", "", 0, token)}, // a read URL written
		{"GET", query("x", "read", "", 0, "another")},
		{"GET", query("", "read", "", 0, token)},
		{"PUT", query("x", "write", "", 0, token)},
		{"GET", "path=x&signature=v1_"},
		{"GET", "path=x&signature=v1_" + strings.Repeat("A", 43)},
		{"GET", "path=x&signature=v1_" + strings.Repeat("A", 42) + "B"}, // spare bits set
		{"GET", "path=x&signature=v1_" + strings.Repeat("A", 21) + "%0A" + strings.Repeat("A", 22)},
		{"GET", "path=x&signature=v1_" + strings.Repeat("A", 44)},
		{"GET", "path=x;signature=v1_x"},
		{"GET", "path=x&signature_expiration=soon&signature=v1_" + strings.Repeat("A", 43)},
		{"GET", "path=%zz&signature=v1_x"},
		{"GET", "path=x&path=y&username=&signature=v2_abc&signature=v1_abc"},
		{"GET", "path=" + strings.Repeat("a", maxSignature) + "&signature=v1_x"},
	} {
		f.Add(s.method, s.query, token)
	}
	f.Fuzz(func(t *testing.T, method, rawQuery, tok string) {
		p, bad := parseSigned(method, rawQuery)
		if bad != nil {
			if p != nil || bad.Code < 400 || bad.Code > 499 || bad.Message == "" {
				t.Fatalf("refused with %+v and %+v", p, bad)
			}
			return
		}
		q, _ := url.ParseQuery(rawQuery)
		if p.path == "" || p.path != q.Get("path") || p.user != q.Get("username") || p.exp != q.Get("signature_expiration") ||
			(p.op == "read") != (method == http.MethodGet) || len(rawQuery) > maxSignature {
			t.Fatalf("%q parsed as %+v", rawQuery, p)
		}
		want := fileSignature(p.path, p.op, p.user, tok, p.exp) == q.Get("signature")
		if got := p.madeWith(tok); got != want {
			t.Fatalf("%q with token %q: madeWith %v, the SDK's signature says %v", rawQuery, tok, got, want)
		}
		// What the SDK makes of these parts with this token opens them.
		again := url.Values{"path": {p.path}, "signature": {fileSignature(p.path, p.op, p.user, tok, p.exp)}}
		if p.user != "" {
			again.Set("username", p.user)
		}
		if p.exp != "" {
			again.Set("signature_expiration", p.exp)
		}
		if enc := again.Encode(); len(enc) <= maxSignature {
			p2, bad := parseSigned(method, enc)
			if bad != nil || !p2.madeWith(tok) || p2.madeWith(tok+"x") {
				t.Fatalf("the SDK's URL %q: %+v %+v", enc, p2, bad)
			}
		}
	})
}

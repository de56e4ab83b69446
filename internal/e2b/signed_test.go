package e2b

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/service"
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

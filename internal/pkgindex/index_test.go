package pkgindex

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func TestParseAllowed(t *testing.T) {
	for _, c := range []struct{ in, name, version string }{
		{"requests", "requests", ""},
		{"Foo_Bar.baz", "foo-bar-baz", ""},
		{"tiny-pkg==1.0.2", "tiny-pkg", "1.0.2"},
		{"x==1.0rc1+local", "x", "1.0rc1+local"},
	} {
		a, err := ParseAllowed(c.in)
		if err != nil || a.Name != c.name || (c.version != "" && (len(a.Versions) != 1 || a.Versions[0] != c.version)) {
			t.Errorf("ParseAllowed(%q) = %+v, %v", c.in, a, err)
		}
	}
	for _, bad := range []string{"", "-x", "a b", "../x", "x==", "x==1 2", "x==<1", "x>=1"} {
		if _, err := ParseAllowed(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseAllowed(%q): %v", bad, err)
		}
	}
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "http://"+Host+path, nil))
	return rec.Code, rec.Body.String()
}

var linkRE = regexp.MustCompile(`href="(/files/[^"#]+)#sha256=([0-9a-f]{64})"`)

func TestDirIndex(t *testing.T) {
	dir := t.TempDir()
	testutil.Wheel(t, dir, "tiny-pkg", "1.0", map[string]string{"tiny_pkg/__init__.py": "V = 1\n"})
	testutil.Wheel(t, dir, "tiny-pkg", "2.0", map[string]string{"tiny_pkg/__init__.py": "V = 2\n"})
	testutil.Wheel(t, dir, "other", "1.0", map[string]string{"other/__init__.py": ""})
	os.WriteFile(filepath.Join(dir, "tiny_pkg-3.0.tar.gz"), []byte("sdist"), 0o644)
	ix, err := New(Config{Dir: dir, Allowed: []Allowed{{Name: "tiny-pkg", Versions: []string{"2.0"}}, {Name: "free"}}})
	if err != nil {
		t.Fatal(err)
	}
	code, body := get(t, ix, "/simple/")
	if code != 200 || !strings.Contains(body, "/simple/tiny-pkg/") || strings.Contains(body, "other") {
		t.Errorf("root: %d %s", code, body)
	}
	code, body = get(t, ix, "/simple/tiny-pkg/")
	links := linkRE.FindAllStringSubmatch(body, -1)
	if code != 200 || len(links) != 1 || !strings.Contains(links[0][1], "tiny_pkg-2.0-py3-none-any.whl") {
		t.Fatalf("project page: %d %s", code, body)
	}
	code, whl := get(t, ix, links[0][1])
	sum := sha256.Sum256([]byte(whl))
	if code != 200 || hex.EncodeToString(sum[:]) != links[0][2] {
		t.Errorf("file: %d, hash %x, listed %s", code, sum, links[0][2])
	}
	for path, want := range map[string]int{
		"/simple/other/":    404, // not allowed
		"/simple/Tiny_Pkg/": 301, // to the normal name
		"/files/tiny-pkg/tiny_pkg-1.0-py3-none-any.whl": 404, // version not allowed
		"/files/other/other-1.0-py3-none-any.whl":       404,
		"/files/tiny-pkg/../other-1.0-py3-none-any.whl": 404,
		"/files/tiny-pkg/tiny_pkg-3.0.tar.gz":           404,
		"/etc/passwd":                                   404,
	} {
		if code, _ := get(t, ix, path); code != want {
			t.Errorf("%s: %d, want %d", path, code, want)
		}
	}
	for _, c := range []struct {
		name, version string
		ok            bool
	}{{"tiny-pkg", "2.0", true}, {"Tiny_Pkg", "", true}, {"tiny-pkg", "1.0", false}, {"other", "", false}, {"free", "9", true}} {
		if err := ix.Allows(c.name, c.version); (err == nil) != c.ok {
			t.Errorf("Allows(%s, %s) = %v", c.name, c.version, err)
		}
	}
	if err := ix.Allows("other", ""); err == nil || !strings.Contains(err.Error(), "other is not on this server's package allowlist (it allows: free, tiny-pkg==2.0)") {
		t.Errorf("refusal: %v", err)
	}
}

func TestUpstreamIndex(t *testing.T) {
	dir := t.TempDir()
	good := testutil.Wheel(t, dir, "tiny-pkg", "1.0", map[string]string{"tiny_pkg/__init__.py": "V = 1\n"})
	data, _ := os.ReadFile(good)
	sum := sha256.Sum256(data)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/simple/tiny-pkg/":
			fmt.Fprintf(w, `<html><body>
<a href="../../packages/tiny_pkg-1.0-py3-none-any.whl#sha256=%x" data-requires-python="&gt;=3">tiny_pkg-1.0-py3-none-any.whl</a>
<a href="/packages/tiny_pkg-1.1-py3-none-any.whl#sha256=%x">tiny_pkg-1.1-py3-none-any.whl</a>
<a href="/packages/tiny_pkg-1.0.tar.gz#sha256=%x">sdist</a>
<a href="/packages/tiny_pkg-0.9-py3-none-any.whl">no hash</a>
<a href="file:///etc/tiny_pkg-1.0-py3-none-any.whl#sha256=%x">local</a>
</body></html>`, sum, sum, sum, sum)
		case "/packages/tiny_pkg-1.0-py3-none-any.whl":
			w.Write(data)
		default:
			http.NotFound(w, r)
		}
	}))
	defer upstream.Close()
	ix, err := New(Config{Upstream: upstream.URL + "/simple", Allowed: []Allowed{{Name: "tiny-pkg", Versions: []string{"1.0", "0.9"}}}})
	if err != nil {
		t.Fatal(err)
	}
	code, body := get(t, ix, "/simple/tiny-pkg/")
	links := linkRE.FindAllStringSubmatch(body, -1)
	if code != 200 || len(links) != 1 || links[0][1] != "/files/tiny-pkg/tiny_pkg-1.0-py3-none-any.whl" {
		t.Fatalf("project page: %d %s", code, body)
	}
	code, got := get(t, ix, links[0][1])
	if code != 200 || got != string(data) {
		t.Errorf("relayed file: %d, %d bytes", code, len(got))
	}
	rec := httptest.NewRecorder()
	ix.ServeHTTP(rec, httptest.NewRequest("POST", "http://"+Host+"/simple/", io.NopCloser(strings.NewReader(""))))
	if rec.Code != 405 {
		t.Errorf("POST: %d", rec.Code)
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []Config{
		{},
		{Dir: t.TempDir()},
		{Dir: "/nonexistent", Allowed: []Allowed{{Name: "x"}}},
		{Dir: t.TempDir(), Upstream: "https://pypi.org/simple/", Allowed: []Allowed{{Name: "x"}}},
		{Upstream: "ftp://x/", Allowed: []Allowed{{Name: "x"}}},
	} {
		if _, err := New(c); !errors.Is(err, ErrInvalid) {
			t.Errorf("New(%+v): %v", c, err)
		}
	}
}

package e2b_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/test/testserver"
)

// upstreamDomain is the E2B_DOMAIN of E2B's own suites: its names
// resolve to the test's TLS front (upstream/resolve-domain.mjs).
const upstreamDomain = "e2b.test"

// TestE2BTemplateSuite runs E2B's own template suite (tests/template of
// e2b-dev/E2B's packages/js-sdk), unmodified, with vitest, against
// `vivarium serve` reached as E2B's cloud is (E2B_DOMAIN and the key
// alone): E2B's test files are copied into upstream/tests, where their
// imports of the SDK's sources ('../../src') get the npm package pinned
// in upstream/package.json (upstream/src), and upstream/vitest.config.mjs
// runs them as E2B's "template" project does, less the SDK's unit tests
// of its internals, which the package does not export.
//
// It runs where VIVARIUM_E2B_TESTS names that packages/js-sdk directory
// (a checkout at the release of the pinned SDK), serve has a template
// builder that pulls through a registry mirror (--registry-mirror), and
// scripts/registry.sh can serve the stand-ins of the images the suite
// names; it skips, saying which is missing, elsewhere.
func TestE2BTemplateSuite(t *testing.T) {
	suite := os.Getenv("VIVARIUM_E2B_TESTS")
	if suite == "" {
		t.Skip("set VIVARIUM_E2B_TESTS to the packages/js-sdk directory of an e2b-dev/E2B checkout to run its tests/template")
	}
	if _, err := os.Stat(filepath.Join(suite, "tests", "template")); err != nil {
		t.Fatalf("VIVARIUM_E2B_TESTS: %v", err)
	}
	testutil.RequireRoot(t)
	requireNode(t, "upstream", "e2b", "vitest", "msw")
	bin := testserver.Build(t)
	if help, _ := exec.Command(bin, "serve", "--help").CombinedOutput(); !strings.Contains(string(help), "-registry-mirror") {
		t.Skip("vivarium serve has no template builder pulling through a registry mirror yet (--registry-mirror)")
	}

	tests := filepath.Join("upstream", "tests")
	os.RemoveAll(tests)
	if out, err := exec.Command("cp", "-r", filepath.Join(suite, "tests"), tests).CombinedOutput(); err != nil {
		t.Fatalf("copy E2B's tests: %v\n%s", err, out)
	}
	t.Cleanup(func() { os.RemoveAll(tests) })

	regDir := t.TempDir()
	out, err := exec.Command("../../scripts/registry.sh", "start", regDir).Output()
	if err != nil {
		t.Fatalf("scripts/registry.sh start: %v", err)
	}
	t.Cleanup(func() { exec.Command("../../scripts/registry.sh", "stop", regDir).Run() })
	registry := strings.TrimSpace(string(out))

	front, ca := tlsFront(t)
	domain := upstreamDomain + ":" + front.port
	srv := testserver.Start(t, bin, testserver.Options{CgroupParent: cgroupParent + "-templates",
		UIDBase: uidBase + 3*testutil.UIDSpan, Keys: []string{"e2b-templates"},
		Args: []string{"--domain", domain, "--insecure-registry", registry, "--registry-mirror", "docker.io=" + registry}})
	front.to(t, srv.URL)

	// A server whose builds are off answers them 501: nothing to run.
	req, _ := http.NewRequest("POST", srv.URL+"/e2b/v3/templates", strings.NewReader(`{"name":"probe"}`))
	req.Header.Set("X-API-Key", srv.Keys[0])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotImplemented {
		t.Skip("the server builds no templates (no template builder is wired)")
	}

	hook, _ := filepath.Abs(filepath.Join("upstream", "resolve-domain.mjs"))
	cmd := exec.Command(filepath.Join("node_modules", ".bin", "vitest"), "run", "--config", "vitest.config.mjs",
		"--reporter=verbose")
	cmd.Dir = "upstream"
	// Nothing of a developer's own E2B setup may leak in: no E2B_*
	// variable but ours (E2B's tests take E2B_DEBUG, even empty, as
	// debugging, and skip some).
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "E2B_") })
	cmd.Env = append(cmd.Env,
		"E2B_DOMAIN="+domain, "E2B_API_KEY="+srv.Keys[0],
		"VIVARIUM_E2B_TEST_DOMAIN="+upstreamDomain, "NODE_OPTIONS=--import="+hook, "NODE_EXTRA_CA_CERTS="+ca,
		"NO_COLOR=1", "FORCE_COLOR=0")
	out, err = cmd.CombinedOutput()
	t.Logf("vitest:\n%s", out)
	summary := regexp.MustCompile(`Tests\s+(?:(\d+) failed \| )?(\d+) passed`).FindSubmatch(out)
	if summary == nil {
		t.Fatalf("vitest did not finish: %v", err)
	}
	if len(summary[1]) > 0 {
		var failed []string
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "×") {
				failed = append(failed, strings.TrimSpace(line))
			}
		}
		t.Errorf("%s of E2B's template tests failed (%s passed):\n%s", summary[1], summary[2], strings.Join(failed, "\n"))
	}
	if strings.Contains(srv.Log(), "level=ERROR") {
		t.Errorf("the server logged errors:\n%s", srv.Log())
	}
}

// front is an HTTPS server for E2B's names, as E2B's cloud is reached
// (the SDKs speak HTTPS to E2B_DOMAIN), forwarding to the server with
// the Host the client asked for.
type front struct {
	srv    *httptest.Server
	port   string
	target atomic.Pointer[url.URL]
}

// tlsFront starts a front with a certificate for upstreamDomain and its
// subdomains, and returns it and the file of that certificate, which the
// Node process trusts.
func tlsFront(t *testing.T) (*front, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: upstreamDomain},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{upstreamDomain, "*." + upstreamDomain}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &front{}
	proxy := &httputil.ReverseProxy{FlushInterval: -1, Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(f.target.Load())
		r.Out.Host = r.In.Host
	}}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.target.Load() == nil {
			http.Error(w, "the server is not up yet", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	f.srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	_, f.port, _ = net.SplitHostPort(f.srv.Listener.Addr().String())
	return f, ca
}

// to points the front at the server (before any request comes).
func (f *front) to(t *testing.T, serverURL string) {
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(fmt.Errorf("server URL: %w", err))
	}
	f.target.Store(u)
}

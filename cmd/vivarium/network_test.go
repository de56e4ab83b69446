package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

const netProbe = `
import urllib.request, urllib.error
def fetch(label, url):
    try:
        print(label, "ok", urllib.request.urlopen(url, timeout=10).read().decode())
    except urllib.error.HTTPError as e:
        print(label, e.code, e.read().decode().strip())
    except urllib.error.URLError as e:
        print(label, "URLError", e.reason)
`

// `vivarium run --allow-net` reaches a host of a test network namespace
// through its proxy, and nothing the rules do not name; the host's own
// addresses stay refused though a rule covers them. Refusals are reported
// on stderr.
func TestRunAllowNet(t *testing.T) {
	needSandbox(t)
	h := testutil.NewNetHost(t)
	rule := fmt.Sprintf("%s/30:%d", h.Peer, h.Port) // the namespace's and the host's end
	r := vivarium(t, "", "run", "--allow-net", rule, "-c", netProbe+fmt.Sprintf(`
fetch("allowed", "http://%[1]s:%[3]d/hello.txt")
fetch("host", "http://%[2]s:%[3]d/")
fetch("other port", "http://%[1]s:22/")
fetch("metadata", "http://169.254.169.254/")
`, h.Addr, h.Peer, h.Port))
	want := fmt.Sprintf(`allowed ok hello from %[1]s
host 403 vivarium: %[2]s port %[4]d is always refused: an address of the host itself
other port 403 vivarium: %[3]s port 22 is not in this sandbox's network allowlist
metadata 403 vivarium: 169.254.169.254 port 80 is always refused: a link-local address (cloud metadata lives there)
`, h.Name, h.Peer, h.Addr, h.Port)
	if r.code != 0 || r.stdout != want {
		t.Errorf("exit %d\n%s\nwant\n%s\nstderr: %s", r.code, r.stdout, want, r.stderr)
	}
	for _, s := range []string{fmt.Sprintf("vivarium: network: GET %s:22 refused", h.Addr),
		"vivarium: network: GET 169.254.169.254:80 refused"} {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("stderr lacks %q: %s", s, r.stderr)
		}
	}
	// Without --allow-net there is no proxy; a bad rule and a backend that
	// cannot carry the proxy are refused, never run without it.
	r = vivarium(t, "", "run", "-c", netProbe+fmt.Sprintf("fetch('none', 'http://%s:%d/')", h.Addr, h.Port))
	if !strings.HasPrefix(r.stdout, "none URLError [Errno 101] Network is unreachable") {
		t.Errorf("without --allow-net: %+v", r)
	}
	if r = vivarium(t, "", "run", "--allow-net", "exa$mple.com", "-c", "1"); r.code != 2 || !strings.Contains(r.stderr, "--allow-net") {
		t.Errorf("bad rule: %+v", r)
	}
	if r = vivarium(t, "", "run", "--backend", "wasm", "--wasm-dir", t.TempDir(), "--allow-net", "example.com", "-c", "1"); r.code == 0 ||
		!strings.Contains(r.stdout+r.stderr, "wasm") {
		t.Errorf("wasm with --allow-net: %+v", r)
	}
}

// A server with an allowlist and a package: a client creates a sandbox
// with network access, installs the package, reaches the allowed host;
// the audit log has every connection.
func TestServeNetwork(t *testing.T) {
	needSandbox(t)
	testutil.RequirePythonModules(t, "pip")
	h := testutil.NewNetHost(t)
	wheels := t.TempDir()
	testutil.Wheel(t, wheels, "vivtestpkg", "1.0", map[string]string{"vivtestpkg/__init__.py": "ANSWER = 42\n"})
	dataDir := t.TempDir()
	srv := startServer(t, dataDir, "--dev", "--cgroup-parent", "vivarium-serve-net-test",
		"--uid-base", fmt.Sprint(native.DefaultUIDBase+21<<24), "--uid-ranges", fmt.Sprint(testutil.UIDRanges), "--zygote=false", "--preload=", "--pool=0",
		"--allow-net", fmt.Sprintf("%s:%d *.example.com", h.Addr, h.Port),
		"--package", "vivtestpkg", "--package-dir", wheels, "--net-max-connections", "4")
	must := func(r cli, what string) cli {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", what, r.code, r.stdout, r.stderr)
		}
		return r
	}
	if r := srv.cliAs(t, "", "", "sandbox", "create", "--allow-net", "evil.test"); r.code != 1 ||
		!strings.Contains(r.stderr, "evil.test:80,443 not within the server's allowlist") {
		t.Errorf("create beyond the allowlist: %+v", r)
	}
	id := strings.TrimSpace(must(srv.cliAs(t, "", "", "sandbox", "create", "--packages", "--allow-net",
		fmt.Sprintf("%s:%d", h.Addr, h.Port)), "create").stdout)
	if r := srv.cliAs(t, "", "", "sandbox", "install", id, "requests"); r.code != 1 || !strings.Contains(r.stderr, "not on this server's package allowlist") {
		t.Errorf("install of a package not allowed: %+v", r)
	}
	must(srv.cliAs(t, "", "", "sandbox", "install", id, "vivtestpkg==1.0"), "install")
	r := must(srv.cliAs(t, "", "", "sandbox", "exec", id, "-c", fmt.Sprintf(`
import vivtestpkg, urllib.request
print(vivtestpkg.ANSWER, urllib.request.urlopen("http://%s:%d/hello.txt").read().decode())`, h.Addr, h.Port)), "exec")
	if want := "42 hello from " + h.Name + "\n"; r.stdout != want {
		t.Errorf("exec: %q, want %q", r.stdout, want)
	}
	// The sandbox's network changes while it runs, within the allowlist.
	hostPort := fmt.Sprintf("%s:%d", h.Addr, h.Port)
	if r := must(srv.cliAs(t, "", "", "sandbox", "network", id, "--all-net", "--deny-net", h.Addr.String()), "network"); !strings.Contains(r.stdout, `"deny":["`+h.Addr.String()+`/32:*"]`) {
		t.Errorf("network: %+v", r)
	}
	fetch := fmt.Sprintf(`
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen("http://%s/hello.txt").read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())`, hostPort)
	if r := must(srv.cliAs(t, "", "", "sandbox", "exec", id, "-c", fetch), "exec denied"); r.stdout != "403 vivarium: "+h.Addr.String()+fmt.Sprintf(" port %d is in this sandbox's deny list\n", h.Port) {
		t.Errorf("exec after deny: %q", r.stdout)
	}
	if r := srv.cliAs(t, "", "", "sandbox", "network", id, "--allow-net", "evil.test"); r.code != 1 || !strings.Contains(r.stderr, "not within the server's allowlist") {
		t.Errorf("network beyond the allowlist: %+v", r)
	}
	must(srv.cliAs(t, "", "", "sandbox", "network", id, "--allow-net", hostPort), "network again")
	if r := must(srv.cliAs(t, "", "", "sandbox", "exec", id, "-c", fetch), "exec allowed"); r.stdout != "hello from "+h.Name+"\n" {
		t.Errorf("exec after allow: %q", r.stdout)
	}
	info := must(srv.cliAs(t, "", "", "sandbox", "info", id), "info").stdout
	if !strings.Contains(info, `"max_connections":4`) || !strings.Contains(info, `"packages":true`) {
		t.Errorf("info: %s", info)
	}
	must(srv.cliAs(t, "", "", "sandbox", "kill", id), "kill")

	// The audit log is written in batches: wait for the connections.
	var audit string
	testutil.WaitFor(t, 20*time.Second, "the connections in the audit log", func() bool {
		audit = srv.cliAs(t, "", "", "audit", "--data-dir", dataDir, "--kind", "net", "--sandbox", id).stdout
		return strings.Contains(audit, fmt.Sprintf("%s:%d", h.Addr, h.Port))
	})
	if !strings.Contains(audit, "packages.vivarium.internal:80") || !strings.Contains(audit, "allowed") {
		t.Errorf("audit:\n%s", audit)
	}
}

func TestServeRefusesBadNetworkConfig(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--allow-net", "exa$mple.com"}, "--allow-net: invalid network policy"},
		{[]string{"--deny-net", "nonsense"}, `--deny-net "nonsense": want an address or CIDR`},
		{[]string{"--net-max-connections", "-1"}, "network limits cannot be negative"},
		{[]string{"--package", "numpy"}, "--package needs --package-dir or --package-index"},
		{[]string{"--package-dir", dir}, "--package-dir and --package-index need --package"},
		{[]string{"--package", "numpy", "--package-dir", dir, "--package-index", "https://pypi.org/simple/"}, "either a wheel directory or an upstream index"},
		{[]string{"--package", "numpy", "--package-index", "ftp://example.com/"}, "want an http(s) URL"},
	} {
		r := vivarium(t, "", append([]string{"serve"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("serve %v: exit %d, stderr %q; want 2 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

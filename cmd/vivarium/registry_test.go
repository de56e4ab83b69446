package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/kubetest"
)

// Two servers share templates through a registry (--template-registry),
// as a cluster's nodes do: the operator's template pushed with `vivarium
// image push`, and a template a key builds on one server through E2B's
// build API, are made into sandboxes by the other, which has neither
// and pulls each on first use.
func TestTemplateRegistryNodes(t *testing.T) {
	needSandbox(t)
	reg := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	repo := host + "/vivarium"

	// The operator's template, pushed from a store of its own.
	opDir := t.TempDir()
	addTemplate(t, opDir, "tools:1", v1.Config{Env: []string{"PATH=/usr/bin:/bin", "TPL=shared"}})
	r := vivarium(t, "", "image", "push", "--data-dir", opDir, "--insecure-registry", host, "tools:1", repo+"/tools:1")
	if r.code != 0 || !strings.HasPrefix(r.stdout, repo+"/tools:1 sha256:") || !strings.Contains(r.stderr, "vivarium image push:") {
		t.Fatalf("image push: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := vivarium(t, "", "image", "push", "--data-dir", opDir, "tools:1", repo+"/tools:1"); r.code == 0 ||
		!strings.Contains(r.stderr, "--insecure-registry "+host) {
		t.Fatalf("a push over plain HTTP to a registry not named insecure: %d %q", r.code, r.stderr)
	}

	dirA := t.TempDir()
	addTemplate(t, dirA, "base:1", v1.Config{Env: []string{"PATH=/usr/bin:/bin"}})
	node := func(dir string, i int) *server {
		return startServer(t, dir, "--dev", "--template-registry", repo, "--insecure-registry", host,
			"--cgroup-parent", fmt.Sprintf("%s-registry%d", serveParent, i),
			"--uid-base", fmt.Sprint(native.DefaultUIDBase+uint32(50+i)<<24), "--uid-ranges", "64")
	}
	a, b := node(dirA, 0), node(t.TempDir(), 1)

	// A key's build on a: its image is pushed before it is ready.
	key := map[string]string{"X-API-Key": "e2b_0123456789abcdef0123456789abcdef01234567"}
	e2bBuild(t, a.url, key, "my-env", myEnv)

	// b makes sandboxes of both, pulling them: stateful and one-shot,
	// through /v1 and E2B's API.
	run := func(srv *server, hdr map[string]string, tpl, code string) (int, string) {
		c, out := req(t, "POST", srv.url+"/v1/execute", hdr, map[string]any{"template": tpl, "code": code})
		return c, string(out)
	}
	show := "import os; print(os.environ['TPL'], open('/built').read().strip() if os.path.exists('/built') else '-', " +
		"open('/hello.txt').read().strip() if os.path.exists('/hello.txt') else '-')"
	if code, out := run(b, nil, "tools:1", show); code != 200 || !strings.Contains(out, `"stdout":"shared - -\n"`) {
		t.Fatalf("the operator's template on b: %d %s", code, out)
	}
	if code, out := run(b, key, "my-env", show); code != 200 || !strings.Contains(out, `"stdout":"the key's built hello\n"`) {
		t.Fatalf("the key's template on b: %d %s", code, out)
	}
	if !strings.Contains(b.log.String(), "template pulled from the registry") {
		t.Errorf("b's log does not say it pulled:\n%s", b.log.String())
	}
	code, body := req(t, "POST", b.url+"/e2b/sandboxes", key, map[string]any{"templateID": "my-env"})
	var sb struct{ SandboxID string }
	if json.Unmarshal(body, &sb); code != 201 {
		t.Fatalf("E2B's create of the key's template on b: %d %s", code, body)
	}
	code, body = req(t, "POST", b.url+"/v1/sandboxes/"+sb.SandboxID+"/execute", key, map[string]any{"code": show})
	if code != 200 || !strings.Contains(string(body), `"stdout":"the key's built hello\n"`) {
		t.Fatalf("in the E2B sandbox on b: %d %s", code, body)
	}
	// a, which built it, makes its sandboxes from its own build.
	if code, out := run(a, key, "my-env", show); code != 200 || !strings.Contains(out, `"stdout":"the key's built hello\n"`) {
		t.Fatalf("the key's template on a: %d %s", code, out)
	}
	if code, out := run(b, key, "absent:1", show); code != 404 || !strings.Contains(out, "template_not_found") {
		t.Fatalf("a template nowhere: %d %s", code, out)
	}
}

// myEnv is a build of E2B's build API: base:1, a file written by a RUN
// step, a file of the build's uploaded (e2bBuild's hello.txt), and TPL
// in its environment.
func myEnv(filesHash string) map[string]any {
	return map[string]any{"fromImage": "base:1", "steps": []map[string]any{
		{"type": "RUN", "args": []string{"echo built > /built"}},
		{"type": "COPY", "args": []string{"hello.txt", "/hello.txt"}, "filesHash": filesHash},
		{"type": "ENV", "args": []string{"TPL", "the key's"}},
	}}
}

// e2bBuild builds the template name of spec (given the hash of the
// build's files) through E2B's build API at url, with the key in hdr, as
// E2B's SDK does: the files (hello.txt) uploaded to the URL the server
// answers, the build started and its status polled. It returns the
// template's id once the build is ready, checking that its log says it
// was pushed.
func e2bBuild(t *testing.T, url string, hdr map[string]string, name string, spec func(string) map[string]any) string {
	t.Helper()
	var created struct{ TemplateID, BuildID string }
	code, body := req(t, "POST", url+"/e2b/v3/templates", hdr, map[string]any{"name": name})
	if json.Unmarshal(body, &created); code != 202 || created.BuildID == "" {
		t.Fatalf("request a build: %d %s", code, body)
	}
	var files bytes.Buffer
	gz := gzip.NewWriter(&files)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "hello.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 6})
	tw.Write([]byte("hello\n"))
	tw.Close()
	gz.Close()
	sum := sha256.Sum256(files.Bytes())
	hash := hex.EncodeToString(sum[:])
	var link struct{ URL string }
	code, body = req(t, "GET", url+"/e2b/templates/"+created.TemplateID+"/files/"+hash, hdr, nil)
	if json.Unmarshal(body, &link); code != 201 || !strings.HasPrefix(link.URL, url) {
		t.Fatalf("the files' upload URL: %d %s (want one of %s)", code, body, url)
	}
	put, _ := http.NewRequest("PUT", link.URL, bytes.NewReader(files.Bytes()))
	resp, err := http.DefaultClient.Do(put)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("upload the files: %d %s", resp.StatusCode, body)
	}
	code, body = req(t, "POST", url+"/e2b/v2/templates/"+created.TemplateID+"/builds/"+created.BuildID, hdr, spec(hash))
	if code != 202 {
		t.Fatalf("start the build: %d %s", code, body)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var st struct{ Status string }
		code, body = req(t, "GET", url+"/e2b/templates/"+created.TemplateID+"/builds/"+created.BuildID+"/status", hdr, nil)
		json.Unmarshal(body, &st)
		if st.Status == "ready" {
			if !strings.Contains(string(body), "pushing the template to the cluster's registry") {
				t.Errorf("the build's log does not say it pushed: %s", body)
			}
			return created.TemplateID
		}
		if code != 200 || st.Status == "error" || time.Now().After(deadline) {
			t.Fatalf("build: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestClusterTemplates: through a cluster's gateway (two nodes, a real
// API server, the cluster's keys), a key builds a template with E2B's
// build API (on the node its key picks; the build's status by the
// template's id, which names that node), and sandboxes of it are made
// on both nodes, the other pulling it from the template registry;
// another key does not find it.
func TestClusterTemplates(t *testing.T) {
	needSandbox(t)
	nodes := []string{"t1", "t2"}
	users := []kubetest.User{{Name: "gateway"}}
	for _, n := range nodes {
		users = append(users, kubetest.User{Name: "node-" + n})
	}
	kc := kubetest.Start(t, users...)
	clusterRBAC(t, kc, nodes)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("a-cluster-token-of-the-templates-test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	newKey := func(name string) string {
		r := vivarium(t, "", "keys", "create", "--cluster", "--kubeconfig", kc.Kubeconfig(kubetest.AdminUser),
			"--namespace", clusterNS, "--json", name)
		var out struct{ Token string }
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
			t.Fatalf("keys create --cluster: %d %s %s", r.code, r.stdout, r.stderr)
		}
		return out.Token
	}
	key, other := newKey("builder"), newKey("other")

	reg := httptest.NewServer(ggcrregistry.New(ggcrregistry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	for i, n := range nodes {
		dir := t.TempDir()
		addTemplate(t, dir, "base:1", v1.Config{Env: []string{"PATH=/usr/bin:/bin"}}) // the build's base, wherever it runs
		t.Cleanup(func() {
			testutil.WaitFor(t, 10*time.Second, "the nodes' groups to empty", func() bool {
				return removeCgroupTree("vivarium-cluster-tpl-" + n)
			})
		})
		startServer(t, dir, "--pool", "0", "--cluster", "--node-name", n,
			"--kubeconfig", kc.Kubeconfig("node-"+n), "--namespace", clusterNS, "--cluster-token-file", tokenFile,
			"--lease-duration", "3s", "--cgroup-parent", "vivarium-cluster-tpl-"+n,
			"--uid-base", fmt.Sprint(native.DefaultUIDBase+uint32(60+i)<<24), "--uid-ranges", "64",
			"--template-registry", host+"/vivarium", "--insecure-registry", host)
	}
	gw := startGateway(t, kc, tokenFile)
	testutil.WaitFor(t, 10*time.Second, "the gateway to see the two nodes", func() bool { return healthz(gw) == "ok: 2 nodes" })

	id := e2bBuild(t, gw.url, map[string]string{"X-API-Key": key}, "my-env", myEnv)
	built, ok := sandboxid.Template.Node(id)
	if !ok {
		t.Fatalf("a cluster's template id names no node: %s", id)
	}
	// Sandboxes of it on both nodes (the load alternates them).
	per := map[string]int{}
	for range 4 {
		var sb struct{ ID string }
		if code := call(t, key, "POST", gw.url+"/v1/sandboxes", map[string]any{"template": "my-env"}, &sb); code != 201 {
			t.Fatalf("create of the key's template: %d", code)
		}
		var res struct{ Stdout string }
		code := call(t, key, "POST", gw.url+"/v1/sandboxes/"+sb.ID+"/execute",
			map[string]any{"code": "import os; print(os.environ['TPL'], open('/built').read().strip(), open('/hello.txt').read().strip())"}, &res)
		if code != 200 || res.Stdout != "the key's built hello\n" {
			t.Fatalf("in %s: %d %q", sb.ID, code, res.Stdout)
		}
		n, _ := sandboxid.Node(sb.ID)
		per[n]++
	}
	if len(per) != 2 {
		t.Fatalf("the template's sandboxes ran on %v only (built on %s)", per, built)
	}
	var e struct{ Error struct{ Code string } }
	if code := call(t, other, "POST", gw.url+"/v1/sandboxes", map[string]any{"template": "my-env"}, &e); code != 404 ||
		e.Error.Code != "template_not_found" {
		t.Fatalf("another key's create of the template: %d %+v", code, e)
	}
	// Its deletion by name reaches the node that built it.
	if code, body := req(t, "DELETE", gw.url+"/e2b/templates/my-env", map[string]string{"X-API-Key": key}, nil); code/100 != 2 {
		t.Fatalf("delete the template through the gateway: %d %s", code, body)
	}
}

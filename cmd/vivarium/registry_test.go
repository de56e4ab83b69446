package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	ggcrregistry "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
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
	var created struct{ TemplateID, BuildID string }
	code, body := req(t, "POST", a.url+"/e2b/v3/templates", key, map[string]any{"name": "my-env"})
	if json.Unmarshal(body, &created); code != 202 || created.BuildID == "" {
		t.Fatalf("request a build: %d %s", code, body)
	}
	code, body = req(t, "POST", a.url+"/e2b/v2/templates/"+created.TemplateID+"/builds/"+created.BuildID, key,
		map[string]any{"fromImage": "base:1", "steps": []map[string]any{
			{"type": "RUN", "args": []string{"echo built on a > /built"}},
			{"type": "ENV", "args": []string{"TPL", "the key's"}},
		}})
	if code != 202 {
		t.Fatalf("start the build: %d %s", code, body)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var st struct {
			Status     string
			Reason     any
			LogEntries []struct{ Message string }
		}
		code, body = req(t, "GET", a.url+"/e2b/templates/"+created.TemplateID+"/builds/"+created.BuildID+"/status", key, nil)
		json.Unmarshal(body, &st)
		if st.Status == "ready" {
			if !strings.Contains(string(body), "pushing the template to the cluster's registry") {
				t.Errorf("the build's log does not say it pushed: %s", body)
			}
			break
		}
		if code != 200 || st.Status == "error" || time.Now().After(deadline) {
			t.Fatalf("build: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// b makes sandboxes of both, pulling them: stateful and one-shot,
	// through /v1 and E2B's API.
	run := func(srv *server, hdr map[string]string, tpl, code string) (int, string) {
		c, out := req(t, "POST", srv.url+"/v1/execute", hdr, map[string]any{"template": tpl, "code": code})
		return c, string(out)
	}
	show := "import os; print(os.environ['TPL'], open('/built').read().strip() if os.path.exists('/built') else '-')"
	if code, out := run(b, nil, "tools:1", show); code != 200 || !strings.Contains(out, `"stdout":"shared -\n"`) {
		t.Fatalf("the operator's template on b: %d %s", code, out)
	}
	if code, out := run(b, key, "my-env", show); code != 200 || !strings.Contains(out, `"stdout":"the key's built on a\n"`) {
		t.Fatalf("the key's template on b: %d %s", code, out)
	}
	if !strings.Contains(b.log.String(), "template pulled from the registry") {
		t.Errorf("b's log does not say it pulled:\n%s", b.log.String())
	}
	code, body = req(t, "POST", b.url+"/e2b/sandboxes", key, map[string]any{"templateID": "my-env"})
	var sb struct{ SandboxID string }
	if json.Unmarshal(body, &sb); code != 201 {
		t.Fatalf("E2B's create of the key's template on b: %d %s", code, body)
	}
	code, body = req(t, "POST", b.url+"/v1/sandboxes/"+sb.SandboxID+"/execute", key, map[string]any{"code": show})
	if code != 200 || !strings.Contains(string(body), `"stdout":"the key's built on a\n"`) {
		t.Fatalf("in the E2B sandbox on b: %d %s", code, body)
	}
	// a, which built it, makes its sandboxes from its own build.
	if code, out := run(a, key, "my-env", show); code != 200 || !strings.Contains(out, `"stdout":"the key's built on a\n"`) {
		t.Fatalf("the key's template on a: %d %s", code, out)
	}
	if code, out := run(b, key, "absent:1", show); code != 404 || !strings.Contains(out, "template_not_found") {
		t.Fatalf("a template nowhere: %d %s", code, out)
	}
}

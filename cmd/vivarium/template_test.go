package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// addTemplate adds to dataDir's image store an image named name of one
// layer, the host's python3 and a few programs (testutil.RootLayer), with
// cfg's environment and working directory.
func addTemplate(t *testing.T, dataDir, name string, cfg v1.Config) {
	t.Helper()
	dir := t.TempDir()
	testutil.RootLayer(t, dir)
	tarred := testutil.TarDir(t, dir)
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarred)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(filepath.Join(dataDir, "images"), image.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(context.Background(), name, img, nil); err != nil {
		t.Fatal(err)
	}
}

// A server makes sandboxes of its store's templates on /v1: stateful and
// one-shot, with the template's environment, working directory and
// Python; an unknown template is 404, and pausing one is refused saying
// why.
func TestServeTemplates(t *testing.T) {
	needSandbox(t)
	dataDir := t.TempDir()
	addTemplate(t, dataDir, "tpl:1", v1.Config{Env: []string{"PATH=/usr/bin:/bin", "TPL=from the image"}, WorkingDir: "/srv"})
	srv := startServer(t, dataDir, "--dev", "--cgroup-parent", serveParent+"-template")

	code, body := req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{"template": "tpl:1", "env": map[string]string{"OWN": "mine"}})
	var info struct {
		ID       string
		Template string
	}
	if json.Unmarshal(body, &info); code != 201 || info.Template != "tpl:1" {
		t.Fatalf("create: %d %s", code, body)
	}
	code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+info.ID+"/execute", nil, map[string]any{
		"code": "import os, sys; print(os.environ['TPL'], os.environ['OWN'], os.getcwd(), sys.executable)"})
	if code != 200 || !strings.Contains(string(body), `"stdout":"from the image mine /srv /usr/bin/python3`) {
		t.Fatalf("execute: %d %s", code, body)
	}
	code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+info.ID+"/commands", nil, map[string]any{
		"cmd": "echo added > /usr/bin/added && cat /usr/bin/added", "user": "root"})
	if code != 200 || !strings.Contains(string(body), `"stdout":"added\n"`) {
		t.Fatalf("a command as root: %d %s", code, body)
	}
	if code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+info.ID+"/pause", nil, nil); code != 501 || !strings.Contains(string(body), "template") {
		t.Errorf("pause: %d %s, want 501 naming the template", code, body)
	}
	code, body = req(t, "POST", srv.url+"/v1/execute", nil, map[string]any{"template": "tpl:1",
		"code": "import os; print(os.path.exists('/usr/bin/added'), os.environ['TPL'])"})
	if code != 200 || !strings.Contains(string(body), `"stdout":"False from the image\n"`) {
		t.Fatalf("one-shot: %d %s", code, body)
	}
	code, body = req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{"template": "absent:1"})
	if code != 404 || !strings.Contains(string(body), "template_not_found") {
		t.Fatalf("an unknown template: %d %s", code, body)
	}
}

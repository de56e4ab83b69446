package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/template"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// addTemplate adds to dataDir's image store an image named name of one
// layer, the host's python3 and a few programs (testutil.RootLayer), with
// cfg's environment and working directory.
func addTemplate(t *testing.T, dataDir, name string, cfg v1.Config) {
	t.Helper()
	dir := t.TempDir()
	testutil.RootLayer(t, dir)
	img := testutil.DirImage(t, dir, cfg)
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
// Python, paused, resumed, forked and saved; its USER runs its code; an
// unknown template is 404.
func TestServeTemplates(t *testing.T) {
	needSandbox(t)
	dataDir := t.TempDir()
	addTemplate(t, dataDir, "tpl:1", v1.Config{Env: []string{"PATH=/usr/bin:/bin", "TPL=from the image"}, WorkingDir: "/srv"})
	addTemplate(t, dataDir, "tpl:user", v1.Config{Env: []string{"PATH=/usr/bin:/bin"}, User: "4321:4322"})
	addTemplate(t, dataDir, "tpl:ghost", v1.Config{Env: []string{"PATH=/usr/bin:/bin"}, User: "ghost"})
	srv := startServer(t, dataDir, "--dev", "--cgroup-parent", serveParent+"-template")

	// The image's USER runs its code; a USER the image does not know
	// fails the creation, saying so.
	code, body := req(t, "POST", srv.url+"/v1/execute", nil, map[string]any{"template": "tpl:user",
		"code": "import os; print(os.getuid(), os.getgid())"})
	if code != 200 || !strings.Contains(string(body), `"stdout":"4321 4322\n"`) {
		t.Fatalf("a template's USER: %d %s", code, body)
	}
	code, body = req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{"template": "tpl:ghost"})
	if code != 400 || !strings.Contains(string(body), "invalid username: 'ghost'") {
		t.Fatalf("a template of an unknown USER: %d %s", code, body)
	}

	code, body = req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{"template": "tpl:1", "env": map[string]string{"OWN": "mine"}})
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
	// Paused and resumed with its state and its writes; not forked yet.
	if _, err := criu.Usable(); err == nil {
		for _, op := range []string{"pause", "resume"} {
			if code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+info.ID+"/"+op, nil, nil); code/100 != 2 {
				t.Fatalf("%s: %d %s", op, code, body)
			}
		}
		code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+info.ID+"/execute", nil, map[string]any{
			"code": "print(open('/usr/bin/added').read().strip(), os.environ['TPL'])"})
		if code != 200 || !strings.Contains(string(body), `"stdout":"added from the image\n"`) {
			t.Fatalf("execute after a resume: %d %s", code, body)
		}
		// Forked and saved: the copies and a sandbox of the snapshot
		// have the template, its state and the sandbox's writes.
		var forked struct{ Sandboxes []struct{ ID string } }
		if code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+info.ID+"/fork", nil, map[string]any{"count": 1}); code != 201 {
			t.Fatalf("fork: %d %s", code, body)
		}
		json.Unmarshal(body, &forked)
		var snap struct{ ID string }
		if code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+info.ID+"/snapshots", nil, map[string]any{}); code != 201 {
			t.Fatalf("snapshot: %d %s", code, body)
		}
		json.Unmarshal(body, &snap)
		var ofSnap struct{ ID, Template string }
		if code, body = req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{"from_snapshot": snap.ID}); code != 201 {
			t.Fatalf("a sandbox of the snapshot: %d %s", code, body)
		}
		json.Unmarshal(body, &ofSnap)
		if len(forked.Sandboxes) != 1 || ofSnap.Template != "tpl:1" {
			t.Fatalf("fork answered %+v; the snapshot's sandbox %+v", forked, ofSnap)
		}
		for _, id := range []string{forked.Sandboxes[0].ID, ofSnap.ID} {
			code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+id+"/execute", nil, map[string]any{
				"code": "print(open('/usr/bin/added').read().strip(), os.environ['TPL'])"})
			if code != 200 || !strings.Contains(string(body), `"stdout":"added from the image\n"`) {
				t.Fatalf("execute in %s: %d %s", id, code, body)
			}
		}
	}
	code, body = req(t, "POST", srv.url+"/v1/execute", nil, map[string]any{"template": "tpl:1",
		"code": "import os; print(os.path.exists('/usr/bin/added'), os.environ['TPL'])"})
	if code != 200 || !strings.Contains(string(body), `"stdout":"False from the image\n"`) {
		t.Fatalf("one-shot: %d %s", code, body)
	}
	// Removed while a sandbox of it runs (by another process): the
	// sandbox goes on, its layers whole; a new one is refused.
	if r := vivarium(t, "", "image", "rm", "--data-dir", dataDir, "tpl:1"); r.code != 0 {
		t.Fatalf("image rm: %d %s", r.code, r.stderr)
	}
	code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+info.ID+"/execute", nil, map[string]any{
		"code": "import decimal, fractions, statistics; print(statistics.mean([1, 2]))"})
	if code != 200 || !strings.Contains(string(body), `"stdout":"1.5\n"`) {
		t.Fatalf("execute after the template's removal: %d %s", code, body)
	}
	code, body = req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{"template": "absent:1"})
	if code != 404 || !strings.Contains(string(body), "template_not_found") {
		t.Fatalf("an unknown template: %d %s", code, body)
	}
}

// vivarium template build makes a template of a Dockerfile: each step as
// Docker would, RUN in a sandbox of the image so far, what it deletes
// gone; its sandboxes have it all; a second build is all cached; a build
// whose RUN fails names nothing; a template without python3 runs
// commands, and code there fails saying why.
func TestTemplateBuild(t *testing.T) {
	needSandbox(t)
	dataDir := t.TempDir()
	addTemplate(t, dataDir, "base:1", v1.Config{Env: []string{"PATH=/usr/bin:/bin"}})
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("Dockerfile", `FROM base:1
ARG WHO=nobody
ENV GREETING="hello there"
WORKDIR /app
COPY data.txt /app/
RUN echo "made by $WHO" > /app/made.txt && rm /usr/bin/cat && mkdir -p /opt/tool && echo v1 > /opt/tool/version
`)
	write("data.txt", "copied\n")
	build := func(name string, args ...string) cli {
		t.Helper()
		return vivarium(t, "", append([]string{"template", "build", "--data-dir", dataDir, "-t", name}, append(args, dir)...)...)
	}
	r := build("built:1", "--build-arg", "WHO=the build")
	if r.code != 0 {
		t.Fatalf("build: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	run := func(template, code string) cli {
		t.Helper()
		return vivarium(t, "", "run", "--data-dir", dataDir, "--template", template, "-c", code)
	}
	r = run("built:1", `import os, subprocess
print(os.getcwd(), os.environ["GREETING"])
print(open("made.txt").read().strip(), open("data.txt").read().strip(), open("/opt/tool/version").read().strip())
print(os.path.exists("/usr/bin/cat"), os.path.exists("/usr/bin/ls"))`)
	if want := "/app hello there\nmade by the build copied v1\nFalse True\n"; r.code != 0 || r.stdout != want {
		t.Fatalf("a sandbox of the template: exit %d\n%q\nwant %q\n%s", r.code, r.stdout, want, r.stderr)
	}
	if r = build("built:1", "--build-arg", "WHO=the build"); r.code != 0 || strings.Count(r.stderr, "cached") < 4 {
		t.Fatalf("a rebuild: exit %d, want every step cached\n%s", r.code, r.stderr)
	}
	write("Dockerfile", "FROM base:1\nRUN echo half && exit 7\n")
	if r = build("failed:1"); r.code == 0 || !strings.Contains(r.stderr, "7") {
		t.Fatalf("a failing RUN: exit %d\n%s", r.code, r.stderr)
	}
	if ls := vivarium(t, "", "template", "ls", "--data-dir", dataDir); strings.Contains(ls.stdout, "failed") {
		t.Fatalf("a failed build is listed:\n%s", ls.stdout)
	}
	write("Dockerfile", "FROM base:1\nRUN rm /usr/bin/python3*\n")
	if r = build("nopython:1"); r.code != 0 {
		t.Fatalf("build without python: exit %d\n%s", r.code, r.stderr)
	}
	if r = run("nopython:1", "print(1)"); r.code == 0 || !strings.Contains(r.stdout+r.stderr, "no python3") {
		t.Fatalf("code in a template without python3: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// RUN as the image's root gives files to other users (as useradd
	// and package scripts do), and runs as any user the image names:
	// its ids, primary group and home from the image's /etc/passwd, its
	// supplementary groups from /etc/group.
	write("passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1001:1002:App:/srv/app:/bin/sh\n")
	write("group", "root:x:0:\napp:x:1002:\nstaff:x:50:other,app\n")
	asApp := `FROM base:1
COPY passwd group /etc/
RUN python3 -c "import os; os.makedirs('/srv/app'); os.chown('/srv/app', 1001, 1002)"
USER app
WORKDIR /srv/app
RUN id -u > who && id -g >> who && echo $HOME >> who && id -G >> who
`
	write("Dockerfile", asApp+"USER nobody-here\nRUN true\n")
	if r = build("users:1"); r.code == 0 || !strings.Contains(r.stderr, "invalid username: 'nobody-here'") {
		t.Fatalf("a RUN as a user the image lacks: exit %d\n%s", r.code, r.stderr)
	}
	write("Dockerfile", asApp)
	if r = build("users:1"); r.code != 0 {
		t.Fatalf("build as app: exit %d\n%s", r.code, r.stderr)
	}
	r = run("users:1", `import os
st = os.stat("who")
print(open("who").read().split(), st.st_uid, st.st_gid, os.stat(".").st_uid)`)
	if want := "['1001', '1002', '/srv/app', '1002', '50'] 1001 1002 1001\n"; r.code != 0 || r.stdout != want {
		t.Fatalf("a sandbox of the template built as app: exit %d\n%q\nwant %q\n%s", r.code, r.stdout, want, r.stderr)
	}
}

// A build's RUN reaches what --allow-net names through its sandbox's
// proxy, and nothing else; without it, nothing.
func TestTemplateBuildAllowNet(t *testing.T) {
	needSandbox(t)
	h := testutil.NewNetHost(t)
	dataDir, dir := t.TempDir(), t.TempDir()
	addTemplate(t, dataDir, "base:1", v1.Config{Env: []string{"PATH=/usr/bin:/bin"}})
	fetch := fmt.Sprintf(`import urllib.request, sys
try:
    print(urllib.request.urlopen("http://%s:%d/hello.txt", timeout=10).read().decode().strip())
except Exception as e:
    print("refused", type(e).__name__)
`, h.Addr, h.Port)
	if err := os.WriteFile(filepath.Join(dir, "fetch.py"), []byte(fetch), 0o644); err != nil {
		t.Fatal(err)
	}
	dockerfile := "FROM base:1\nCOPY fetch.py /fetch.py\nRUN python3 /fetch.py > /fetched.txt\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"net:1", []string{"--allow-net", fmt.Sprintf("%s/30:%d", h.Peer, h.Port)}, "hello from " + h.Name},
		// The cache does not know a step's network (as Docker's does
		// not): the same steps again, made anew.
		{"nonet:1", []string{"--no-cache"}, "refused URLError"},
	} {
		args := append([]string{"template", "build", "--data-dir", dataDir, "-t", c.name}, append(c.args, dir)...)
		if r := vivarium(t, "", args...); r.code != 0 {
			t.Fatalf("build %s: exit %d\n%s", c.name, r.code, r.stderr)
		}
		r := vivarium(t, "", "run", "--data-dir", dataDir, "--template", c.name, "-c", "print(open('/fetched.txt').read().strip())")
		if r.code != 0 || strings.TrimSpace(r.stdout) != c.want {
			t.Errorf("%s: %q, want %q (exit %d, %s)", c.name, r.stdout, c.want, r.code, r.stderr)
		}
	}
}

// A template's start command runs in each of its sandboxes, whose
// creation waits for its ready command; one that never gets ready fails
// the creation, saying what it printed.
func TestServeTemplateStartCommand(t *testing.T) {
	needSandbox(t)
	dataDir, dir := t.TempDir(), t.TempDir()
	addTemplate(t, dataDir, "base:1", v1.Config{Env: []string{"PATH=/usr/bin:/bin"}})
	for name, dockerfile := range map[string]string{
		"served:1": "FROM base:1\nCMD sleep 0.5 && echo up > /tmp/ready && sleep 1000\n",
		"broken:1": "FROM base:1\nCMD echo cannot start && exit 3\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
			t.Fatal(err)
		}
		if r := vivarium(t, "", "template", "build", "--data-dir", dataDir, "-t", name, dir); r.code != 0 {
			t.Fatalf("build %s: %s", name, r.stderr)
		}
	}
	// The ready command: the Dockerfile has none; set it as E2B's
	// setReadyCmd does, in the template's labels.
	s, err := image.Open(filepath.Join(dataDir, "images"), image.DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"served:1", "broken:1"} {
		im, err := s.Get(name)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := s.ConfigFile(im)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Config.Labels[template.LabelReadyCmd] = "test -f /tmp/ready"
		if _, err := s.Commit(name, cfg, im.Layers); err != nil {
			t.Fatal(err)
		}
	}
	srv := startServer(t, dataDir, "--dev", "--pool", "0", "--cgroup-parent", serveParent+"-template-start")
	code, body := req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{"template": "served:1"})
	var info struct{ ID string }
	if json.Unmarshal(body, &info); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	code, body = req(t, "POST", srv.url+"/v1/sandboxes/"+info.ID+"/execute", nil, map[string]any{"code": "print(open('/tmp/ready').read().strip())"})
	if code != 200 || !strings.Contains(string(body), `"stdout":"up\n"`) {
		t.Fatalf("created before it was ready: %d %s", code, body)
	}
	code, body = req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{"template": "broken:1"})
	if code/100 == 2 || !strings.Contains(string(body), "cannot start") {
		t.Fatalf("a template that never gets ready: %d %s", code, body)
	}
}

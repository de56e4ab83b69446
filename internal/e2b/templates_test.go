package e2b

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/template"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// fakeBuilder is a TemplateBuilder that records what it was asked, takes
// its COPY steps' files, writes a line of log per step, and fails or
// waits when told to.
type fakeBuilder struct {
	mu      sync.Mutex
	names   []string
	jobs    []service.BuildJob
	specs   []template.Spec
	added   int64               // what each build says its layers added
	copied  map[string][]string // a COPY's source → the names of its tar
	removed []string
	// fail: the error Build returns; gate: Build waits for it (or its
	// context) once it has written its log; started: told each build.
	fail    error
	gate    chan struct{}
	started chan string
	ended   chan error
}

func (f *fakeBuilder) Build(ctx context.Context, job service.BuildJob, spec template.Spec, files service.BuildFiles, log io.Writer) (service.Built, error) {
	name := job.Name
	f.mu.Lock()
	f.names = append(f.names, name)
	f.jobs = append(f.jobs, job)
	f.specs = append(f.specs, spec)
	f.mu.Unlock()
	for i, st := range spec.Steps {
		fmt.Fprintf(log, "step %d: %s %s\n", i+1, st.Type, strings.Join(st.Args, " "))
		if st.Type != template.Copy {
			continue
		}
		var buf bytes.Buffer
		if _, err := files.Archive(st.Args[0], &buf); err != nil {
			return service.Built{}, err
		}
		var names []string
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			content, _ := io.ReadAll(tr)
			names = append(names, h.Name+"="+string(content))
		}
		f.mu.Lock()
		f.copied[st.Args[0]] = names
		f.mu.Unlock()
	}
	if f.started != nil {
		f.started <- name
	}
	var err error
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err == nil {
		err = f.fail
	}
	if f.ended != nil {
		f.ended <- err
	}
	if err != nil {
		return service.Built{}, err
	}
	return service.Built{Image: image.Image{Name: name, Digest: "sha256:" + strings.Repeat("ab", 32)}, Added: f.added}, nil
}

func (f *fakeBuilder) Remove(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, name)
	return nil
}

func (f *fakeBuilder) spec(i int) template.Spec {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.specs[i]
}

var _ service.TemplateRemover = (*fakeBuilder)(nil)

// stepError is a builder's error that names its step.
type stepError struct {
	step int
	msg  string
}

func (e stepError) Error() string  { return e.msg }
func (e stepError) BuildStep() int { return e.step }

// newBuildServer serves the adapter, as newTestServer does, with
// template builds by b (nil: none) within cfg.
func newBuildServer(t *testing.T, b *fakeBuilder, cfg service.BuildConfig) (buildClient, *service.Service, *Server) {
	t.Helper()
	if b != nil {
		b.copied = map[string][]string{}
		cfg.Builder = b
	}
	if cfg.FilesDir == "" {
		cfg.FilesDir = t.TempDir()
	}
	svc := service.New(service.Config{Backend: fakeBackend{t.TempDir()}, Builds: cfg})
	t.Cleanup(func() { svc.Close() })
	h := New(Config{Service: svc, Auth: keys{"key-a": "a", "key-b": "b"}, Prefix: "/e2b"})
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return buildClient{client{t, ts.URL}}, svc, h
}

type buildClient struct{ client }

// call sends a JSON body (or none) with key, and decodes the answer into
// out (when not nil), returning its status and body.
func (c buildClient) call(key, method, path, body string, out any) (int, string) {
	c.t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	h := map[string]string{"Content-Type": "application/json"}
	if key != "" {
		h["X-API-Key"] = key
	}
	resp, b := c.do(method, path, r, h)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

type requested struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
}

func (c buildClient) request(key, body string) requested {
	c.t.Helper()
	var out requested
	if code, b := c.call(key, "POST", "/e2b/v3/templates", body, &out); code != http.StatusAccepted {
		c.t.Fatalf("request build: %d %s", code, b)
	}
	return out
}

type filesLink struct {
	Present bool   `json:"present"`
	URL     string `json:"url"`
}

func (c buildClient) link(key string, r requested, hash string) filesLink {
	c.t.Helper()
	var out filesLink
	if code, b := c.call(key, "GET", "/e2b/templates/"+r.TemplateID+"/files/"+hash, "", &out); code != http.StatusCreated {
		c.t.Fatalf("files link: %d %s", code, b)
	}
	return out
}

// upload PUTs body to an upload URL, without a key, as the SDK does.
func (c buildClient) upload(u string, body []byte) (int, string) {
	c.t.Helper()
	req, err := http.NewRequest("PUT", u, bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type status struct {
	Status     string `json:"status"`
	LogEntries []struct {
		Timestamp string `json:"timestamp"`
		Level     string `json:"level"`
		Message   string `json:"message"`
	} `json:"logEntries"`
	Logs   []string `json:"logs"`
	Reason *struct {
		Message string  `json:"message"`
		Step    *string `json:"step"`
	} `json:"reason"`
}

func (c buildClient) status(key string, r requested, query string) status {
	c.t.Helper()
	var out status
	path := "/e2b/templates/" + r.TemplateID + "/builds/" + r.BuildID + "/status" + query
	if code, b := c.call(key, "GET", path, "", &out); code != http.StatusOK {
		c.t.Fatalf("status: %d %s", code, b)
	}
	return out
}

// wait polls a build's status until it is ready or failed.
func (c buildClient) wait(key string, r requested) status {
	c.t.Helper()
	var st status
	testutil.WaitFor(c.t, 10*time.Second, "the build to end", func() bool {
		st = c.status(key, r, "")
		return st.Status == "ready" || st.Status == "error"
	})
	return st
}

func (c buildClient) start(key string, r requested, body string) (int, string) {
	c.t.Helper()
	return c.call(key, "POST", "/e2b/v2/templates/"+r.TemplateID+"/builds/"+r.BuildID, body, nil)
}

type entry struct {
	hdr     tar.Header
	content string
}

// archive is a tar of entries, gzipped if gz.
func archive(t *testing.T, gz bool, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := e.hdr
		if h.Typeflag == tar.TypeReg && h.Size == 0 {
			h.Size = int64(len(e.content))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.content)
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

func file(name, content string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name}, content: content}
}

func dir(name string) entry {
	return entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755}}
}

var (
	hash1 = strings.Repeat("1", 64)
	hash2 = strings.Repeat("2", 64)
)

// The SDK's whole exchange: a build requested, a COPY's files uploaded
// through the URL answered, the build started and its log polled by
// offsets until it is ready; then the name exists, its tag names the
// build, and a delete removes it and its image.
func TestTemplateBuild(t *testing.T) {
	b := &fakeBuilder{gate: make(chan struct{})}
	c, svc, _ := newBuildServer(t, b, service.BuildConfig{})

	r := c.request("key-a", `{"name":"My-Env","cpuCount":2,"memoryMB":1024,"someNewField":1}`)
	if r.TemplateID == "" || r.BuildID == "" || len(r.Names) != 1 || r.Names[0] != "my-env" ||
		fmt.Sprint(r.Tags) != "[default]" {
		t.Fatalf("%+v", r)
	}
	if st := c.status("key-a", r, ""); st.Status != "waiting" {
		t.Fatalf("before its start a build is %q, want waiting", st.Status)
	}
	l := c.link("key-a", r, hash1)
	if l.Present || !strings.HasPrefix(l.URL, c.base+"/e2b/templates/"+r.TemplateID+"/files/"+hash1+"?") {
		t.Fatalf("%+v", l)
	}
	files := archive(t, true, dir("folder"), file("folder/test.txt", "This is a test file."),
		entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: "folder/link.txt", Linkname: "test.txt"}},
		file("other.txt", "not copied"))
	if code, body := c.upload(l.URL, files); code != http.StatusOK {
		t.Fatalf("upload: %d %s", code, body)
	}
	if l := c.link("key-a", r, hash1); !l.Present || l.URL != "" {
		t.Fatalf("after its upload: %+v", l)
	}

	spec := `{"fromImage":"ubuntu:22.04","force":true,"startCmd":"echo hi","readyCmd":"sleep 1","steps":[
		{"type":"COPY","args":["folder/*","folder","",""],"filesHash":"` + hash1 + `","forceUpload":true,"resolveSymlinks":false},
		{"type":"RUN","args":["cat folder/test.txt"],"force":false},
		{"type":"ENV","args":["A","1","B","2"]}]}`
	if code, body := c.start("key-a", r, spec); code != http.StatusAccepted {
		t.Fatalf("start: %d %s", code, body)
	}
	if code, body := c.start("key-a", r, spec); code != http.StatusConflict {
		t.Errorf("a build started twice: %d %s, want 409", code, body)
	}
	if st := c.status("key-a", r, ""); st.Status != "building" {
		t.Errorf("a running build is %q", st.Status)
	}
	// The log, polled by offsets as the SDK does, from line 0 on.
	testutil.WaitFor(t, 10*time.Second, "the builder's log", func() bool {
		return len(c.status("key-a", r, "").LogEntries) == 3
	})
	st := c.status("key-a", r, "?logsOffset=1&limit=1")
	if len(st.LogEntries) != 1 || st.LogEntries[0].Message != "step 2: RUN cat folder/test.txt" ||
		st.LogEntries[0].Level != "info" || len(st.Logs) != 1 {
		t.Errorf("offset 1, limit 1: %+v", st)
	}
	if _, err := time.Parse(time.RFC3339Nano, st.LogEntries[0].Timestamp); err != nil {
		t.Error(err)
	}
	if st := c.status("key-a", r, "?logsOffset=3"); len(st.LogEntries) != 0 {
		t.Errorf("past the log: %+v", st.LogEntries)
	}
	close(b.gate)
	if st := c.wait("key-a", r); st.Status != "ready" || st.Reason != nil {
		t.Fatalf("%+v", st)
	}

	got := b.spec(0)
	if got.FromImage != "ubuntu:22.04" || got.StartCmd != "echo hi" || got.ReadyCmd != "sleep 1" || len(got.Steps) != 3 ||
		got.Steps[0].FilesHash != hash1 || !got.Steps[1].Force || got.Steps[2].Args[3] != "2" {
		t.Errorf("the builder got %+v", got)
	}
	// What COPY folder/* takes: folder's entries, by their names.
	if fmt.Sprint(b.copied["folder/*"]) != "[test.txt=This is a test file. link.txt=]" {
		t.Errorf("COPY folder/* gave %q", b.copied["folder/*"])
	}
	name := b.names[0]
	if !strings.HasPrefix(name, "templates.vivarium/k") || !strings.HasSuffix(name, "/"+r.TemplateID+":"+r.BuildID) {
		t.Errorf("the image's name: %s", name)
	}

	for _, ref := range []string{"my-env", "MY-ENV:default", r.TemplateID, "my-env:" + r.BuildID} {
		if im, err := svc.TemplateImage("a", ref); err != nil || im.Name != name {
			t.Errorf("TemplateImage(%q): %+v, %v", ref, im, err)
		}
	}
	if code, body := c.call("key-a", "GET", "/e2b/templates/aliases/my-env", "", nil); code != 200 || !strings.Contains(body, r.TemplateID) {
		t.Errorf("alias: %d %s", code, body)
	}
	var tags []map[string]string
	if code, body := c.call("key-a", "GET", "/e2b/templates/my-env/tags", "", &tags); code != 200 || len(tags) != 1 ||
		tags[0]["tag"] != "default" || tags[0]["buildID"] != r.BuildID || tags[0]["createdAt"] == "" {
		t.Errorf("tags: %d %s", code, body)
	}

	if code, body := c.call("key-a", "DELETE", "/e2b/templates/my-env", "", nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	if code, _ := c.call("key-a", "GET", "/e2b/templates/aliases/my-env", "", nil); code != 404 {
		t.Errorf("a deleted template's alias: %d", code)
	}
	if fmt.Sprint(b.removed) != "["+name+"]" {
		t.Errorf("removed %v, want its image", b.removed)
	}
	if code, _ := c.call("key-a", "DELETE", "/e2b/templates/my-env", "", nil); code != 404 {
		t.Errorf("deleted twice: %d", code)
	}
}

// A build that fails says why and at which step, in the SDK's terms;
// what the builder says that is not written for clients stays in the
// server's log.
func TestTemplateBuildFails(t *testing.T) {
	spec := `{"fromImage":"ubuntu:22.04","steps":[{"type":"RUN","args":["true"]},{"type":"RUN","args":["false"]}]}`
	for _, tc := range []struct {
		name     string
		fail     error
		step     string // "": none
		want     string
		notShown string
	}{
		{"a step", stepError{2, "RUN false: exit status 1 in /var/lib/vivarium/x"}, "2", "step 2 (RUN) failed (see the build's log)", "/var/lib"},
		{"the base", fmt.Errorf("pull: %w: no such host", image.ErrNotFound), "", "no such image", ""},
		{"the base, by step", stepError{0, "pulling"}, "base", "the build's base could not be made", ""},
		{"the start", stepError{3, "ready"}, "finalize", "the start or ready command failed", ""},
		{"a refused spec", fmt.Errorf("%w: WORKDIR: relative", template.ErrInvalid), "", "WORKDIR: relative", ""},
		{"anything", errors.New("open /srv/secret: denied"), "", "the build failed (see the build's log)", "/srv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _, _ := newBuildServer(t, &fakeBuilder{fail: tc.fail}, service.BuildConfig{})
			r := c.request("key-a", `{"name":"broken"}`)
			if code, body := c.start("key-a", r, spec); code != http.StatusAccepted {
				t.Fatalf("start: %d %s", code, body)
			}
			st := c.wait("key-a", r)
			if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, tc.want) {
				t.Fatalf("%+v", st)
			}
			if got := ""; st.Reason.Step != nil {
				got = *st.Reason.Step
				if got != tc.step {
					t.Errorf("step %q, want %q", got, tc.step)
				}
			} else if tc.step != "" {
				t.Errorf("no step, want %q", tc.step)
			}
			if tc.notShown != "" && strings.Contains(fmt.Sprint(st), tc.notShown) {
				t.Errorf("the client is shown %q: %+v", tc.notShown, st)
			}
			// The reason ends the log too, where the SDK prints it.
			last := st.LogEntries[len(st.LogEntries)-1]
			if last.Level != "error" || last.Message != st.Reason.Message {
				t.Errorf("the log ends with %+v", last)
			}
			if code, _ := c.call("key-a", "GET", "/e2b/templates/aliases/broken", "", nil); code != 200 {
				t.Errorf("a template whose build failed exists, as in E2B: %d", code)
			}
		})
	}
}

// A base template is one of the key's, given to the builder as its
// image; one the key does not have fails the build at its base.
func TestTemplateFromTemplate(t *testing.T) {
	b := &fakeBuilder{}
	c, _, _ := newBuildServer(t, b, service.BuildConfig{})
	base := c.request("key-a", `{"name":"base-env:v1"}`)
	c.start("key-a", base, `{"fromImage":"python:3"}`)
	c.wait("key-a", base)

	r := c.request("key-a", `{"name":"child"}`)
	c.start("key-a", r, `{"fromTemplate":"base-env:v1","steps":[{"type":"RUN","args":["true"]}]}`)
	if st := c.wait("key-a", r); st.Status != "ready" {
		t.Fatalf("%+v", st)
	}
	if got := b.spec(1).FromTemplate; got != b.names[0] {
		t.Errorf("fromTemplate given as %q, want the base build's image %q", got, b.names[0])
	}
	r = c.request("key-a", `{"name":"child2"}`)
	c.start("key-a", r, `{"fromTemplate":"base"}`)
	if st := c.wait("key-a", r); st.Status != "ready" || b.spec(2).FromTemplate != "base" {
		t.Errorf("E2B's own base is the builder's to map: %+v %q", st, b.spec(2).FromTemplate)
	}

	// Another key's template is none of this one's.
	other := c.request("key-b", `{"name":"child"}`)
	c.start("key-b", other, `{"fromTemplate":"base-env:v1"}`)
	st := c.wait("key-b", other)
	if st.Status != "error" || st.Reason == nil || st.Reason.Step == nil || *st.Reason.Step != "base" ||
		!strings.Contains(st.Reason.Message, `template "base-env:v1" not found`) {
		t.Errorf("%+v", st)
	}
}

// Uploads are hostile input: each of these is refused with a message
// that says why, and nothing of it is kept.
func TestTemplateUploadRefused(t *testing.T) {
	c, _, h := newBuildServer(t, &fakeBuilder{}, service.BuildConfig{MaxUpload: 64 << 10,
		Archive: template.ArchiveLimits{MaxBytes: 1 << 20, MaxEntries: 10}})
	r := c.request("key-a", `{"name":"hostile"}`)
	l := c.link("key-a", r, hash1)

	var bomb bytes.Buffer // 8 MiB of zeros, gzipped to a few KiB
	zw := gzip.NewWriter(&bomb)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Size: 8 << 20, Mode: 0o644})
	tw.Write(make([]byte, 8<<20))
	tw.Close()
	zw.Close()
	huge := make([]byte, 65<<10)
	var many []entry
	for i := range 11 {
		many = append(many, file(fmt.Sprintf("f%d", i), "x"))
	}
	past := strconvItoa(time.Now().Add(-time.Minute).Unix())
	expired := strings.Split(l.URL, "?")[0] + "?expires=" + past + "&signature=" + h.uploadSignature(r.TemplateID, hash1, past)
	for _, tc := range []struct {
		name   string
		url    string
		body   []byte
		status int
		want   string
	}{
		{"a gzip bomb", l.URL, bomb.Bytes(), 413, "more than 1048576 bytes uncompressed"},
		{"too large as sent", l.URL, huge, 413, "at most 65536 bytes as uploaded"},
		{"too many files", l.URL, archive(t, true, many...), 413, "more than 10 files"},
		{"a path outside", l.URL, archive(t, true, file("../evil", "x")), 400, "outside the build's files"},
		{"a path outside, deeper", l.URL, archive(t, false, file("a/../../evil", "x")), 400, "outside the build's files"},
		{"an absolute path", l.URL, archive(t, true, file("/etc/passwd", "x")), 400, "an absolute path"},
		{"a hard link", l.URL, archive(t, true, file("a", "x"), entry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "b", Linkname: "a"}}), 400, "a hard link"},
		{"a device", l.URL, archive(t, true, entry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3}}), 400, "not a file, a directory or a symbolic link"},
		{"not an archive", l.URL, []byte("hello, not a tar at all, but long enough to be read as one header, or not...."), 400, "not a valid tar archive"},
		{"broken gzip", l.URL, []byte{0x1f, 0x8b, 0, 1, 2}, 400, "not valid gzip"},
		{"another hash than signed", strings.Replace(l.URL, hash1, hash2, 1), archive(t, true, file("a", "x")), 403, "invalid upload URL"},
		{"no signature", strings.Split(l.URL, "?")[0], archive(t, true, file("a", "x")), 403, "invalid upload URL"},
		{"expired", expired, archive(t, true, file("a", "x")), 403, "expired"},
	} {
		code, body := c.upload(tc.url, tc.body)
		if code != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want %d %q", tc.name, code, body, tc.status, tc.want)
		}
	}
	for _, hash := range []string{hash1, hash2} {
		if l := c.link("key-a", r, hash); l.Present {
			t.Errorf("files of %s kept after a refusal", hash[:4])
		}
	}
	if code, body := c.call("key-a", "GET", "/e2b/templates/"+r.TemplateID+"/files/NOTAHASH", "", nil); code != 400 {
		t.Errorf("a hash that is not one: %d %s", code, body)
	}
	// A build whose COPY's files were never uploaded does not start.
	code, body := c.start("key-a", r, `{"fromImage":"x","steps":[{"type":"COPY","args":["a","b"],"filesHash":"`+hash2+`"}]}`)
	if code != 400 || !strings.Contains(body, "its files were not uploaded") {
		t.Errorf("start without the files: %d %s", code, body)
	}
	code, body = c.start("key-a", r, `{"fromImage":"x","fromImageRegistry":{"type":"registry","username":"u","password":"p"}}`)
	if code != 400 || !strings.Contains(body, "registry credentials") {
		t.Errorf("registry credentials: %d %s", code, body)
	}
}

func strconvItoa(n int64) string { return fmt.Sprint(n) }

// What a key may hold: builds running at once, templates, archives
// (the least recently used dropped for a new one, unless a running build
// holds it), and a build's log (its oldest lines dropped, offsets
// counting on).
func TestTemplateBounds(t *testing.T) {
	b := &fakeBuilder{gate: make(chan struct{}), started: make(chan string, 4)}
	c, _, _ := newBuildServer(t, b, service.BuildConfig{MaxRunning: 1, MaxTemplates: 2, MaxFiles: 1, MaxLogLines: 2})

	r1 := c.request("key-a", `{"name":"one"}`)
	l := c.link("key-a", r1, hash1)
	if code, body := c.upload(l.URL, archive(t, true, file("a", "1"))); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	copySteps := `{"fromImage":"x","steps":[{"type":"COPY","args":["a","a"],"filesHash":"` + hash1 + `"},{"type":"RUN","args":["x"]},{"type":"RUN","args":["y"]}]}`
	if code, body := c.start("key-a", r1, copySteps); code != 202 {
		t.Fatalf("%d %s", code, body)
	}
	<-b.started
	// hash1 is held by the running build: a second archive finds no room.
	l2 := c.link("key-a", r1, hash2)
	if code, body := c.upload(l2.URL, archive(t, true, file("b", "2"))); code != 429 || !strings.Contains(body, "running builds hold") {
		t.Errorf("an archive past the bound while the other is held: %d %s", code, body)
	}
	r2 := c.request("key-a", `{"name":"two"}`)
	if code, body := c.start("key-a", r2, `{"fromImage":"x"}`); code != 429 || !strings.Contains(body, "wait for one to finish") {
		t.Errorf("a second build at once: %d %s", code, body)
	}
	if code, body := c.call("key-a", "POST", "/e2b/v3/templates", `{"name":"three"}`, nil); code != 429 || !strings.Contains(body, "templates") {
		t.Errorf("a third template: %d %s", code, body)
	}
	// Another key has bounds of its own.
	other := c.request("key-b", `{"name":"one"}`)
	if code, body := c.start("key-b", other, `{"fromImage":"x"}`); code != 202 {
		t.Errorf("another key's build: %d %s", code, body)
	}
	<-b.started

	// The log keeps its last 2 lines; offsets count from the first.
	st := c.status("key-a", r1, "")
	if len(st.LogEntries) != 2 || st.LogEntries[0].Message != "step 2: RUN x" {
		t.Errorf("the bounded log: %+v", st.LogEntries)
	}
	if st := c.status("key-a", r1, "?logsOffset=2"); len(st.LogEntries) != 1 || st.LogEntries[0].Message != "step 3: RUN y" {
		t.Errorf("from offset 2: %+v", st.LogEntries)
	}
	close(b.gate)
	c.wait("key-a", r1)
	// Once the build ends, its archive gives way to a new one.
	if code, body := c.upload(l2.URL, archive(t, true, file("b", "2"))); code != 200 {
		t.Errorf("%d %s", code, body)
	}
	if c.link("key-a", r1, hash1).Present || !c.link("key-a", r1, hash2).Present {
		t.Error("the least recently used archive was not the one dropped")
	}
	if code, body := c.start("key-a", r2, `{"fromImage":"x"}`); code != 202 {
		t.Errorf("once the first ended: %d %s", code, body)
	}
}

// What a key's builds add to their bases is bounded (MaxBytes): a build
// may add the room its key has left, half of MaxBytes at most (two
// builds at once); a key whose templates hold it all starts none, until
// it deletes some; another key has room of its own.
func TestTemplateBuildBytes(t *testing.T) {
	const gib = 1 << 30
	b := &fakeBuilder{added: 6 * gib}
	c, _, _ := newBuildServer(t, b, service.BuildConfig{MaxBytes: 16 * gib})
	var ids []string
	for i, want := range []int64{8 * gib, 8 * gib, 4 * gib} {
		r := c.request("key-a", fmt.Sprintf(`{"name":"t%d"}`, i))
		if code, body := c.start("key-a", r, `{"fromImage":"x"}`); code != 202 {
			t.Fatalf("build %d: %d %s", i, code, body)
		}
		c.wait("key-a", r)
		if got := b.jobs[len(b.jobs)-1].MaxBytes; got != want {
			t.Errorf("build %d may add %d bytes, want %d", i, got, want)
		}
		ids = append(ids, r.TemplateID)
	}
	// 18 GiB held: no room for a fourth.
	r := c.request("key-a", `{"name":"t3"}`)
	if code, body := c.start("key-a", r, `{"fromImage":"x"}`); code != 429 || !strings.Contains(body, "delete templates") {
		t.Errorf("a build past the key's bytes: %d %s", code, body)
	}
	// Another key has room of its own.
	other := c.request("key-b", `{"name":"t0"}`)
	if code, body := c.start("key-b", other, `{"fromImage":"x"}`); code != 202 {
		t.Errorf("another key's build: %d %s", code, body)
	}
	c.wait("key-b", other)
	// Two templates deleted (12 GiB): room again, 8 GiB at most.
	for _, id := range ids[:2] {
		if code, body := c.call("key-a", "DELETE", "/e2b/templates/"+id, "", nil); code != 204 {
			t.Fatalf("delete %s: %d %s", id, code, body)
		}
	}
	if code, body := c.start("key-a", r, `{"fromImage":"x"}`); code != 202 {
		t.Fatalf("once templates were deleted: %d %s", code, body)
	}
	c.wait("key-a", r)
	if got := b.jobs[len(b.jobs)-1].MaxBytes; got != 8*gib {
		t.Errorf("after the deletes a build may add %d bytes, want %d", got, int64(8*gib))
	}
}

// A key sees its own templates and builds alone: another key can
// neither see, poll, start, upload to, tag nor delete them.
func TestTemplateKeysApart(t *testing.T) {
	c, svc, _ := newBuildServer(t, &fakeBuilder{}, service.BuildConfig{})
	r := c.request("key-a", `{"name":"mine"}`)
	l := c.link("key-a", r, hash1)
	c.start("key-a", r, `{"fromImage":"x"}`)
	c.wait("key-a", r)

	tid, bid := r.TemplateID, r.BuildID
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/e2b/templates/" + tid + "/builds/" + bid + "/status", ""},
		{"POST", "/e2b/v2/templates/" + tid + "/builds/" + bid, `{"fromImage":"x"}`},
		{"GET", "/e2b/templates/" + tid + "/files/" + hash1, ""},
		{"GET", "/e2b/templates/aliases/mine", ""},
		{"GET", "/e2b/templates/mine/tags", ""},
		{"GET", "/e2b/templates/" + tid + "/tags", ""},
		{"POST", "/e2b/templates/tags", `{"target":"mine:default","tags":["stolen"]}`},
		{"DELETE", "/e2b/templates/tags", `{"name":"mine","tags":["default"]}`},
		{"DELETE", "/e2b/templates/" + tid, ""},
		{"DELETE", "/e2b/templates/mine", ""},
	} {
		if code, body := c.call("key-b", tc.method, tc.path, tc.body, nil); code != 404 {
			t.Errorf("key-b: %s %s: %d %s, want 404", tc.method, tc.path, code, body)
		}
	}
	// A name is the key's: key-b builds its own "mine".
	rb := c.request("key-b", `{"name":"mine"}`)
	if rb.TemplateID == tid {
		t.Error("two keys' templates of one name share an ID")
	}
	if code, _ := c.call("key-a", "GET", "/e2b/templates/aliases/mine", "", nil); code != 200 {
		t.Error("key-a's template is gone")
	}
	if _, err := svc.TemplateImage("b", "mine"); !errors.Is(err, service.ErrTemplateNotFound) {
		t.Errorf("key-b's unbuilt mine: %v", err)
	}
	// An upload URL is the template's, whoever sends it (it is signed
	// for it), and lands in its key's files alone.
	if code, body := c.upload(l.URL, archive(t, true, file("a", "x"))); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	if c.link("key-b", rb, hash1).Present {
		t.Error("key-a's files are key-b's too")
	}
	// Without a key, nothing.
	if code, _ := c.call("", "GET", "/e2b/templates/aliases/mine", "", nil); code != 401 {
		t.Errorf("no key: %d", code)
	}
}

// A key revoked ends its running builds and forgets its templates and
// files.
func TestTemplateKeyRevoked(t *testing.T) {
	b := &fakeBuilder{gate: make(chan struct{}), started: make(chan string, 1), ended: make(chan error, 1)}
	c, svc, _ := newBuildServer(t, b, service.BuildConfig{})
	ready := c.request("key-a", `{"name":"built"}`)
	c.start("key-a", ready, `{"fromImage":"x"}`)
	<-b.started
	b.gate <- struct{}{}
	<-b.ended
	c.wait("key-a", ready)
	r := c.request("key-a", `{"name":"doomed"}`)
	c.start("key-a", r, `{"fromImage":"x"}`)
	<-b.started
	svc.CloseOwner("a")
	if err := <-b.ended; !errors.Is(err, context.Canceled) {
		t.Errorf("the running build ended with %v, want its context cancelled", err)
	}
	if code, _ := c.call("key-a", "GET", "/e2b/templates/aliases/doomed", "", nil); code != 404 {
		t.Errorf("a revoked key's template: %d", code)
	}
	if owner, ok := svc.TemplateOwner(r.TemplateID); ok {
		t.Errorf("the template is still %s's", owner)
	}
	testutil.WaitFor(t, 10*time.Second, "the ready build's image removed", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.removed) == 1 && b.removed[0] == b.names[0]
	})
}

// Tags: a build's tags from its name and its request, more assigned to
// it, some removed; tags that are not tags refused.
func TestTemplateTags(t *testing.T) {
	c, _, _ := newBuildServer(t, &fakeBuilder{}, service.BuildConfig{})
	r := c.request("key-a", `{"name":"e2b-tags-test:v1-0b5e","tags":["stable","v1-0b5e"]}`)
	if fmt.Sprint(r.Tags) != "[v1-0b5e stable]" {
		t.Errorf("tags %v", r.Tags)
	}
	c.start("key-a", r, `{"fromImage":"x"}`)
	c.wait("key-a", r)

	var assigned struct {
		BuildID string   `json:"buildID"`
		Tags    []string `json:"tags"`
	}
	code, body := c.call("key-a", "POST", "/e2b/templates/tags", `{"target":"e2b-tags-test:v1-0b5e","tags":["production","latest"]}`, &assigned)
	if code != 201 || assigned.BuildID != r.BuildID || fmt.Sprint(assigned.Tags) != "[production latest]" {
		t.Errorf("assign: %d %s", code, body)
	}
	for _, bad := range []string{`":invalid-tag"`, `"e2b-tags-test:"`, `""`, `"a b"`} {
		if code, body := c.call("key-a", "POST", "/e2b/templates/tags", `{"target":"e2b-tags-test:v1-0b5e","tags":[`+bad+`]}`, nil); code != 400 {
			t.Errorf("tag %s: %d %s", bad, code, body)
		}
	}
	if code, _ := c.call("key-a", "POST", "/e2b/templates/tags", `{"target":"e2b-tags-test","tags":["x"]}`, nil); code != 404 {
		t.Errorf("a target without a tag is its default tag, which this template has not: %d", code)
	}
	if code, body := c.call("key-a", "DELETE", "/e2b/templates/tags", `{"name":"e2b-tags-test","tags":["latest","stable"]}`, nil); code != 204 {
		t.Errorf("remove: %d %s", code, body)
	}
	var tags []map[string]string
	c.call("key-a", "GET", "/e2b/templates/e2b-tags-test/tags", "", &tags)
	var names []string
	for _, x := range tags {
		names = append(names, x["tag"])
	}
	if fmt.Sprint(names) != "[production v1-0b5e]" {
		t.Errorf("tags now %v", names)
	}
	if code, _ := c.call("key-a", "DELETE", "/e2b/templates/tags", `{"name":"nonexistent","tags":["x"]}`, nil); code != 404 {
		t.Errorf("remove of a template that is not: %d", code)
	}
	if code, _ := c.call("key-a", "GET", "/e2b/templates/nonexistent/tags", "", nil); code != 404 {
		t.Errorf("tags of a template that is not: %d", code)
	}
}

// Template.exists: E2B's own templates exist for every key, a key's
// snapshots' names for it, anything else not; without a builder the
// build API says it is not enabled.
func TestTemplateAliasesAndBuildsOff(t *testing.T) {
	c, _, _ := newBuildServer(t, nil, service.BuildConfig{})
	for name, want := range map[string]int{"base": 200, "code-interpreter-v1": 200, "nonexistent-1234": 404} {
		if code, body := c.call("key-a", "GET", "/e2b/templates/aliases/"+name, "", nil); code != want {
			t.Errorf("%s: %d %s, want %d", name, code, body, want)
		}
	}
	if code, body := c.call("key-a", "POST", "/e2b/v3/templates", `{"name":"x"}`, nil); code != 501 || !strings.Contains(body, "not enabled") {
		t.Errorf("a build without a builder: %d %s", code, body)
	}
	if code, body := c.call("key-a", "POST", "/e2b/v3/templates", `{}`, nil); code != 400 {
		t.Errorf("a build without a name: %d %s", code, body)
	}
	// The upload route needs its signature, never a key.
	u := url.URL{Path: "/e2b/templates/x/files/" + hash1}
	if code, _ := c.upload(c.base+u.String(), nil); code != 403 {
		t.Errorf("an unsigned upload: %d", code)
	}
}

// Finished builds past MaxKept that no tag names are forgotten, their
// images removed; a tagged one is kept, its log dropped.
func TestTemplateKeptBuilds(t *testing.T) {
	b := &fakeBuilder{}
	c, _, _ := newBuildServer(t, b, service.BuildConfig{MaxKept: 1})
	var rs []requested
	for i := range 4 {
		tag := "default"
		if i == 0 {
			tag = "pinned"
		}
		r := c.request("key-a", `{"name":"kept:`+tag+`"}`)
		c.start("key-a", r, `{"fromImage":"x","steps":[{"type":"RUN","args":["true"]}]}`)
		c.wait("key-a", r)
		rs = append(rs, r)
	}
	// The second and third lost their tag to the next: the second is past
	// MaxKept.
	if code, _ := c.call("key-a", "GET", "/e2b/templates/"+rs[1].TemplateID+"/builds/"+rs[1].BuildID+"/status", "", nil); code != 404 {
		t.Errorf("an untagged build past the bound: %d", code)
	}
	testutil.WaitFor(t, 10*time.Second, "its image removed", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.removed) == 1 && b.removed[0] == b.names[1]
	})
	// The first is tagged "pinned": kept, without its log.
	if st := c.status("key-a", rs[0], ""); st.Status != "ready" || len(st.LogEntries) != 0 {
		t.Errorf("the tagged build: %+v", st)
	}
	if st := c.status("key-a", rs[3], ""); len(st.LogEntries) != 1 {
		t.Errorf("the last build's log: %+v", st.LogEntries)
	}
}

// A key's templates, their tags, ready builds and uploaded files are
// kept in the files directory: the next server on it has them.
func TestTemplatesSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	c, svc, _ := newBuildServer(t, &fakeBuilder{}, service.BuildConfig{FilesDir: dir})
	r := c.request("key-a", `{"name":"kept:v1"}`)
	c.upload(c.link("key-a", r, hash1).URL, archive(t, true, file("a", "x")))
	c.start("key-a", r, `{"fromImage":"x","steps":[{"type":"COPY","args":["a","a"],"filesHash":"`+hash1+`"}]}`)
	c.wait("key-a", r)
	c.call("key-a", "POST", "/e2b/templates/tags", `{"target":"kept:v1","tags":["prod"]}`, nil)
	failed := c.request("key-a", `{"name":"kept"}`) // waiting: the running server's alone
	im, err := svc.TemplateImage("a", "kept:prod")
	if err != nil {
		t.Fatal(err)
	}
	svc.Close()

	b := &fakeBuilder{}
	c, svc, _ = newBuildServer(t, b, service.BuildConfig{FilesDir: dir})
	if got, err := svc.TemplateImage("a", "kept:prod"); err != nil || got.Name != im.Name || got.Digest != im.Digest {
		t.Errorf("after a restart: %+v, %v; want %+v", got, err, im)
	}
	if st := c.status("key-a", r, ""); st.Status != "ready" {
		t.Errorf("the ready build after a restart: %+v", st)
	}
	if code, _ := c.call("key-a", "GET", "/e2b/templates/"+failed.TemplateID+"/builds/"+failed.BuildID+"/status", "", nil); code != 404 {
		t.Errorf("a build that never ran, after a restart: %d", code)
	}
	var tags []map[string]string
	c.call("key-a", "GET", "/e2b/templates/kept/tags", "", &tags)
	if len(tags) != 2 {
		t.Errorf("tags after a restart: %v", tags)
	}
	if !c.link("key-a", r, hash1).Present {
		t.Error("the uploaded files are gone after a restart")
	}
	if code, _ := c.call("key-b", "GET", "/e2b/templates/aliases/kept", "", nil); code != 404 {
		t.Errorf("another key sees the template after a restart: %d", code)
	}
	if code, _ := c.call("key-a", "DELETE", "/e2b/templates/kept", "", nil); code != 204 {
		t.Fatalf("delete after a restart: %d", code)
	}
	if fmt.Sprint(b.removed) != "["+im.Name+"]" {
		t.Errorf("removed %v, want %s", b.removed, im.Name)
	}
}

// A key sends at most 4 archives at once: each is staged whole before
// its bounds are checked.
func TestTemplateUploadsAtOnce(t *testing.T) {
	files := t.TempDir()
	c, _, _ := newBuildServer(t, &fakeBuilder{}, service.BuildConfig{FilesDir: files})
	r := c.request("key-a", `{"name":"slow"}`)
	l := c.link("key-a", r, hash1)
	var writers []*io.PipeWriter
	done := make(chan struct{}, 4)
	for range 4 {
		pr, pw := io.Pipe()
		writers = append(writers, pw)
		go func() {
			defer func() { done <- struct{}{} }()
			req, _ := http.NewRequest("PUT", l.URL, pr)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		pw.Write([]byte("partial"))
	}
	closeAll := func() {
		for _, w := range writers {
			w.CloseWithError(errors.New("client gone"))
		}
	}
	t.Cleanup(closeAll) // before the server's close, which waits for them
	// Each holds its slot once its archive is staged. A fifth sent
	// earlier could take the slot of one of the four, which would be
	// refused instead.
	testutil.WaitFor(t, 30*time.Second, "four uploads staged", func() bool {
		staged, _ := filepath.Glob(filepath.Join(files, "staging", "*"))
		return len(staged) == 4
	})
	body := archive(t, true, file("a", "x"))
	if code, b := c.upload(l.URL, body); code != http.StatusTooManyRequests {
		t.Fatalf("a fifth upload: %d %s, want %d", code, b, http.StatusTooManyRequests)
	}
	rb := c.request("key-b", `{"name":"other"}`)
	if code, body := c.upload(c.link("key-b", rb, hash1).URL, body); code != 200 {
		t.Errorf("another key's upload meanwhile: %d %s", code, body)
	}
	closeAll()
	for range 4 {
		<-done
	}
	testutil.WaitFor(t, 10*time.Second, "an upload taken again", func() bool {
		code, _ := c.upload(l.URL, body)
		return code == http.StatusOK
	})
}

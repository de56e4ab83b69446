package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vivarium-sandbox/vivarium/internal/image"
)

// tentry is one entry of a test layer.
type tentry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
}

func tarOf(t *testing.T, entries ...tentry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.uid,
			Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

const passwd = "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"

// newStore is a store holding the image base:1: a Debian-like root
// with a user (1000), a home of its own and /bin a link to usr/bin.
func newStore(t *testing.T) *image.Store {
	t.Helper()
	return newStoreWith(t, image.DefaultLimits)
}

func newStoreWith(t *testing.T, lim image.Limits) *image.Store {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a layer's files keep the owners the image gives them")
	}
	s, err := image.Open(filepath.Join(t.TempDir(), "images"), lim)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.AddLayer(bytes.NewReader(tarOf(t,
		tentry{name: "etc/", typ: tar.TypeDir},
		tentry{name: "etc/passwd", body: passwd},
		tentry{name: "etc/group", body: "root:x:0:\nuser:x:1000:\n"},
		tentry{name: "home/user/", typ: tar.TypeDir, mode: 0o750, uid: 1000},
		tentry{name: "usr/bin/sh", body: "#!", mode: 0o755},
		tentry{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		tentry{name: "old/", typ: tar.TypeDir},
		tentry{name: "old/file", body: "old"},
	)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := &v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH,
		Config: v1.Config{Env: []string{"PATH=/usr/bin:/bin"}, Labels: map[string]string{"base": "yes"}}}
	if _, err := s.Commit("base:1", cfg, []string{id}); err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeSandboxes runs a RUN step by changing a real upper directory: the
// command "exit N" fails with status N; "rm PATH" whites PATH out; any
// other command writes the file out/CMD holding the command.
type fakeSandboxes struct {
	mu   sync.Mutex
	runs []RunRequest
}

func (f *fakeSandboxes) Run(ctx context.Context, r RunRequest) error {
	f.mu.Lock()
	f.runs = append(f.runs, r)
	f.mu.Unlock()
	cmd := r.Args[2]
	fmt.Fprintf(r.Log, "running %s\n", cmd)
	var status int
	if _, err := fmt.Sscanf(cmd, "exit %d", &status); err == nil {
		fmt.Fprintf(r.Log, "line 1\nline 2\nlast words\n")
		return &ExitError{Status: status}
	}
	upper, err := os.MkdirTemp("", "upper-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(upper)
	// The sandbox's ids are host ids from uid0 on; what it makes is its
	// user's.
	const uid0 = 200_000
	id := uid0 + r.UID
	switch {
	case strings.HasPrefix(cmd, "rm "):
		p := filepath.Join(upper, strings.TrimPrefix(cmd, "rm "))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.Chown(filepath.Dir(p), uid0, uid0) // copied up, as the image has it
		if err := syscall.Mknod(p, syscall.S_IFCHR, 0); err != nil {
			return err
		}
	case cmd != "true":
		out := filepath.Join(upper, "out")
		file := filepath.Join(out, strings.ReplaceAll(cmd, " ", "-"))
		os.Mkdir(out, 0o755)
		if err := os.WriteFile(file, []byte(cmd), 0o644); err != nil {
			return err
		}
		os.Chown(out, uid0, uid0)
		if err := os.Chown(file, id, id); err != nil {
			return err
		}
	}
	return r.Commit(upper, uid0, uid0)
}

func (f *fakeSandboxes) commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.runs {
		out = append(out, r.Args[2])
	}
	return out
}

func newBuilder(t *testing.T, s *image.Store) (*Builder, *fakeSandboxes) {
	f := &fakeSandboxes{}
	return &Builder{Store: s, Sandboxes: f, CacheDir: filepath.Join(t.TempDir(), "cache")}, f
}

// viewOf reads the built image's file system.
func viewOf(t *testing.T, s *image.Store, im image.Image) *rootView {
	t.Helper()
	v := &rootView{}
	for _, id := range im.Layers {
		v.layers = append(v.layers, s.LayerDir(id))
	}
	return v
}

// stat is p of the image: its content (files), mode and owners; err
// when it has none.
func stat(t *testing.T, v *rootView, p string) (string, fs.FileMode, int, error) {
	t.Helper()
	_, f, err := v.stat(p)
	if err != nil {
		return "", 0, 0, err
	}
	uid, _ := ownerOf(f.fi)
	body, _ := v.readFile(p)
	return body, f.fi.Mode(), uid, nil
}

func specOf(t *testing.T, dockerfile string) Spec {
	t.Helper()
	spec, _ := parse(t, dockerfile, nil)
	return spec
}

func openContext(t *testing.T, files map[string]string) *Context {
	t.Helper()
	c, err := OpenContext(writeTree(t, files))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestBuildCopyAndConfig(t *testing.T) {
	s := newStore(t)
	b, _ := newBuilder(t, s)
	ctx := openContext(t, map[string]string{
		"app.py": "print(1)", "lib/a.py": "a", "lib/sub/b.py": "b", "tool": "tool", "secret.txt": "no",
		".dockerignore": "secret.txt\n",
	})
	spec := specOf(t, `FROM base:1
COPY app.py /app/
COPY lib /opt/lib
COPY app.py /etc/renamed.py
COPY --chown=user:user --chmod=0700 app.py /home/user/
COPY lib/a.py /home/user
COPY tool /bin/
COPY . /ctx
ENV A=1 B="two words"
WORKDIR /work/dir
USER user
WORKDIR mine
LABEL x=y
CMD ["python3", "app.py"]
`)
	var log bytes.Buffer
	im, err := b.Build(context.Background(), "tpl:1", spec, ctx, &log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if im.Name != "index.docker.io/library/tpl:1" {
		t.Errorf("named %s", im.Name)
	}
	if !strings.Contains(log.String(), "step 1/11: COPY app.py /app/\n") || !strings.Contains(log.String(), "step 11/11: WORKDIR /work/dir/mine\n") {
		t.Errorf("the log:\n%s", log.String())
	}
	v := viewOf(t, s, im)
	for p, want := range map[string]string{
		"/app/app.py": "print(1)", "/opt/lib/a.py": "a", "/opt/lib/sub/b.py": "b", "/etc/renamed.py": "print(1)",
		"/home/user/a.py": "a", "/usr/bin/tool": "tool", "/ctx/app.py": "print(1)", "/ctx/lib/sub/b.py": "b",
		"/etc/passwd": passwd, "/old/file": "old",
	} {
		if got, _, _, err := stat(t, v, p); err != nil || got != want {
			t.Errorf("%s reads %q (%v), want %q", p, got, err, want)
		}
	}
	if _, _, _, err := stat(t, v, "/ctx/secret.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file .dockerignore leaves out was copied: %v", err)
	}
	if _, mode, uid, err := stat(t, v, "/home/user/app.py"); err != nil || uid != 1000 || mode.Perm() != 0o700 {
		t.Errorf("COPY --chown --chmod: owner %d, mode %v (%v)", uid, mode, err)
	}
	// The directories on the way keep what the image gives them.
	if _, mode, uid, err := stat(t, v, "/home/user"); err != nil || uid != 1000 || mode.Perm() != 0o750 {
		t.Errorf("/home/user after a COPY into it: owner %d, mode %v (%v)", uid, mode, err)
	}
	if _, f, err := v.stat("/bin"); err != nil || !f.fi.IsDir() {
		t.Errorf("/bin: %v", err)
	}
	if f, _, _ := lstatIn(v.layers[0], []string{"bin"}); f.fi == nil || f.fi.Mode()&fs.ModeSymlink == 0 {
		t.Error("/bin is no longer the base's link")
	}
	if top, err := v.lstat("bin"); err != nil || top.fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("a COPY to /bin/ hid the link /bin: %v", err)
	}
	if _, mode, uid, err := stat(t, v, "/work/dir"); err != nil || !mode.IsDir() || uid != 0 {
		t.Errorf("WORKDIR /work/dir (made as root): %v, owner %d (%v)", mode, uid, err)
	}
	if _, mode, uid, err := stat(t, v, "/work/dir/mine"); err != nil || !mode.IsDir() || uid != 1000 {
		t.Errorf("WORKDIR mine (made as user): %v, owner %d (%v)", mode, uid, err)
	}

	cfg, err := s.ConfigFile(im)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if strings.Join(c.Env, ",") != "PATH=/usr/bin:/bin,A=1,B=two words" || c.WorkingDir != "/work/dir/mine" || c.User != "user" {
		t.Errorf("config: env %q, workdir %q, user %q", c.Env, c.WorkingDir, c.User)
	}
	if c.Labels["x"] != "y" || c.Labels["base"] != "yes" || c.Labels[LabelStartCmd] != "python3 app.py" {
		t.Errorf("labels: %v", c.Labels)
	}
	if strings.Join(c.Cmd, " ") != "/bin/sh -c python3 app.py" {
		t.Errorf("Cmd %q", c.Cmd)
	}
	if len(cfg.RootFS.DiffIDs) != len(im.Layers) || len(cfg.History) != len(spec.Steps) {
		t.Errorf("rootfs %d layers, image %d, history %d of %d steps", len(cfg.RootFS.DiffIDs), len(im.Layers), len(cfg.History), len(spec.Steps))
	}
	list, err := s.List()
	if err != nil || len(list) != 2 {
		t.Errorf("the store lists %v (%v)", list, err)
	}
}

func TestBuildAdd(t *testing.T) {
	s := newStore(t)
	b, _ := newBuilder(t, s)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarOf(t, tentry{name: "pkg/", typ: tar.TypeDir}, tentry{name: "pkg/mod.py", body: "mod", uid: 1000},
		tentry{name: "../../../up", body: "rerooted"}))
	zw.Close()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "pkg.tar.gz"), gz.Bytes(), 0o644)
	os.WriteFile(filepath.Join(dir, "plain.txt"), []byte("plain"), 0o644)
	c, err := OpenContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	spec := specOf(t, "FROM base:1\nADD pkg.tar.gz /srv/\nADD plain.txt /srv/plain.txt\nCOPY pkg.tar.gz /copied/\n")
	im, err := b.Build(context.Background(), "added:1", spec, c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	v := viewOf(t, s, im)
	if body, _, uid, err := stat(t, v, "/srv/pkg/mod.py"); err != nil || body != "mod" || uid != 1000 {
		t.Errorf("ADD of a tar.gz: /srv/pkg/mod.py %q, owner %d (%v)", body, uid, err)
	}
	if body, _, _, err := stat(t, v, "/srv/up"); err != nil || body != "rerooted" {
		t.Errorf("an archive's ../ entry: %q %v (want it under the destination)", body, err)
	}
	if body, _, _, err := stat(t, v, "/srv/plain.txt"); err != nil || body != "plain" {
		t.Errorf("ADD of a plain file: %q %v", body, err)
	}
	if body, _, _, err := stat(t, v, "/copied/pkg.tar.gz"); err != nil || body != gz.String() {
		t.Errorf("COPY of a tar.gz (copied as it is): %v", err)
	}
}

func TestBuildCache(t *testing.T) {
	s := newStore(t)
	b, f := newBuilder(t, s)
	ctx := openContext(t, map[string]string{"a.txt": "a"})
	build := func(dockerfile string) string {
		t.Helper()
		var log bytes.Buffer
		if _, err := b.Build(context.Background(), "cached:1", specOf(t, dockerfile), ctx, &log); err != nil {
			t.Fatalf("%v\n%s", err, log.String())
		}
		return log.String()
	}
	const df = "FROM base:1\nRUN one\nCOPY a.txt /a.txt\nENV K=v\nRUN two\nRUN three\n"
	build(df)
	if got := f.commands(); strings.Join(got, ",") != "one,two,three" {
		t.Fatalf("first build ran %v", got)
	}
	f.runs = nil
	log := build(df)
	if len(f.commands()) != 0 || strings.Count(log, "cached\n") != 5 {
		t.Errorf("a second build ran %v; its log:\n%s", f.commands(), log)
	}
	im, _ := s.Get("cached:1")
	if body, _, _, err := stat(t, viewOf(t, s, im), "/out/three"); err != nil || body != "three" {
		t.Errorf("the cached build's image lacks /out/three: %v", err)
	}
	// A changed step runs again, and those after it; not those before.
	log = build("FROM base:1\nRUN one\nCOPY a.txt /a.txt\nENV K=changed\nRUN two\nRUN three\n")
	if got := f.commands(); strings.Join(got, ",") != "two,three" || strings.Count(log, "cached\n") != 2 {
		t.Errorf("after a changed ENV the build ran %v; its log:\n%s", got, log)
	}
	// New files for a COPY are a changed step.
	f.runs = nil
	os.WriteFile(filepath.Join(ctx.root.Name(), "a.txt"), []byte("new"), 0o644)
	ctx2, err := OpenContext(ctx.root.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer ctx2.Close()
	if _, err := b.Build(context.Background(), "cached:1", specOf(t, df), ctx2, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := f.commands(); strings.Join(got, ",") != "two,three" {
		t.Errorf("after a changed file the build ran %v", got)
	}
	// A forced step runs again, and those after it.
	f.runs = nil
	spec := specOf(t, df)
	spec.Steps[2].Force = true
	if _, err := b.Build(context.Background(), "cached:1", spec, ctx2, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := f.commands(); strings.Join(got, ",") != "two,three" {
		t.Errorf("with ENV forced the build ran %v", got)
	}
	// A cached layer no longer in the store is made again.
	for _, n := range []string{"cached:1"} {
		if err := s.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	f.runs = nil
	build(df)
	if got := f.commands(); strings.Join(got, ",") != "one,two,three" {
		t.Errorf("after its layers were collected the build ran %v", got)
	}
}

func TestBuildRunRequest(t *testing.T) {
	s := newStore(t)
	b, f := newBuilder(t, s)
	spec := specOf(t, "FROM base:1\nARG V=1\nENV E=x\nWORKDIR /w\nUSER user\nRUN true\nRUN rm old/file\nRUN write\n")
	im, err := b.Build(context.Background(), "run:1", spec, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	r := f.runs[0]
	if len(r.Layers) != 2 || strings.Join(r.Env, ",") != "PATH=/usr/bin:/bin,E=x,HOME=/home/user,V=1" || r.Dir != "/w" ||
		r.UID != 1000 || r.GID != 1000 {
		t.Errorf("RunRequest: layers %v env %v dir %q user %d:%d", r.Layers, r.Env, r.Dir, r.UID, r.GID)
	}
	// RUN true changed nothing: no layer; RUN rm whited a file out.
	if len(im.Layers) != 4 {
		t.Errorf("the image has %d layers, want the base's, WORKDIR's, rm's and write's", len(im.Layers))
	}
	v := viewOf(t, s, im)
	if _, _, _, err := stat(t, v, "/old/file"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file a RUN removed is seen: %v", err)
	}
	// The sandbox's user's file is the image's user's.
	if body, _, uid, err := stat(t, v, "/out/write"); err != nil || body != "write" || uid != 1000 {
		t.Errorf("/out/write: %q, owner %d (%v)", body, uid, err)
	}
}

// A RUN's user is resolved through the image's /etc/passwd and
// /etc/group, as Docker resolves it: its primary group and home, or
// group 0 and / for an id the image does not name.
func TestRunAs(t *testing.T) {
	layer := writeTree(t, map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n_apt:x:42:65534::/nonexistent:/usr/sbin/nologin\n" +
			"app:x:1001:1002:App:/srv/app:/bin/sh\nbad:x:7:x::/:/bin/sh\nbig:x:70000:70000::/:/bin/sh\n",
		"etc/group": "root:x:0:\nstaff:x:50:app,_apt\napp:x:1002:app\naudio:x:29:other,app\nhuge:x:70000:app\n",
	})
	v := &rootView{layers: []string{layer}}
	for _, c := range []struct {
		user     string
		uid, gid int
		groups   string // supplementary, as fmt prints them
		home     string
		err      bool
	}{
		{"", 0, 0, "[]", "/root", false},
		{"root", 0, 0, "[]", "/root", false},
		// Its groups but its primary, and none past a sandbox's ids.
		{"app", 1001, 1002, "[50 29]", "/srv/app", false},
		{"1001", 1001, 1002, "[50 29]", "/srv/app", false},
		// A group given: no supplementary ones, as Docker.
		{"app:staff", 1001, 50, "[]", "/srv/app", false},
		{"app:7", 1001, 7, "[]", "/srv/app", false},
		{"_apt", 42, 65534, "[50]", "/nonexistent", false},
		{"4242", 4242, 0, "[]", "/", false},
		{"user", 1000, 1000, "[]", "/home/user", false},
		{"nobody-here", 0, 0, "", "", true},
		{"app:nogroup", 0, 0, "", "", true},
		{"bad", 0, 0, "", "", true},
		{"big", 0, 0, "", "", true},
		{"65535", 65535, 0, "[]", "/", false},
		{"65536", 0, 0, "", "", true},
	} {
		r, err := v.runAs(c.user)
		if ue := (*UserError)(nil); c.user == "nobody-here" && !errors.As(err, &ue) {
			t.Errorf("runAs(%q): %v, want a UserError", c.user, err)
		}
		groups := fmt.Sprint(r.groups)
		if (err != nil) != c.err || !c.err && (r.uid != c.uid || r.gid != c.gid || groups != c.groups || r.home != c.home) {
			t.Errorf("runAs(%q) = %d, %d, %s, %q, %v; want %d, %d, %s, %q, error %v", c.user, r.uid, r.gid, groups, r.home, err,
				c.uid, c.gid, c.groups, c.home, c.err)
		}
	}
}

// A build fails at the step whose layer passes the store's bound of
// layers, or what its builder may add (MaxBytes), and runs no step after
// it; nothing is named.
func TestBuildBounds(t *testing.T) {
	lim := image.DefaultLimits
	lim.Layers = 3
	s := newStoreWith(t, lim)
	b, f := newBuilder(t, s)
	df := "FROM base:1\nRUN write a\nRUN write b\nRUN write c\nRUN write d\n"
	_, err := b.Build(context.Background(), "many:1", specOf(t, df), nil, io.Discard)
	var se *StepError
	if !errors.As(err, &se) || se.Step != 3 || !errors.Is(err, image.ErrRefused) {
		t.Errorf("a fourth layer of a store of three: %v", err)
	}
	if got := f.commands(); strings.Join(got, ",") != "write a,write b,write c" {
		t.Errorf("the build ran %v", got)
	}
	if _, err := s.Get("many:1"); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("the failed build is named: %v", err)
	}

	b, f = newBuilder(t, newStore(t))
	b.MaxBytes = 10 // "write 1234" is 10 bytes: one such layer, not two
	df = "FROM base:1\nRUN write 1234\nRUN write 5678\nRUN write 9\n"
	_, err = b.Build(context.Background(), "big:1", specOf(t, df), nil, io.Discard)
	if !errors.As(err, &se) || se.Step != 2 || !errors.Is(err, image.ErrTooLarge) {
		t.Errorf("past MaxBytes: %v", err)
	}
	if got := f.commands(); strings.Join(got, ",") != "write 1234,write 5678" {
		t.Errorf("the build ran %v", got)
	}
}

func TestBuildFails(t *testing.T) {
	s := newStore(t)
	b, _ := newBuilder(t, s)
	var log bytes.Buffer
	_, err := b.Build(context.Background(), "broken:1", specOf(t, "FROM base:1\nRUN one\nRUN exit 3\nRUN never\n"), nil, &log)
	if !errors.Is(err, ErrStepFailed) || !strings.Contains(err.Error(), "step 2/3 (RUN exit 3): exit status 3") ||
		!strings.Contains(err.Error(), "line 2\nlast words") {
		t.Errorf("a failing RUN: %v", err)
	}
	if !strings.Contains(log.String(), "last words") {
		t.Errorf("the log lacks the step's output:\n%s", log.String())
	}
	if _, err := s.Get("broken:1"); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("a failed build named its image: %v", err)
	}
	_, err = b.Build(context.Background(), "x:1", specOf(t, "FROM absent:1\nRUN one\n"), nil, io.Discard)
	if !errors.Is(err, ErrNoBase) || !strings.Contains(err.Error(), "vivarium image pull absent:1") {
		t.Errorf("an absent base: %v", err)
	}
	_, err = b.Build(context.Background(), "x:1", Spec{FromTemplate: "nope:1"}, nil, io.Discard)
	if !errors.Is(err, ErrNoBase) {
		t.Errorf("an absent base template: %v", err)
	}
	_, err = b.Build(context.Background(), "x:1", specOf(t, "FROM base:1\nCOPY --chown=nobody a /a\n"), openContext(t, map[string]string{"a": "a"}), io.Discard)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "no such name in the image's /etc/passwd") {
		t.Errorf("--chown of an unknown user: %v", err)
	}
	b.Sandboxes = forgetful{}
	_, err = b.Build(context.Background(), "x:1", specOf(t, "FROM base:1\nRUN lost\n"), nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "without committing its changes") {
		t.Errorf("a sandbox that did not commit: %v", err)
	}
	if list, _ := s.List(); len(list) != 1 {
		t.Errorf("after failed builds the store lists %v", list)
	}
}

// forgetful runs a RUN step and does not commit its changes.
type forgetful struct{}

func (forgetful) Run(context.Context, RunRequest) error { return nil }

// TestBuildFromTemplate: a template built on another has its layers and
// configuration, then its own.
func TestBuildFromTemplate(t *testing.T) {
	s := newStore(t)
	b, _ := newBuilder(t, s)
	first, err := b.Build(context.Background(), "first:1", specOf(t, "FROM base:1\nENV A=1\nRUN one\nCMD run-me\n"), nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.Build(context.Background(), "second:1", Spec{FromTemplate: "first:1",
		Steps: []Step{{Type: Run, Args: []string{"two"}}}, ReadyCmd: "test -f /out/two"}, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(second.Layers[:len(first.Layers)], first.Layers) || len(second.Layers) != len(first.Layers)+1 {
		t.Errorf("layers %v on %v", second.Layers, first.Layers)
	}
	cfg, _ := s.ConfigFile(second)
	if !slices.Contains(cfg.Config.Env, "A=1") || cfg.Config.Labels[LabelStartCmd] != "run-me" || cfg.Config.Labels[LabelReadyCmd] != "test -f /out/two" {
		t.Errorf("config %+v", cfg.Config)
	}
}

// TestConcurrentBuilds: two builds of one name at once both finish, and
// the name is one of theirs, whole.
func TestConcurrentBuilds(t *testing.T) {
	s := newStore(t)
	b, _ := newBuilder(t, s)
	var wg sync.WaitGroup
	results := make([]image.Image, 4)
	errs := make([]error, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			df := fmt.Sprintf("FROM base:1\nRUN shared\nENV WHO=%d\nRUN mine-%d\n", i, i)
			results[i], errs[i] = b.Build(context.Background(), "same:1", specOf(t, df), nil, io.Discard)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("build %d: %v", i, err)
		}
	}
	got, err := s.Get("same:1")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(results, func(im image.Image) bool { return im.Config == got.Config })
	if i < 0 {
		t.Fatalf("the name's image %s is none of the builds'", got.Config)
	}
	cfg, err := s.ConfigFile(got)
	if err != nil || !slices.Contains(cfg.Config.Env, fmt.Sprintf("WHO=%d", i)) {
		t.Errorf("its configuration: %v %v", cfg, err)
	}
	v := viewOf(t, s, got)
	want := fmt.Sprintf("mine-%d", i)
	if body, _, _, err := stat(t, v, "/out/"+want); err != nil || body != want {
		t.Errorf("its files: %q %v", body, err)
	}
}

// TestBuildWorkdirExisting: a WORKDIR the image has (through a link
// too) adds no layer.
func TestBuildWorkdirExisting(t *testing.T) {
	s := newStore(t)
	b, _ := newBuilder(t, s)
	im, err := b.Build(context.Background(), "wd:1", specOf(t, "FROM base:1\nWORKDIR /home/user\nWORKDIR /bin\n"), nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Layers) != 1 {
		t.Errorf("the image has %d layers, want the base's alone", len(im.Layers))
	}
}

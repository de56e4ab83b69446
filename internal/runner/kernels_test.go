package runner

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

func TestCanonicalLanguage(t *testing.T) {
	for in, want := range map[string]string{
		"": "python", "Python3": "python", "sh": "bash", "js": "javascript", " JavaScript ": "javascript",
		"ts": "typescript", "R": "r", "java": "java", "node": "javascript",
	} {
		if got, err := CanonicalLanguage(in); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"cobol", "deno", "python 3", "javascript\x00"} {
		if _, err := CanonicalLanguage(in); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Errorf("%q: %v, want ErrInvalidSpec", in, err)
		}
	}
}

func TestDefaultContextsOfLanguages(t *testing.T) {
	c := NewContexts("/workspace")
	ids := func() (out []string) {
		for _, cc := range c.List() {
			out = append(out, cc.ID)
		}
		return out
	}
	if got := strings.Join(ids(), ","); got != "python,bash,javascript" {
		t.Fatalf("contexts at first: %s", got)
	}
	// A language's default context is made on first use, by any of its
	// names, once.
	for _, id := range []string{"r", "ts", "typescript", "r"} {
		cc, err := c.Lookup(id)
		if err != nil || cc.Cwd != "/workspace" {
			t.Fatalf("lookup %q: %+v %v", id, cc, err)
		}
	}
	if got := strings.Join(ids(), ","); got != "python,bash,javascript,r,typescript" {
		t.Fatalf("contexts after use: %s", got)
	}
	if _, err := c.Lookup("cobol"); !errors.Is(err, sandbox.ErrNoContext) {
		t.Fatalf("lookup cobol: %v", err)
	}
	// Removed, it comes back fresh when used again; python and bash stay.
	if err := c.Remove("r"); err != nil {
		t.Fatal(err)
	}
	if req, ok := c.Message(); !ok || strings.Contains(strings.Join(req.Live, ","), "r,") {
		t.Fatalf("message after removal: %+v", req)
	}
	if _, err := c.Lookup("r"); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove("bash"); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Fatalf("remove bash: %v", err)
	}
	cc, err := c.Create("JS", "/tmp/../tmp")
	if err != nil || cc.Language != "javascript" || cc.Cwd != "/tmp" {
		t.Fatalf("create: %+v %v", cc, err)
	}
}

// runKernels runs Python code with kernels.py importable, in dir.
func runKernels(t *testing.T, code string) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3")
	}
	dir := t.TempDir()
	for name, b := range Files() {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(py, "-c", "import sys; sys.path.insert(0, sys.argv[1])\n"+code, dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	return string(out)
}

// A kernel is as hostile as the code it runs: what it sends is checked,
// and one that breaks the protocol is killed and its state reported lost.
func TestKernelProtocolIsCheckedNotTrusted(t *testing.T) {
	out := runKernels(t, `
import kernels
def fake(program):
    kernels.kernel_command = lambda lang: [sys.executable, "-c", "import os, sys\n" + program]
results = []
def run(program, code="x"):
    fake(program)
    k = kernels.KernelContext("javascript", None, lambda data, main: results.append((data, main)))
    try:
        status, err = k.run(code, {})
        print(status, err and err["name"], err and err["value"][:60])
    finally:
        k.close()
fds = "r, w, a = map(int, os.environ['VIVARIUM_KERNEL_FDS'].split(','))\n"
# A line over the cap: killed.
run(fds + "os.write(w, b'x' * (25 << 20))\nos.read(r, 1)")
# Not JSON: killed.
run(fds + "os.read(r, 1 << 20); os.write(w, b'{not json\\n')\nos.read(r, 1)")
# Not an object: killed.
run(fds + "os.read(r, 1 << 20); os.write(w, b'[1]\\n')\nos.read(r, 1)")
# A result whose data is not an object is dropped; the cell goes on.
run(fds + "os.read(r, 1 << 20); os.write(w, b'{\"type\":\"result\",\"data\":[1]}\\n'); os.read(a, 4)\n"
    + "os.write(w, b'{\"type\":\"done\",\"code\":\"zero\"}\\n'); os.read(r, 1)")
# Files it names: a regular one is read and removed; a link, a FIFO (which
# must not block the runner), a text type and a missing file are left out.
import os, tempfile
d = tempfile.mkdtemp()
open(d + "/p.png", "wb").write(b"PNG")
os.symlink(d + "/p.png", d + "/link.png")
os.mkfifo(d + "/fifo.png")
files = [{"image/png": d + "/p.png", "text/html": d + "/p.png"}, {"image/png": d + "/link.png"},
         {"image/png": d + "/fifo.png"}, {"image/png": d + "/missing.png"}, "nope"]
prog = fds + "import json\nos.read(r, 1 << 20)\nfor f in %r:\n" % (files,) + \
    "    os.write(w, (json.dumps({'type': 'result', 'data': {'text/plain': 'f'}, 'files': f}) + '\\n').encode()); os.read(a, 4)\n" + \
    "os.write(w, b'{\"type\":\"done\",\"code\":0}\\n'); os.read(r, 1)"
run(prog)
print("files", [sorted(d) for d, _ in results], os.path.exists(d + "/p.png"), os.path.lexists(d + "/link.png"))
del results[:]
# Exits mid-cell: its state is gone, and said so.
run("sys.exit(7)")
# No runtime for the language.
kernels.kernel_command = lambda lang: (_ for _ in ()).throw(kernels.KernelUnavailable("r needs R"))
k = kernels.KernelContext("r", None, None)
print(k.run("1", {}))
print("results", results)
`)
	want := []string{
		// 137: the kernel was killed.
		"137 KernelDied the javascript kernel broke its protocol (an event line over",
		"137 KernelDied the javascript kernel broke its protocol (Expecting property",
		"137 KernelDied the javascript kernel broke its protocol (an event that is n",
		"1 None None",
		"0 None None",
		"files [['image/png', 'text/plain'], ['text/plain'], ['text/plain'], ['text/plain'], ['text/plain']] False True",
		"7 KernelDied the javascript kernel exited",
		"(1, {'type': 'error', 'name': 'KernelUnavailable', 'value': 'r needs R', 'traceback': ''})",
		"results []",
	}
	if got := strings.TrimSpace(out); got != strings.Join(want, "\n") {
		t.Fatalf("got:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

// The TypeScript cells' type stripping, through Node: each case's output
// must run and give the value.
func TestStripTypes(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs node")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kernel_node.js"), Files()["kernel_node.js"], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ ts, want string }{
		{"function subtract(x: number, y: number): number {\n  return x - y;\n}\nsubtract(1, 2)", "-1"},
		{"const a: number[] = [1, 2]; let b: Map<string, Array<number>> = new Map(); a.length + b.size", "2"},
		{"interface P { x: number; y?: string }\ntype U = 'a' | 'b';\nconst p: P = { x: 1 } as P;\nconst q = p ? p.x : 0;\nq", "1"},
		{"const f = (s: string, n?: number): string => s.repeat(n ?? 1);\nf('ab', 2)", "abab"},
		{"class C<T> implements Foo {\n  private readonly v: T;\n  count: number = 0;\n  constructor(v: T) { this.v = v }\n  get(): T { return this.v! }\n}\nnew C<number>(3).get()", "3"},
		{"function id<T>(x: T): T { return x }\nconst o = { a: 1, b: (x: number) => x > 1 ? 'y' : 'n' };\nlet r = [1, 2].map((x: number): number => x * 2) as const;\ntype Fn = (a: number) => void\ndeclare const g: any;\nid(r).join() + o.b(2)", "2,4y"},
		{"const s: string = `a ${1 + 1}: b` // x: number\nconst re = /a:b/g; s + re.source", "a 2: ba:b"},
	} {
		script := `const { stripTypes } = require('./kernel_node.js');
const js = stripTypes(process.argv[1]);
try { console.log(String(require('vm').runInNewContext(js))) } catch (e) { console.log('ERROR ' + e.message + '\n' + js) }`
		cmd := exec.Command(node, "-e", script, tc.ts)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != tc.want {
			t.Errorf("%s\n=> %s (%v), want %s", tc.ts, out, err, tc.want)
		}
	}
}

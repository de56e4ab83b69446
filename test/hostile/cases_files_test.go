//go:build linux

package hostile

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// What the code leaves in its workspace for --out: only regular files
// come out, within the disk limit, and only into the out directory.
var outDirCases = []hostileCase{
	{
		name: "symlinks_in_out",
		code: `
import os
open("ok.txt", "w").write("ok")
os.symlink("/etc/passwd", "passwd")
os.symlink(os.environ["SECRET_PATH"], "secret")
os.symlink(os.environ["HOST_TARGET"], "host_target")
os.symlink("/", "rootdir")
os.symlink("../../../../../../../../etc", "etc")
os.makedirs("sub")
os.symlink("/usr/bin", "sub/bin")
os.symlink("../ok.txt", "sub/relative")
print("planted")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			j.OutDir = filepath.Join(t.TempDir(), "out")
			j.vars["SECRET_PATH"] = h.canaries.SecretPath
			// A host path the out directory's links could reach, were
			// they followed or recreated.
			target := filepath.Join(t.TempDir(), "target")
			if err := os.WriteFile(target, []byte("host"), 0o600); err != nil {
				t.Fatal(err)
			}
			j.vars["HOST_TARGET"] = target
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("planted"))
			wantOutTree(t, o, map[string]testutil.Entry{"ok.txt": {Type: "file", Size: 2}})
			if b, _ := os.ReadFile(o.vars["HOST_TARGET"]); string(b) != "host" {
				t.Fatalf("host target now %q", b)
			}
			if len(o.Files) != 1 || o.Files[0].Path != "ok.txt" {
				t.Fatalf("listed files %+v, want only ok.txt", o.Files)
			}
		},
	},
	{
		name: "fifo_socket_in_out",
		code: `
import os, socket
open("ok.txt", "w").write("ok")
os.mkfifo("pipe")
os.makedirs("sub")
os.mkfifo("sub/data.csv")
s = socket.socket(socket.AF_UNIX)
s.bind("sock")
print("planted")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			j.OutDir = filepath.Join(t.TempDir(), "out")
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// Copying out never blocks on a FIFO nobody writes.
			wantOK(t, o, lines("planted"))
			wantPrompt(t, o)
			wantOutTree(t, o, map[string]testutil.Entry{"ok.txt": {Type: "file", Size: 2}})
		},
	},
	{
		name: "links_planted_in_out_dir",
		code: `
import os
open("report.txt", "w").write("evil")
os.makedirs("sub")
open("sub/x.txt", "w").write("evil")
print("written")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			// The out directory already holds links into the host, as an
			// earlier run or another user could have left them.
			hostDir := t.TempDir()
			target := filepath.Join(hostDir, "target")
			if err := os.WriteFile(target, []byte("host"), 0o600); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "out")
			if err := os.Mkdir(out, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, to := range map[string]string{"report.txt": target, "sub": hostDir} {
				if err := os.Symlink(to, filepath.Join(out, name)); err != nil {
					t.Fatal(err)
				}
			}
			j.OutDir = out
			j.vars["HOST_DIR"] = hostDir
		},
		copyOutWarns: true, // sub/x.txt: the planted link is refused
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("written"))
			tree, err := testutil.Tree(o.vars["HOST_DIR"])
			if err != nil {
				t.Fatal(err)
			}
			if len(tree) != 1 || tree["target"] != (testutil.Entry{Type: "file", Size: 4}) {
				t.Fatalf("host directory behind the planted links changed: %v", tree)
			}
			if b, _ := os.ReadFile(filepath.Join(o.vars["HOST_DIR"], "target")); string(b) != "host" {
				t.Fatalf("host target now %q", b)
			}
			// The link named report.txt is replaced, not written through.
			if fi, err := os.Lstat(filepath.Join(o.outDir, "report.txt")); err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("report.txt in out: %v, %v", fi, err)
			}
			if o.warn == nil {
				t.Fatalf("copying sub/x.txt through a planted link reported nothing")
			}
		},
	},
	{
		name: "hard_link_amplification",
		code: `
import os
with open("big", "wb") as f:
    f.write(b"x" * (4 << 20))
for i in range(40):
    os.link("big", "link%d" % i)
print("linked")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			j.OutDir = filepath.Join(t.TempDir(), "out")
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// 164 MiB of names for 4 MiB of disk: the copy stops at the
			// disk limit.
			wantOK(t, o, lines("linked"))
			wantOutWithin(t, o)
		},
	},
	{
		name: "sparse_file_amplification",
		code: `
for i in range(40):
    with open("sparse%d" % i, "wb") as f:
        f.truncate(15 << 20)
print("made")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			j.OutDir = filepath.Join(t.TempDir(), "out")
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("made"))
			wantOutWithin(t, o)
		},
	},
	{
		name: "odd_names_in_out",
		code: `
import os
names = ["..hidden", "a\nb", "-rf", " spaced ", "back\\slash", "x" * 255, "ünïcödé",
         os.fsdecode(b"\xff\xfe"), "...", "d/" * 40 + "deep.txt"]
for n in names:
    if "/" in n:
        os.makedirs(os.path.dirname(n))
    with open(n, "w") as f:
        f.write("x")
print(len(names))
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			j.OutDir = filepath.Join(t.TempDir(), "out")
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("10"))
			// Everything lands inside out, and nothing beside it.
			beside, _ := os.ReadDir(filepath.Dir(o.outDir))
			if len(beside) != 1 || beside[0].Name() != "out" {
				t.Fatalf("the out directory's parent holds %v", beside)
			}
			tree, err := testutil.Tree(o.outDir)
			if err != nil {
				t.Fatal(err)
			}
			var files []string
			for p, e := range tree {
				if e.Type == "file" {
					files = append(files, p)
				}
				if e.Type != "file" && e.Type != "dir" {
					t.Errorf("%s in out is a %s", p, e.Type)
				}
			}
			if len(files) != 10 {
				sort.Strings(files)
				t.Fatalf("%d files copied out, want 10: %q", len(files), files)
			}
		},
	},
	{
		name: "deep_and_unreadable_tree_in_out",
		code: `
import os
for i in range(1500):
    os.mkdir("d")
    os.chdir("d")
open("deep.txt", "w").write("x")
os.chdir("/workspace")
os.makedirs("locked/inner")
open("locked/inner/f.txt", "w").write("x")
open("noperm.txt", "w").write("x")
os.chmod("noperm.txt", 0)
os.chmod("locked/inner", 0)
os.chmod("locked", 0)
open("ok.txt", "w").write("ok")
print("made")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			j.OutDir = filepath.Join(t.TempDir(), "out")
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// Modes the sandbox set do not stop the copy, and a path too
			// deep to name is left behind, not followed into an error.
			wantOK(t, o, lines("made"))
			tree, err := testutil.Tree(o.outDir)
			if err != nil {
				t.Fatal(err)
			}
			for p, e := range tree {
				if e.Type != "file" && e.Type != "dir" {
					t.Errorf("%s in out is a %s", p, e.Type)
				}
			}
			if tree["ok.txt"] != (testutil.Entry{Type: "file", Size: 2}) {
				t.Fatalf("out holds %v, want ok.txt among them", tree)
			}
		},
	},
}

// Nothing a run plants survives into a later run, or reaches a sandbox
// running beside it.
var persistenceCases = []hostileCase{
	{
		name: "persistence_into_a_later_run",
		code: `
import ctypes, os, subprocess, sys
m = os.environ["MARKER"]
for p in ("/workspace/" + m, "/tmp/" + m, "/dev/shm/" + m, "/workspace/.bashrc", "/workspace/.profile",
          "/workspace/sitecustomize.py", "/tmp/sitecustomize.py", "/workspace/json.py"):
    with open(p, "w") as f:
        f.write("print('pwned')\n")
site = "/workspace/.local/lib/python%d.%d/site-packages" % sys.version_info[:2]
os.makedirs(site)
with open(site + "/usercustomize.py", "w") as f:
    f.write("print('pwned')\n")
libc = ctypes.CDLL(None, use_errno=True)
print("shm", libc.shmget(int(os.environ["KEY"]), 4096, 0o1000 | 0o666) >= 0)
subprocess.Popen(["sh", "-c", "sleep 3; echo pwned > /tmp/late-" + m], start_new_session=True)
print("planted")
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			j.vars["MARKER"] = marker()
			j.vars["KEY"] = fmt.Sprint(randomKey())
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("shm True", "planted"))
			// A later run, given the same names to look for, after the
			// late writer would have written.
			later := &job{
				OneShot: sandbox.OneShot{
					Spec: sandbox.Spec{Limits: baseLimits},
					Request: sandbox.ExecRequest{Code: `
import ctypes, json, os, time
time.sleep(3.5)
m = os.environ["MARKER"]
print("workspace", os.listdir("/workspace"), "tmp", os.listdir("/tmp"), "shm", os.listdir("/dev/shm"))
libc = ctypes.CDLL(None, use_errno=True)
print("segment", libc.shmget(int(os.environ["KEY"]), 0, 0) >= 0)
print("json is the stdlib's", json.__file__.startswith("/usr/lib/"))
print("processes", [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())])
`},
				},
				vars: o.vars,
			}
			o2 := h.run(t, later)
			wantStarted(t, o2)
			wantOK(t, o2, lines("workspace [] tmp [] shm []", "segment False", "json is the stdlib's True", "processes []"))
		},
	},
	{
		// With a zygote, every sandbox starts from the same preloaded
		// interpreter: what one run changes in it must not reach the next.
		name: "poison_preloaded_modules",
		code: `
import sys, builtins
try:
    import pandas as pd
    pd.DataFrame.sum = lambda self, *a, **k: "poisoned"
    pd.read_csv = lambda *a, **k: "poisoned"
except ImportError:
    pass
import json, os
json.dumps = lambda *a, **k: "poisoned"
os.getcwd = lambda: "poisoned"
sys.modules["poison"] = sys
builtins.poisoned = True
sys.path.insert(0, "/tmp/poison")
open("/tmp/poison.py", "w").write("print('pwned')")
print("poisoned")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("poisoned"))
			later := &job{OneShot: sandbox.OneShot{
				Spec: sandbox.Spec{Limits: baseLimits},
				Request: sandbox.ExecRequest{Code: `
import sys, builtins, json, os
try:
    import pandas as pd
    s = str(pd.DataFrame({"a": [1, 2]}).sum()["a"])
except ImportError:
    s = "3"
print(s, json.dumps(1), os.getcwd(), "poison" in sys.modules, hasattr(builtins, "poisoned"),
      "/tmp/poison" in sys.path, os.path.exists("/tmp/poison.py"))
`}}, vars: o.vars}
			o2 := h.run(t, later)
			wantStarted(t, o2)
			wantOK(t, o2, lines("3 1 /workspace False False False False"))
		},
	},
	{
		name: "neighbour_sandbox",
		code: withProbes(`
import socket
m = os.environ["MARKER"]
attempt("tmp marker", os.stat, "/tmp/" + m)
attempt("workspace marker", os.stat, "/workspace/" + m)
attempt("shm marker", os.stat, "/dev/shm/" + m)
attempt("abstract socket", socket.socket(socket.AF_UNIX).connect, "\0" + m)
s = socket.socket()
s.settimeout(3)
attempt("tcp port", s.connect, ("127.0.0.1", int(os.environ["PORT"])))
print("segment", _libc.shmget(int(os.environ["KEY"]), 0, 0) >= 0)
print("processes", [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())])
`),
		prepare: func(t *testing.T, h *harness, j *job) {
			// A persistent sandbox, alive during this case's run, holding
			// files, sockets, a shared memory segment and a process.
			sb, err := h.be.B.Create(context.Background(), sandbox.Spec{Limits: baseLimits})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sb.Close() })
			m, key, port := marker(), randomKey(), freePort(t)
			res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: fmt.Sprintf(`
import ctypes, os, socket, subprocess
m = %q
for p in ("/tmp/", "/workspace/", "/dev/shm/"):
    open(p + m, "w").write("x")
abstract = socket.socket(socket.AF_UNIX)
abstract.bind("\0" + m)
abstract.listen()
tcp = socket.socket()
tcp.bind(("127.0.0.1", %d))
tcp.listen()
libc = ctypes.CDLL(None)
segment = libc.shmget(%d, 4096, 0o1000 | 0o666)
sleeper = subprocess.Popen(["sleep", "1000"])
print("planted", segment >= 0)
`, m, port, key)}, nil)
			if err != nil || res.Status != sandbox.StatusOK || res.Stdout != "planted True\n" {
				t.Fatalf("the neighbour did not plant its traps: %v %+v", err, res)
			}
			j.vars["MARKER"], j.vars["KEY"], j.vars["PORT"] = m, fmt.Sprint(key), fmt.Sprint(port)
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("tmp marker ENOENT", "workspace marker ENOENT", "shm marker ENOENT",
				"abstract socket ECONNREFUSED", "tcp port ECONNREFUSED", "segment False", "processes []"))
		},
	},
}

// wantOutTree: the out directory holds exactly want.
func wantOutTree(t *testing.T, o *outcome, want map[string]testutil.Entry) {
	t.Helper()
	got, err := testutil.Tree(o.outDir)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("out directory holds %v, want %v", got, want)
	}
}

// wantOutWithin: what came out is no more than the disk limit.
func wantOutWithin(t *testing.T, o *outcome) {
	t.Helper()
	tree, err := testutil.Tree(o.outDir)
	if err != nil {
		t.Fatal(err)
	}
	if n := testutil.TreeSize(tree); n > o.limits.Disk || n == 0 {
		t.Fatalf("%d bytes copied out, want some and at most the %d disk limit", n, o.limits.Disk)
	}
}

// freePort returns a TCP port free on the host's loopback now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

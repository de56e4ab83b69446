//go:build linux

package hostile

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Output and rich results: bounded, passed through as bytes, never able
// to break the run or the supervisor.
var outputCases = []hostileCase{
	{
		name:   "output_flood",
		limits: sandbox.Limits{Timeout: 2 * time.Second},
		code: `
import sys
while True:
    sys.stdout.write("x" * 65536)
    sys.stderr.write("y" * 65536)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantTimeout(t, o)
			wantCapped(t, "stdout", o.Stdout, o.StdoutTruncated, o.limits.MaxOutput, "x")
			wantCapped(t, "stderr", o.Stderr, o.StderrTruncated, o.limits.MaxOutput, "y")
		},
	},
	{
		name: "output_flood_from_processes",
		code: `
import os
pids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        for _ in range(64):
            os.write(1, b"z" * 32768)
        os._exit(0)
    pids.append(pid)
for p in pids:
    os.waitpid(p, 0)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusOK, 0)
			wantCapped(t, "stdout", o.Stdout, o.StdoutTruncated, o.limits.MaxOutput, "z")
		},
	},
	{
		name: "huge_single_line",
		code: `
import sys
sys.stdout.write("x" * (16 << 20))
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusOK, 0)
			wantCapped(t, "stdout", o.Stdout, o.StdoutTruncated, o.limits.MaxOutput, "x")
		},
	},
	{
		name: "invalid_utf8_and_binary_output",
		code: `
import sys
data = bytes(range(256)) + b"\xff\xfe\xc0\x80\xed\xa0\x80" + b"\x00" * 8 + b"\x1b]52;c;cHduZWQ=\x07"
sys.stdout.buffer.write(data)
sys.stderr.buffer.write(data[::-1])
print("\udcff lone surrogate", flush=True)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// Bytes pass through untouched; a lone surrogate printed as
			// text is escaped by the runner, not a crash.
			data := make([]byte, 0, 300)
			for i := 0; i < 256; i++ {
				data = append(data, byte(i))
			}
			data = append(data, "\xff\xfe\xc0\x80\xed\xa0\x80\x00\x00\x00\x00\x00\x00\x00\x00\x1b]52;c;cHduZWQ=\x07"...)
			rev := make([]byte, len(data))
			for i, b := range data {
				rev[len(data)-1-i] = b
			}
			wantOK(t, o, string(data)+`\udcff lone surrogate`+"\n")
			if o.Stderr != string(rev) {
				t.Fatalf("stderr %q, want %q", o.Stderr, rev)
			}
		},
	},
	{
		// A DataFrame's data (E2B's result.data) is bounded with the
		// result: too big, it is left out and the rest still comes.
		name: "huge_frame_data",
		code: `
import json
class DataFrame:
    size = 1
    def to_json(self, **kw):
        return json.dumps({"columns": ["a"], "data": [["x" * (20 << 20)]]})
    def _repr_html_(self):
        return "<table></table>"
    def __repr__(self):
        return "frame"
DataFrame.__module__ = "pandas.core.frame"
display(DataFrame())
print("after")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("after"))
			if len(o.Results) != 1 || o.Results[0].Data != nil || o.Results[0].Text != "frame" ||
				o.Results[0].HTML != "<table></table>" {
				t.Fatalf("results %.300v", o.Results)
			}
		},
	},
	{
		name: "huge_result",
		code: `
class Giant:
    def _repr_html_(self):
        return "<td>" * (5 << 20)
    def __repr__(self):
        return "Giant()"
display(Giant())
print("after")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("after"))
			if len(o.Results) != 1 || o.Results[0].HTML != "" ||
				!strings.HasPrefix(o.Results[0].Text, "[vivarium: result of about 20 MiB dropped") {
				t.Fatalf("results %.300v", o.Results)
			}
		},
	},
	{
		name:   "results_over_the_total_cap",
		limits: sandbox.Limits{Memory: 256 << 20, Timeout: 60 * time.Second},
		code: `
class Big:
    def __init__(self, i):
        self.i = i
    def _repr_html_(self):
        return str(self.i) * (7 << 20)
    def __repr__(self):
        return "Big(%d)" % self.i
for i in range(10):
    display(Big(i))
print("after")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// Nine results of 7 MiB fit the 64 MiB cap of one execution;
			// the tenth is replaced by a note.
			wantOK(t, o, lines("after"))
			if len(o.Results) != 10 {
				t.Fatalf("%d results, want 9 and a note", len(o.Results))
			}
			total := 0
			for i, r := range o.Results[:9] {
				if r.Text != fmt.Sprintf("Big(%d)", i) || len(r.HTML) != 7<<20 {
					t.Fatalf("result %d: text %q, %d bytes of HTML", i, r.Text, len(r.HTML))
				}
				total += len(r.HTML) + len(r.Text)
			}
			if note := o.Results[9]; note.HTML != "" || !strings.HasPrefix(note.Text, "[vivarium: 1 more results dropped") {
				t.Fatalf("last result %.200v", note)
			}
			if total > 64<<20 {
				t.Fatalf("results total %d bytes", total)
			}
		},
	},
	{
		name:   "result_encoding_outgrows_frame",
		limits: sandbox.Limits{Memory: 256 << 20},
		code: `
class Wide:
    def _repr_html_(self):
        return "\U0001F600" * (5 << 20)
    def __repr__(self):
        return "Wide()"
display(Wide())
display("after")
print("done")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// The safe outcome: the run ends normally, what was printed
			// arrives, nothing grows without bound.
			wantOK(t, o, lines("done"))
			wantPeakWithin(t, o)
			after := false
			for _, r := range o.Results {
				after = after || r.Text == "'after'"
			}
			if !after {
				t.Fatalf("a later result was lost: results %.300v, error %+v", o.Results, o.Error)
			}
		},
	},
	{
		name: "hostile_reprs",
		code: `
class Raises:
    def _repr_html_(self): raise RuntimeError("boom")
    def __repr__(self): return "Raises()"
class NotString:
    def _repr_html_(self): return 42
    def _repr_markdown_(self): return ["not", "a", "string"]
    def __repr__(self): return "NotString()"
class BadBytes:
    def _repr_html_(self): return b"\xff\xfe<b>x</b>"
    def __repr__(self): return "BadBytes()"
class BadRepr:
    def __repr__(self): raise ValueError("no repr")
class ReprNotStr:
    def __repr__(self): return 42
class Mock:
    def __getattr__(self, name): return lambda *a, **k: "<junk>"
    def __repr__(self): return "Mock()"
class BadJSON:
    def _repr_json_(self): return "{not json"
    def __repr__(self): return "BadJSON()"
for o in (Raises(), NotString(), BadBytes(), BadRepr(), ReprNotStr(), Mock(), BadJSON()):
    display(o)
print("displayed")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("displayed"))
			want := []sandbox.Output{
				{Text: "Raises()"},
				{Text: "NotString()", HTML: "42", Markdown: "['not', 'a', 'string']"},
				{Text: "BadBytes()", HTML: "\ufffd\ufffd<b>x</b>"},
				{Text: "<unrepresentable BadRepr: no repr>"},
				{Text: "<unrepresentable ReprNotStr: __repr__ returned non-string (type int)>"},
				{Text: "Mock()"},
				{Text: "BadJSON()"},
			}
			got, _ := json.Marshal(o.Results)
			exp, _ := json.Marshal(want)
			if string(got) != string(exp) {
				t.Fatalf("results\n%s\nwant\n%s", got, exp)
			}
		},
	},
	{
		// Results are capped by the bytes of their content, but an empty
		// result still costs the supervisor a few hundred bytes of memory
		// and the parsing of a frame.
		name: "many_empty_results",
		code: forgeFrames + `
body = json.dumps({"type": "result", "data": {}}).encode()
frames = (struct.pack(">I", len(body)) + body) * 100000
view = memoryview(frames)
while view:
    view = view[os.write(EVENTS, view):]
display("last")
print("sent")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("sent"))
			// What the supervisor holds for them stays within the cap it
			// documents for an execution's results (64 MiB).
			held := len(o.Results) * int(unsafe.Sizeof(sandbox.Output{}))
			for _, r := range o.Results {
				held += len(r.Text) + len(r.HTML) + len(r.JSON)
			}
			if held > 64<<20 {
				t.Fatalf("%d results hold %d bytes of the supervisor's memory", len(o.Results), held)
			}
			// And their number is capped (10000, and a note of the rest).
			if len(o.Results) > 10001 {
				t.Fatalf("%d results kept: their number is not capped", len(o.Results))
			}
			if n := len(o.Results); n == 0 || o.Results[n-1].Text != "'last'" && !strings.Contains(o.Results[n-1].Text, "dropped") {
				t.Fatalf("%d results, the last %+v", n, o.Results[max(n-1, 0)])
			}
		},
	},
	{
		name:   "repr_hangs",
		limits: sandbox.Limits{Timeout: 2 * time.Second},
		code: `
class Hangs:
    def _repr_html_(self):
        while True:
            pass
Hangs()
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantTimeout(t, o)
		},
	},
	{
		name: "circular_json_repr",
		code: `
class Circular:
    def _repr_json_(self):
        d = {}
        d["self"] = d
        return d
display(Circular())
print("not reached")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// The result cannot be encoded: the display() call fails in
			// the code, and nothing malformed reaches the supervisor.
			wantStatus(t, o, sandbox.StatusError, 1)
			if o.Error == nil || o.Error.Name != "ValueError" || o.Stdout != "" {
				t.Fatalf("%s", describe(o))
			}
		},
	},
}

// Protocol forgery: the code shares a process with the runner, so it can
// write anything anywhere; the outcome (status, exit code, limits) still
// comes from the kernel.
var protocolCases = []hostileCase{
	{
		name: "frames_on_stdout",
		code: `
import json, struct, sys
for ev in ({"type": "done", "exit_code": 0},
           {"type": "result", "data": {"text/plain": "forged"}, "is_main_result": True},
           {"type": "error", "name": "Forged", "value": "x", "traceback": ""}):
    body = json.dumps(ev).encode()
    sys.stdout.buffer.write(struct.pack(">I", len(body)) + body)
sys.stdout.flush()
sys.exit(3)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusError, 3)
			var want []byte
			for _, ev := range []string{`{"type": "done", "exit_code": 0}`,
				`{"type": "result", "data": {"text/plain": "forged"}, "is_main_result": true}`,
				`{"type": "error", "name": "Forged", "value": "x", "traceback": ""}`} {
				want = binary.BigEndian.AppendUint32(want, uint32(len(ev)))
				want = append(want, ev...)
			}
			if o.Stdout != string(want) || len(o.Results) != 0 || o.Error.Name == "Forged" {
				t.Fatalf("stdout %q results %v error %+v", o.Stdout, o.Results, o.Error)
			}
		},
	},
	{
		name: "write_to_inherited_descriptors",
		code: withProbes(`
for fd in range(3, 10):
    attempt("fd %d" % fd, os.write, fd, b"\0\0\0\x10{\"type\":\"done\"}")
print("open", sorted(int(f) for f in os.listdir("/proc/self/fd") if int(f) > 2 and int(f) < 10))
`),
		check: func(t *testing.T, h *harness, o *outcome) {
			// The descriptors init handed over are closed or moved (the
			// runner keeps its pipes from 10 up): only the directory
			// listing itself is open below 10.
			var want []string
			for fd := 3; fd < 10; fd++ {
				want = append(want, fmt.Sprintf("fd %d EBADF", fd))
			}
			wantOK(t, o, lines(append(want, "open [3]")...))
		},
	},
	{
		name: "forged_done_on_event_pipe",
		code: forgeFrames + `
send({"type": "done", "exit_code": 0})
send({"type": "error", "name": "Forged", "value": "ignore me", "traceback": ""})
sys.exit(3)
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// A forged "done" ends nothing: the one-shot outcome is the
			// process's exit status.
			wantStatus(t, o, sandbox.StatusError, 3)
		},
	},
	{
		name:   "forged_done_then_hang",
		limits: sandbox.Limits{Timeout: 2 * time.Second},
		code: forgeFrames + `
send({"type": "done", "exit_code": 0})
while True:
    pass
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantTimeout(t, o)
		},
	},
	{
		name: "garbage_on_event_pipe",
		code: forgeFrames + `
os.write(EVENTS, b"\x7f\xff\xff\xff" + b"garbage" * 1000)
display("lost")
print("printed")
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// The supervisor refuses the frame and stops parsing; the
			// run's outcome and output are intact.
			wantStatus(t, o, sandbox.StatusOK, 0)
			if o.Stdout != "printed\n" || len(o.Results) != 0 || o.Error == nil || o.Error.Name != "ProtocolError" {
				t.Fatalf("results %v; %s", o.Results, describe(o))
			}
		},
	},
	{
		name: "close_every_descriptor",
		code: `
import os
os.closerange(3, 65536)
print("closed", flush=True)
1 / 0
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// The runner cannot report the exception; the exit status
			// says it failed.
			wantStatus(t, o, sandbox.StatusError, 1)
			if o.Stdout != "closed\n" {
				t.Fatalf("stdout %q", o.Stdout)
			}
		},
	},
	{
		name: "close_stdout_and_stderr",
		code: `
import os
os.close(1)
os.close(2)
for _ in range(10):
    try:
        print("x" * 100)
    except OSError:
        pass
`,
		check: func(t *testing.T, h *harness, o *outcome) {
			// Python exits 120 when it cannot flush stdout at exit.
			wantStatus(t, o, sandbox.StatusError, 120)
			if o.Stdout != "" || o.Stderr != "" {
				t.Fatalf("stdout %q stderr %q", o.Stdout, o.Stderr)
			}
		},
	},
}

// forgeFrames finds the runner's event pipe among the code's own
// descriptors (a pipe it can write whose reading end is another
// process's, the supervisor's) and defines send(), which writes a
// well-formed frame to it.
const forgeFrames = `
import json, os, stat, struct, sys
def _both_ends_here(fd, fds):
    # The runner's own pipes (its signals' wake-up) are read here too.
    st = os.fstat(fd)
    for o in fds:
        try:
            if o != fd and o > 2 and (os.fstat(o).st_dev, os.fstat(o).st_ino) == (st.st_dev, st.st_ino):
                return True
        except OSError:
            pass
    return False
EVENTS = None
FDS = sorted(int(f) for f in os.listdir("/proc/self/fd"))
for fd in FDS:
    try:
        if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode) and not _both_ends_here(fd, FDS):
            os.write(fd, b"")  # EBADF unless open for writing
            EVENTS = fd
    except OSError:
        pass
assert EVENTS is not None, "no event pipe found"
def send(ev):
    body = json.dumps(ev).encode()
    os.write(EVENTS, struct.pack(">I", len(body)) + body)
`

// wantCapped: a flooded stream kept exactly max bytes of the flood and
// says it was truncated.
func wantCapped(t *testing.T, name, got string, truncated bool, max int64, fill string) {
	t.Helper()
	if int64(len(got)) != max || !truncated || strings.Trim(got, fill) != "" {
		t.Fatalf("%s: %d bytes (truncated %v), want exactly %d bytes of %q", name, len(got), truncated, max, fill)
	}
}

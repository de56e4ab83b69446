package runner

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func frame(body string) []byte {
	b := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(b, uint32(len(body)))
	copy(b[4:], body)
	return b
}

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	code := 3
	for _, ev := range []Event{
		{Type: "ready"},
		{Type: "error", Name: "ValueError", Value: "bad\x00value", Traceback: "Traceback ...\n"},
		{Type: "done", ExitCode: &code},
	} {
		if err := WriteFrame(&buf, ev); err != nil {
			t.Fatal(err)
		}
	}
	fr := NewFrameReader(&buf, 1<<20)
	var got []Event
	for {
		ev, err := fr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	if len(got) != 3 || got[1].Value != "bad\x00value" || got[2].ExitCode == nil || *got[2].ExitCode != 3 {
		t.Fatalf("got %+v", got)
	}
}

func TestFrameReaderRejectsHostileStreams(t *testing.T) {
	huge := make([]byte, 4)
	binary.BigEndian.PutUint32(huge, 1<<31)
	for _, tc := range []struct {
		name   string
		stream []byte
		want   error
	}{
		{"oversized length", huge, ErrFrameTooLarge},
		{"truncated header", []byte{0, 0}, ErrMalformed},
		{"truncated body", frame(`{"type":"ready"}`)[:10], ErrMalformed},
		{"not json", frame("\xff\xfe garbage"), ErrMalformed},
		{"no type", frame(`{"name":"x"}`), ErrMalformed},
		{"wrong types", frame(`{"type":"done","exit_code":"zero"}`), ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewFrameReader(bytes.NewReader(tc.stream), 1<<20).Next()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestOutputKeepsOnlyWellTypedRepresentations(t *testing.T) {
	fr := NewFrameReader(bytes.NewReader(frame(`{"type":"result","is_main_result":true,"data":{
		"text/plain":"1","text/html":"<b>1</b>","image/png":"iVBORw0KGgo=",
		"application/json":{"a":[1,2]},"text/markdown":{"not":"a string"},"x-unknown/type":"zzz"}}`)), 1<<20)
	ev, err := fr.Next()
	if err != nil {
		t.Fatal(err)
	}
	out, size := Output(ev)
	if !out.IsMainResult || out.Text != "1" || out.HTML != "<b>1</b>" || out.PNG != "iVBORw0KGgo=" {
		t.Fatalf("out = %+v", out)
	}
	if string(out.JSON) != `{"a":[1,2]}` {
		t.Fatalf("json = %s", out.JSON)
	}
	if out.Markdown != "" {
		t.Fatalf("a non-string markdown was accepted: %q", out.Markdown)
	}
	if want := len("1") + len("<b>1</b>") + len("iVBORw0KGgo=") + len(`{"a":[1,2]}`); size != want {
		t.Fatalf("size = %d, want %d", size, want)
	}
}

func TestFilesEmbedsRunnerAndBackend(t *testing.T) {
	f := Files()
	if !strings.Contains(string(f["runner.py"]), "def main(") {
		t.Fatal("runner.py missing from the embedded files")
	}
	if !strings.Contains(string(f[ScriptName]), "import runner") {
		t.Fatalf("%s, the entry point, does not import the runner", ScriptName)
	}
	if !strings.Contains(string(f[ZygoteName]), "def become_sandbox(") {
		t.Fatal("zygote.py missing from the embedded files")
	}
	if _, ok := f["vivarium_mpl_backend.py"]; !ok {
		t.Fatal("matplotlib backend missing from the embedded files")
	}
}

// FuzzFrameReader: whatever a sandbox writes, the reader returns events or
// a named error, never panics or allocates beyond its limit.
func FuzzFrameReader(f *testing.F) {
	f.Add(frame(`{"type":"ready"}`))
	f.Add(frame(`{"type":"result","data":{"text/plain":"x"}}`))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr := NewFrameReader(bytes.NewReader(b), 4096)
		for i := 0; i < 100; i++ {
			ev, err := fr.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("unexpected error kind: %v", err)
				}
				return
			}
			Output(ev)
		}
	})
}

// Frames the caller chooses to skip are not decoded: a flood costs a read,
// not a parse.
func TestNextSkipping(t *testing.T) {
	var buf bytes.Buffer
	buf.Write(frame(`{"type": "result", "data": {}}`))
	buf.Write(frame(`{"type": "done", "exit_code": 0}`))
	fr := NewFrameReader(&buf, 1<<20)
	skip := func(b []byte) bool { return bytes.HasPrefix(b, []byte(`{"type": "result"`)) }
	if ev, err := fr.NextSkipping(skip); err != nil || ev.Type != "skipped" {
		t.Fatalf("%+v %v", ev, err)
	}
	if ev, err := fr.NextSkipping(skip); err != nil || ev.Type != "done" {
		t.Fatalf("%+v %v", ev, err)
	}
}

func TestOutputChartAndData(t *testing.T) {
	fr := NewFrameReader(bytes.NewReader(frame(`{"type":"result","data":{"text/plain":"<Figure>",
		"`+ChartMIME+`":{"type":"bar","elements":[]},"`+DataMIME+`":{"a":[1,null]}}}`)), 1<<20)
	ev, err := fr.Next()
	if err != nil {
		t.Fatal(err)
	}
	out, size := Output(ev)
	if string(out.Chart) != `{"type":"bar","elements":[]}` || string(out.Data) != `{"a":[1,null]}` {
		t.Fatalf("chart = %s, data = %s", out.Chart, out.Data)
	}
	if want := len("<Figure>") + len(out.Chart) + len(out.Data); size != want {
		t.Fatalf("size = %d, want %d", size, want)
	}
}

// TestRunnerPython runs runner_test.py: runner.py's cell syntax (indented
// cells, shell escapes, magics) and rich results (charts, DataFrame data,
// PIL images) in the host's Python, without a sandbox.
func TestRunnerPython(t *testing.T) {
	py := testutil.RequirePython(t)
	cmd := exec.Command(py, "-X", "dev", "runner_test.py", "-v")
	cmd.Env = append(os.Environ(), "MPLCONFIGDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("runner_test.py: %v", err)
	}
}

// TestZygotePython runs zygote_test.py: what the zygote does before its
// first fork (the warm-up, the pools' free blocks taken) in the host's
// Python, without a sandbox. Not in -X dev mode: its debug allocator puts
// objects in other blocks than the zygote's allocator does.
func TestZygotePython(t *testing.T) {
	py := testutil.RequirePython(t)
	out, err := exec.Command(py, "zygote_test.py", "-v").CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("zygote_test.py: %v", err)
	}
}

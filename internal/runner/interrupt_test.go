package runner

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// pipeRunner is runner.py in the host's Python, spoken to over its pipes as
// a sandbox's supervisor does, without a sandbox.
type pipeRunner struct {
	t      *testing.T
	cmd    *exec.Cmd
	req    *os.File
	events chan Event
}

func startPipeRunner(t *testing.T) *pipeRunner {
	py := testutil.RequirePython(t)
	dir := t.TempDir()
	for name, b := range Files() {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	evtR, evtW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-s", "-B", filepath.Join(dir, ScriptName), "--persistent")
	cmd.Dir = dir
	cmd.ExtraFiles = []*os.File{reqR, evtW} // fds 3 and 4
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reqR.Close()
	evtW.Close()
	r := &pipeRunner{t: t, cmd: cmd, req: reqW, events: make(chan Event, 64)}
	t.Cleanup(func() {
		reqW.Close()
		cmd.Process.Kill()
		cmd.Wait()
		evtR.Close()
	})
	go func() {
		defer close(r.events)
		fr := NewFrameReader(evtR, 1<<20)
		for {
			ev, err := fr.Next()
			if err != nil {
				return
			}
			r.events <- ev
		}
	}()
	if ev := r.next(); ev.Type != "ready" {
		t.Fatalf("first event %+v", ev)
	}
	return r
}

// next is the runner's next event. The deadline only keeps a runner that
// hangs from hanging the test.
func (r *pipeRunner) next() Event {
	r.t.Helper()
	select {
	case ev, ok := <-r.events:
		if !ok {
			r.t.Fatal("the runner ended")
		}
		return ev
	case <-time.After(30 * time.Second):
		r.t.Fatal("no event from the runner in 30 s: its channel is out of step")
		return Event{}
	}
}

func (r *pipeRunner) write(b []byte) {
	r.t.Helper()
	if _, err := r.req.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

func (r *pipeRunner) execute(code string) {
	r.t.Helper()
	if err := WriteFrame(r.req, Request{Type: "execute", Code: code}); err != nil {
		r.t.Fatal(err)
	}
}

// rest is the events up to the execution's end: the error's name, if one,
// and the main result's text.
func (r *pipeRunner) rest() (errName, text string) {
	r.t.Helper()
	for {
		ev := r.next()
		switch ev.Type {
		case "error":
			errName = ev.Name
		case "result":
			var s string
			json.Unmarshal(ev.Data["text/plain"], &s)
			text = s
			r.write(frame(`{"type":"ack"}`))
		case "done":
			return errName, text
		}
	}
}

func (r *pipeRunner) interrupt() {
	r.t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGINT); err != nil {
		r.t.Fatal(err)
	}
	// Long enough for Python to have run its handler, wherever the
	// signal found it; the outcome does not depend on how long.
	time.Sleep(100 * time.Millisecond)
}

// An interrupt stops the cell's code wherever it lands, and never the
// runner's own: not between a frame's header and its body, not while
// the runner waits between cells.
func TestInterruptNeverBreaksTheChannel(t *testing.T) {
	r := startPipeRunner(t)
	r.execute("n = 0")
	if name, _ := r.rest(); name != "" {
		t.Fatalf("n = 0: %s", name)
	}

	// The runner waits for a displayed result's ack; the interrupt comes
	// when it has read the ack's header and not its body.
	r.execute("display(42)\nwhile True: n += 1")
	if ev := r.next(); ev.Type != "result" {
		t.Fatalf("event %+v", ev)
	}
	ack := frame(`{"type":"ack"}`)
	r.write(ack[:4])
	r.interrupt()
	r.write(ack[4:])
	if name, _ := r.rest(); name != "KeyboardInterrupt" {
		t.Fatalf("interrupted cell: error %q", name)
	}
	r.execute("isinstance(n, int)")
	if name, text := r.rest(); name != "" || text != "True" {
		t.Fatalf("after the interrupt: error %q, result %q", name, text)
	}

	// Between cells: meant for a cell that has ended, it is dropped.
	r.interrupt()
	r.execute("n = 7\nn")
	if name, text := r.rest(); name != "" || text != "7" {
		t.Fatalf("the cell after an interrupt between cells: error %q, result %q", name, text)
	}

	// A cell that catches the interrupt can be interrupted again.
	r.execute("import time\ncaught = 0\nwhile True:\n    try:\n        time.sleep(10)\n    except KeyboardInterrupt:\n        caught += 1\n        if caught == 2: raise")
	time.Sleep(200 * time.Millisecond)
	r.interrupt()
	r.interrupt()
	if name, _ := r.rest(); name != "KeyboardInterrupt" {
		t.Fatalf("interrupted twice: error %q", name)
	}
	r.execute("caught")
	if _, text := r.rest(); text != "2" {
		t.Fatalf("caught %q", text)
	}
}

// Package runner holds the Python program that runs inside every sandbox
// and the framed protocol the supervisor speaks with it, and the kernels
// of the other languages' code contexts, which the runner starts inside the
// sandbox (kernels.py: Node, R, JShell).
//
// A frame is a 4-byte big-endian length followed by that many bytes of JSON.
// Requests go to the runner on one pipe, events come back on another; the
// code's stdout and stderr are separate pipes, so output can never be
// mistaken for a protocol message. Everything read from a sandbox is
// hostile: frames are size-capped and any malformed frame ends parsing.
package runner

import (
	"embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

//go:embed runner.py start.py cells.py vivarium_mpl_backend.py zygote.py landlock.py kernels.py kernel_node.js kernel_r.R kernel_java.java
var files embed.FS

// ScriptName is the runner's entry point among Files (start.py, which
// imports runner.py); ZygoteName is the zygote's, which forks preloaded
// runners into sandboxes.
const (
	ScriptName = "start.py"
	ZygoteName = "zygote.py"
)

// SourceName is the runner's own file, which also runs as a script (as
// ScriptName was before start.py): what a sandbox restored from before
// start.py has.
const SourceName = "runner.py"

// Files returns the runner's files by name, to be placed in one directory.
func Files() map[string][]byte {
	out := map[string][]byte{}
	entries, _ := fs.ReadDir(files, ".")
	for _, e := range entries {
		b, err := files.ReadFile(e.Name())
		if err != nil {
			panic(err) // embedded: cannot fail
		}
		out[e.Name()] = b
	}
	return out
}

// Request asks the runner to do something. Type is "execute", "contexts"
// or "ack".
type Request struct {
	Type     string            `json:"type"`
	Code     string            `json:"code,omitempty"`
	Filename string            `json:"filename,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// Context is the code context an "execute" runs in ("" is the default
	// Python one); Language (one of Languages) and Cwd (the working
	// directory it starts in) make it when the runner has not yet.
	Context  string `json:"context,omitempty"`
	Language string `json:"language,omitempty"`
	Cwd      string `json:"cwd,omitempty"`
	// For "contexts": Live lists the contexts that exist, the runner drops
	// the state of any other; Reset lists those whose state it drops
	// although they exist. The runner does not answer.
	Live  []string `json:"live,omitempty"`
	Reset []string `json:"reset,omitempty"`
}

// Event is something the runner reports: "ready", "result", "error" or
// "done".
type Event struct {
	Type string `json:"type"`
	// Data is a result's representations by MIME type ("text/plain",
	// "image/png" in base64, "application/json" as JSON ...).
	Data         map[string]json.RawMessage `json:"data,omitempty"`
	IsMainResult bool                       `json:"is_main_result,omitempty"`
	// Name, Value and Traceback describe an uncaught exception.
	Name      string `json:"name,omitempty"`
	Value     string `json:"value,omitempty"`
	Traceback string `json:"traceback,omitempty"`
	// Signal, on an error, is the signal that ended the process of the
	// cell's context, where that is not the runner: a kernel or a shell
	// that died, or a bash cell's last command. The runner lives on then,
	// so only this says that the memory limit may have been the cause.
	Signal int `json:"signal,omitempty"`
	// ExitCode ends an execution.
	ExitCode *int `json:"exit_code,omitempty"`
}

// The MIME types runner.py gives E2B's result fields under: a figure's
// chart and a DataFrame's data.
const (
	ChartMIME = "application/vnd.vivarium.chart+json"
	DataMIME  = "application/vnd.vivarium.data+json"
)

// Errors a FrameReader reports for a broken stream.
var (
	ErrFrameTooLarge = errors.New("runner: frame over the size limit")
	ErrMalformed     = errors.New("runner: malformed frame")
)

// WriteFrame writes v as one frame.
func WriteFrame(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) > 1<<31 {
		return ErrFrameTooLarge
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	_, err = w.Write(buf)
	return err
}

// FrameReader reads events, refusing frames larger than its limit.
type FrameReader struct {
	r   io.Reader
	max int
	buf []byte
}

// NewFrameReader reads frames of at most max bytes from r.
func NewFrameReader(r io.Reader, max int) *FrameReader {
	return &FrameReader{r: r, max: max}
}

// Next returns the next event. It returns io.EOF at a clean end of stream,
// and ErrFrameTooLarge or ErrMalformed (wrapped) when the stream is broken;
// after an error the reader must not be used again.
func (f *FrameReader) Next() (Event, error) { return f.NextSkipping(nil) }

// NextSkipping is Next, but frames whose body skip reports true (given the
// raw bytes) are passed over without being decoded, and reported as an
// Event of Type "skipped": decoding is what a flood of frames costs.
func (f *FrameReader) NextSkipping(skip func(body []byte) bool) (Event, error) {
	var head [4]byte
	if _, err := io.ReadFull(f.r, head[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Event{}, fmt.Errorf("%w: truncated header", ErrMalformed)
		}
		return Event{}, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if uint64(n) > uint64(f.max) {
		return Event{}, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, f.max)
	}
	if cap(f.buf) < int(n) {
		f.buf = make([]byte, n)
	}
	body := f.buf[:n]
	if _, err := io.ReadFull(f.r, body); err != nil {
		return Event{}, fmt.Errorf("%w: truncated body: %v", ErrMalformed, err)
	}
	if skip != nil && skip(body) {
		return Event{Type: "skipped"}, nil
	}
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if ev.Type == "" {
		return Event{}, fmt.Errorf("%w: event without a type", ErrMalformed)
	}
	// Do not keep a huge buffer alive for the sandbox's whole life.
	if cap(f.buf) > 1<<20 {
		f.buf = nil
	}
	return ev, nil
}

// Output converts a "result" event into the Result's form, and reports its
// size in bytes for the caller's caps. Representations of unexpected types
// are dropped, not trusted.
func Output(ev Event) (sandbox.Output, int) {
	out := sandbox.Output{IsMainResult: ev.IsMainResult}
	size := 0
	str := func(mime string) string {
		raw, ok := ev.Data[mime]
		if !ok {
			return ""
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return ""
		}
		size += len(s)
		return s
	}
	out.Text = str("text/plain")
	out.HTML = str("text/html")
	out.Markdown = str("text/markdown")
	out.SVG = str("image/svg+xml")
	out.PNG = str("image/png")
	out.JPEG = str("image/jpeg")
	out.LaTeX = str("text/latex")
	out.JavaScript = str("application/javascript")
	for mime, field := range map[string]*json.RawMessage{"application/json": &out.JSON,
		ChartMIME: &out.Chart, DataMIME: &out.Data} {
		if raw, ok := ev.Data[mime]; ok && json.Valid(raw) {
			*field = raw
			size += len(raw)
		}
	}
	return out, size
}

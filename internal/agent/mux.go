// Package agent is the side of a container sandbox (gVisor, Docker) that
// runs inside the container: PID 1 of the container, it starts the Python
// runner and the commands as the unprivileged sandbox user, and speaks to
// the supervisor over one byte stream in each direction (the container's
// standard input and output), on which it multiplexes everything the
// native backend carries on separate pipes and sockets.
//
// A container runtime gives the process in the container its stdio and no
// other descriptor, so everything travels in frames: a kind, a stream id,
// a length, the bytes. Output of the code is framed by the agent, never by
// the code, so nothing the code prints can pass for a frame.
package agent

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Kinds of frame.
const (
	KindConfig byte = 1 // supervisor → agent, once, first: the Config (JSON)
	KindCtl    byte = 2 // either way: a Ctl message (JSON)
	KindData   byte = 3 // either way: bytes of a stream
	KindClose  byte = 4 // either way: the end of a stream
)

// Streams. The runner's output is one pair of streams for the sandbox's
// life (as its pipes are in the native backend); each runner (restarts
// make new ones) has its own request and event streams.
const (
	StreamStdout = 1
	StreamStderr = 2
	// streamRunnerBase + 2*generation: requests to the runner;
	// streamRunnerBase + 2*generation + 1: the runner's events.
	streamRunnerBase = 1 << 16
	// streamCommandBase + 3*id: the command's stdin, then stdout, stderr.
	streamCommandBase = 1 << 24
)

// RequestStream and EventStream are the streams of a runner generation.
func RequestStream(gen uint32) uint32 { return streamRunnerBase + 2*gen }
func EventStream(gen uint32) uint32   { return streamRunnerBase + 2*gen + 1 }

// CommandStreams are a command's stdin, stdout and stderr streams.
func CommandStreams(id uint32) (stdin, stdout, stderr uint32) {
	b := streamCommandBase + 3*id
	return b, b + 1, b + 2
}

// MaxFrame bounds one frame's payload.
const MaxFrame = 1 << 20

// Config is what the agent needs; the supervisor sends it first.
type Config struct {
	Python     string   `json:"python"`
	RunnerArgs []string `json:"runner_args"`
	Env        []string `json:"env"`
	Workspace  string   `json:"workspace"`
	UID        int      `json:"uid"`
	GID        int      `json:"gid"`
	Groups     []uint32 `json:"groups,omitempty"` // supplementary
	OpenFiles  uint64   `json:"open_files"`
	FileSize   uint64   `json:"file_size"`
	CPUSeconds uint64   `json:"cpu_seconds"`
	// MaxProcs is RLIMIT_NPROC of the sandbox user: processes and threads
	// of the code, counted by the kernel the code sees (0: none).
	MaxProcs uint64 `json:"max_procs"`
	// Egress is where the agent listens for the sandbox's connections to
	// its network proxy (sandbox.EgressAddr), each passed to the
	// supervisor (OpConnect); "": the sandbox has no network access.
	Egress string `json:"egress,omitempty"`
	// Seccomp is the filter (struct sock_filter[], native byte order) the
	// agent loads before it starts anything; empty: none (the runtime's).
	Seccomp []byte `json:"seccomp,omitempty"`
}

// Control operations. Supervisor → agent: OpSpawn, OpSignal, OpInterrupt,
// OpRestart, OpResize, OpPing, OpEgressReset, OpEgressRelease. Agent → supervisor: OpReady, OpRunner, OpSpawned, OpExited,
// OpError, OpPing, OpConnect.
const (
	OpReady     = "ready"     // the agent is set up
	OpError     = "error"     // setup failed: Error (Step: what)
	OpRunner    = "runner"    // a runner started: Gen, PID
	OpSpawn     = "spawn"     // start a command: ID, Argv, Env, Dir; Rows and Cols: in a terminal of that size
	OpSpawned   = "spawned"   // the command started (PID) or not (Error)
	OpSignal    = "signal"    // signal a command's process group: ID, Signal
	OpInterrupt = "interrupt" // SIGINT to the runner
	OpRestart   = "restart"   // kill every process but the agent, start a new runner
	OpExited    = "exited"    // a command (ID) or a runner (ID 0, Gen) ended: Code, Signal
	OpResize    = "resize"    // resize a command's terminal: ID, Rows, Cols
	// OpPing is answered with OpPing (same ID), once every frame sent
	// before it has been read: a round trip through both streams (a
	// container restored from a checkpoint is reached through new ones).
	OpPing = "ping"
	// OpConnect (agent → supervisor): the sandbox made a connection to
	// its network proxy (Config.Egress); ID is its stream (EgressStream).
	OpConnect = "connect"
	// OpEgressReset (supervisor → agent): end every connection to the
	// proxy, and close those that come until OpEgressRelease (before a
	// checkpoint, which the proxy's side of them does not survive).
	OpEgressReset   = "egress-reset"
	OpEgressRelease = "egress-release"
)

// Ctl is a control message.
type Ctl struct {
	Op     string   `json:"op"`
	ID     uint32   `json:"id,omitempty"`
	Gen    uint32   `json:"gen,omitempty"`
	PID    int      `json:"pid,omitempty"`
	Argv   []string `json:"argv,omitempty"`
	Env    []string `json:"env,omitempty"`
	Dir    string   `json:"dir,omitempty"`
	Signal int      `json:"signal,omitempty"`
	Code   int      `json:"code"`
	Step   string   `json:"step,omitempty"`
	Error  string   `json:"error,omitempty"`
	// Rows and Cols are a terminal's size (OpSpawn, OpResize).
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// Frame is one unit on the wire.
type Frame struct {
	Kind   byte
	Stream uint32
	Data   []byte
}

// ErrBadFrame is what a reader reports for a broken stream.
var ErrBadFrame = errors.New("agent: malformed frame")

// Writer writes frames; it is safe for concurrent use, a frame at a time.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

// NewWriter writes frames to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Write writes one frame; data larger than MaxFrame is split. A frame
// goes out in one write: across a sandbox runtime's boundary (gVisor's
// ptrace platform) each system call costs tens of microseconds.
func (fw *Writer) Write(kind byte, stream uint32, data []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	for {
		n := min(len(data), MaxFrame)
		fw.buf = append(fw.buf[:0], kind, 0, 0, 0, 0, 0, 0, 0, 0)
		binary.BigEndian.PutUint32(fw.buf[1:5], stream)
		binary.BigEndian.PutUint32(fw.buf[5:9], uint32(n))
		fw.buf = append(fw.buf, data[:n]...)
		_, err := fw.w.Write(fw.buf)
		if cap(fw.buf) > 64<<10 {
			fw.buf = nil
		}
		if err != nil {
			return err
		}
		data = data[n:]
		if len(data) == 0 {
			return nil
		}
	}
}

// Ctl writes a control message.
func (fw *Writer) Ctl(c Ctl) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return fw.Write(KindCtl, 0, b)
}

// Reader reads frames.
type Reader struct {
	r    io.Reader
	head [9]byte
}

// NewReader reads frames from r, buffered.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, 64<<10)} }

// Next returns the next frame; its Data is the caller's.
func (fr *Reader) Next() (Frame, error) {
	if _, err := io.ReadFull(fr.r, fr.head[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Frame{}, fmt.Errorf("%w: truncated header", ErrBadFrame)
		}
		return Frame{}, err
	}
	f := Frame{Kind: fr.head[0], Stream: binary.BigEndian.Uint32(fr.head[1:5])}
	n := binary.BigEndian.Uint32(fr.head[5:9])
	if n > MaxFrame || f.Kind < KindConfig || f.Kind > KindClose {
		return Frame{}, fmt.Errorf("%w: kind %d, %d bytes", ErrBadFrame, f.Kind, n)
	}
	f.Data = make([]byte, n)
	if _, err := io.ReadFull(fr.r, f.Data); err != nil {
		return Frame{}, fmt.Errorf("%w: truncated body", ErrBadFrame)
	}
	return f, nil
}

package sandbox

import "encoding/json"

// Status says how an execution ended.
type Status string

const (
	StatusOK          Status = "ok"           // the code ran to the end
	StatusError       Status = "error"        // an uncaught exception, or a non-zero exit
	StatusTimeout     Status = "timeout"      // the wall-clock or CPU-time limit ended it
	StatusMemoryLimit Status = "memory_limit" // the memory limit ended it
	StatusKilled      Status = "killed"       // a signal ended it
	StatusSetupFailed Status = "setup_failed" // the sandbox could not start
)

// Result is the outcome of one execution. Field names follow E2B's
// Execution so that adapters stay thin.
type Result struct {
	Status          Status     `json:"status"`
	ExitCode        int        `json:"exit_code"`
	Stdout          string     `json:"stdout"`
	Stderr          string     `json:"stderr"`
	StdoutTruncated bool       `json:"stdout_truncated"`
	StderrTruncated bool       `json:"stderr_truncated"`
	Results         []Output   `json:"results"`
	Error           *Error     `json:"error"`
	DurationMS      float64    `json:"duration_ms"`
	CPUMS           float64    `json:"cpu_ms"`
	PeakMemoryBytes int64      `json:"peak_memory_bytes"`
	Files           []FileInfo `json:"files"`
	// StateLost says the Python process of a persistent sandbox was
	// restarted during or before this execution: variables and imports
	// are gone, files are kept.
	StateLost bool `json:"state_lost,omitempty"`
}

// Output is one rich result: the value of the last expression, a display()
// call or a figure. Binary formats are base64.
type Output struct {
	Text       string          `json:"text,omitempty"`
	HTML       string          `json:"html,omitempty"`
	PNG        string          `json:"png,omitempty"`
	JPEG       string          `json:"jpeg,omitempty"`
	SVG        string          `json:"svg,omitempty"`
	Markdown   string          `json:"markdown,omitempty"`
	LaTeX      string          `json:"latex,omitempty"`
	JSON       json.RawMessage `json:"json,omitempty"`
	JavaScript string          `json:"javascript,omitempty"`
	// Chart describes a matplotlib figure as data (its type, title, axes
	// and elements), in the shape of E2B's result.chart.
	Chart json.RawMessage `json:"chart,omitempty"`
	// Data is a DataFrame's columns, each a list of its values, as E2B's
	// result.data.
	Data         json.RawMessage `json:"data,omitempty"`
	IsMainResult bool            `json:"is_main_result"`
}

// Error describes why code failed: an exception (with Python's own
// traceback), or a limit or signal that ended it.
type Error struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Exit codes the CLI uses for outcomes that have no exit status of their own,
// following timeout(1) and the shell's 128+signal.
const (
	ExitTimeout     = 124
	ExitMemoryLimit = 137
	// ExitCrash: a crash with no signal of its own (a WebAssembly trap),
	// reported as abort() is, 128+SIGABRT.
	ExitCrash = 128 + 6
)

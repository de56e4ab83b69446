package sandbox

import (
	"fmt"
	"syscall"
)

// Outcome is what a backend observed of how an execution ended; Classify
// turns it into the Result's Status, ExitCode and Error the same way for
// every backend. What counts comes from the kernel (signals, OOM kills,
// CPU accounting), not from the sandbox: the runner's own report counts
// only where the process itself finished normally.
type Outcome struct {
	// Why is set when a limit (StatusTimeout) or the caller (StatusKilled)
	// ended the execution; WhyMsg says which.
	Why    Status
	WhyMsg string
	// Dead: the code's process died before the runner reported the end.
	Dead bool
	// Exited: the process's end was seen, with Code and Signal.
	Exited bool
	Code   int
	Signal int
	// Crash says how a process that had no signal to die of crashed (a
	// WebAssembly trap); Closed: the sandbox was closed meanwhile.
	Crash  string
	Closed bool
	// MemoryErrorIsLimit: Python's MemoryError is the memory limit
	// (WebAssembly's linear memory could not grow past it).
	MemoryErrorIsLimit bool
	// RunnerCode is the exit code the runner reported (sys.exit), if it did.
	RunnerCode *int
	// ContextSignal is the signal that ended the process of the cell's
	// context where that is not the runner (a kernel of another language,
	// a shell, a bash cell's last command), as the runner reported it.
	ContextSignal int
	// OOM: the kernel killed a process of the sandbox for its memory limit.
	OOM    bool
	Limits Limits
	// Broken: the runner's event stream was malformed.
	Broken error
}

// memoryMsg says which limit an execution reached, peak being the most
// the sandbox held (0: not known). Files count: a sandbox's file system
// is kept in memory (native), or may be (/dev/shm, tmpfs mounts), and its
// files stay when the process that wrote them ends. A sandbox killed well
// under its own limit was killed at a ceiling above it: its key's, or
// all sandboxes' (serve --max-memory-per-key, --max-memory-total).
func (o Outcome) memoryMsg(peak int64) string {
	if peak > 0 && o.Limits.Memory > 0 && peak < o.Limits.Memory/10*9 {
		return fmt.Sprintf("the sandbox ran out of memory at %d MiB, under its own %d MiB limit: the memory ceiling of "+
			"its API key's sandboxes, or of all sandboxes on the server, was reached", peak>>20, o.Limits.Memory>>20)
	}
	return fmt.Sprintf("the sandbox exceeded its %d MiB memory limit "+
		"(what its processes hold, and its files in memory: /dev/shm's, and on the native backend all of them)", o.Limits.Memory>>20)
}

// Classify sets res's Status, ExitCode and Error. res.CPUMS must be set.
func (o Outcome) Classify(res *Result) {
	limitErr := func(status Status, code int, name, msg string) {
		res.Status, res.ExitCode = status, code
		res.Error = &Error{Name: name, Value: msg}
	}
	switch {
	case o.Why == StatusTimeout:
		limitErr(o.Why, ExitTimeout, "TimeoutError", o.WhyMsg)
	case o.Why != "":
		limitErr(o.Why, 128+int(syscall.SIGKILL), "Killed", o.WhyMsg)
	case o.Dead && o.Closed:
		limitErr(StatusKilled, 128+int(syscall.SIGKILL), "Killed", "the sandbox was closed during the execution")
	case o.Dead && o.Crash != "":
		if o.OOM {
			limitErr(StatusMemoryLimit, ExitMemoryLimit, "MemoryError",
				o.memoryMsg(res.PeakMemoryBytes))
			break
		}
		limitErr(StatusKilled, ExitCrash, "Killed", o.Crash)
	case o.Exited && o.Signal != 0 || (o.Dead && !o.Exited):
		sig := syscall.SIGKILL
		if o.Exited {
			sig = syscall.Signal(o.Signal)
		}
		switch {
		case o.OOM:
			limitErr(StatusMemoryLimit, ExitMemoryLimit, "MemoryError",
				o.memoryMsg(res.PeakMemoryBytes))
		case sig == syscall.SIGXCPU || (o.Limits.CPUTime > 0 && res.CPUMS >= float64(o.Limits.CPUTime.Milliseconds())):
			limitErr(StatusTimeout, ExitTimeout, "TimeoutError",
				fmt.Sprintf("execution exceeded the %v CPU time limit", o.Limits.CPUTime))
		default:
			limitErr(StatusKilled, 128+int(sig), "Killed", fmt.Sprintf("the program was killed by signal %d (%v)", int(sig), sig))
		}
	default:
		code := 0
		switch {
		case o.Exited:
			code = o.Code
		case o.RunnerCode != nil:
			code = *o.RunnerCode
		}
		res.ExitCode = code
		switch {
		case res.Error != nil && res.Error.Name == "MemoryError" && o.MemoryErrorIsLimit:
			// The traceback is kept.
			res.Status, res.ExitCode = StatusMemoryLimit, ExitMemoryLimit
			res.Error.Value = o.memoryMsg(res.PeakMemoryBytes)
		case res.Error != nil && o.OOM && o.ContextSignal == int(syscall.SIGKILL):
			// A kernel, a shell or a command was the memory limit's victim
			// and the runner lived on (on cgroup v1, or wherever one OOM
			// kill does not end the whole sandbox): the same outcome as
			// the runner's own death. The traceback, which says whose
			// variables are gone, is kept.
			res.Status, res.ExitCode = StatusMemoryLimit, ExitMemoryLimit
			res.Error.Name, res.Error.Value = "MemoryError", o.memoryMsg(res.PeakMemoryBytes)
		case res.Error != nil:
			res.Status = StatusError
		case code != 0:
			res.Status = StatusError
			res.Error = &Error{Name: "SystemExit", Value: fmt.Sprint(code)}
		default:
			res.Status = StatusOK
		}
	}
	if o.Broken != nil && res.Error == nil {
		res.Error = &Error{Name: "ProtocolError", Value: "the sandbox sent malformed results; some were lost"}
	}
}

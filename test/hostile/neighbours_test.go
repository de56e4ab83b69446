//go:build linux

package hostile

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A sandbox must not spend what the host or other sandboxes draw on. A case
// that takes all it can of a kernel budget proves it only while it holds
// what it took, so such a case holds it for holdFor, and meanwhile probes
// on both sides of it ask for the same thing again and again: on the host,
// as root, in this process; and in another sandbox of the same backend.
// Every probe must be served, and at least one of each must have run
// inside the window the case reports ("window FROM TO", in seconds of the
// wall clock: gVisor's monotonic clock is its own, its wall clock the
// host's).
const (
	holdFor       = 3 * time.Second
	probeInterval = 100 * time.Millisecond
)

// holdPrelude gives case code held(name, count, errno): report how much of
// a budget the code took and why it stopped, then hold it.
var holdPrelude = fmt.Sprintf(`import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def held(name, count, err):
    start = time.time()
    print("held", name, count, errno.errorcode.get(err, err), flush=True)
    time.sleep(%f)
    print("window %%.3f %%.3f" %% (start, time.time()), flush=True)

`, holdFor.Seconds())

// probeCode wraps a neighbour's probe: body sets ok (and why), and the
// sandbox prints "probe T ok" or "probe T <why>".
func probeCode(body string) string {
	return `import ctypes, errno, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ok, why = False, "not run"
t = time.time()
try:
` + indent(body) + `
except OSError as e:
    ok, why = False, errno.errorcode.get(e.errno, str(e))
print("probe %.3f %s" % (t, "ok" if ok else why), flush=True)
`
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}

type probeRecord struct {
	at  float64 // wall-clock seconds
	err string  // "" when served
}

// neighbours runs the probes of one case.
type neighbours struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	host    []probeRecord
	sandbox []probeRecord
	setup   []string // what went wrong setting the probes up
}

var (
	neighboursMu sync.Mutex
	neighbourSet = map[string]*neighbours{}
)

func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// watchNeighbours starts the probes, for the case's check to judge with
// neighboursServed. Called from a case's prepare.
func watchNeighbours(t *testing.T, h *harness, hostProbe func() error, sandboxProbe string) {
	n := &neighbours{stop: make(chan struct{})}
	neighboursMu.Lock()
	neighbourSet[t.Name()] = n
	neighboursMu.Unlock()
	t.Cleanup(n.finish)
	n.wg.Add(2)
	go func() {
		defer n.wg.Done()
		for {
			at := now()
			rec := probeRecord{at: at}
			if err := hostProbe(); err != nil {
				rec.err = err.Error()
			}
			n.mu.Lock()
			n.host = append(n.host, rec)
			n.mu.Unlock()
			select {
			case <-n.stop:
				return
			case <-time.After(probeInterval):
			}
		}
	}()
	// The neighbour sandbox starts before the case's (prepare runs first),
	// so its probes cover the whole run.
	ready := make(chan struct{})
	go func() {
		defer n.wg.Done()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { <-n.stop; cancel() }()
		sb, err := h.be.B.Create(ctx, sandbox.Spec{Limits: baseLimits})
		close(ready)
		if err != nil {
			n.note("the neighbour sandbox did not start: %v", err)
			return
		}
		defer sb.Close()
		code := probeCode(sandboxProbe)
		for {
			res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: code}, nil)
			select {
			case <-n.stop:
				return
			default:
			}
			if err != nil {
				n.note("the neighbour's probe: %v", err)
				return
			}
			for _, line := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
				var at float64
				var verdict string
				if _, err := fmt.Sscanf(line, "probe %f %s", &at, &verdict); err != nil {
					n.note("the neighbour's probe said %q (stderr %q)", res.Stdout, res.Stderr)
					return
				}
				rec := probeRecord{at: at}
				if verdict != "ok" {
					rec.err = verdict
				}
				n.mu.Lock()
				n.sandbox = append(n.sandbox, rec)
				n.mu.Unlock()
			}
			select {
			case <-n.stop:
				return
			case <-time.After(probeInterval):
			}
		}
	}()
	<-ready
}

func (n *neighbours) note(format string, args ...any) {
	n.mu.Lock()
	n.setup = append(n.setup, fmt.Sprintf(format, args...))
	n.mu.Unlock()
}

func (n *neighbours) finish() {
	select {
	case <-n.stop:
	default:
		close(n.stop)
	}
	n.wg.Wait()
}

// neighboursServed stops the case's probes and fails the case unless
// every probe was served and each side probed inside the case's window.
func neighboursServed(t *testing.T, o *outcome) {
	t.Helper()
	neighboursMu.Lock()
	n := neighbourSet[t.Name()]
	delete(neighbourSet, t.Name())
	neighboursMu.Unlock()
	if n == nil {
		t.Fatal("the case's prepare started no probes")
	}
	n.finish()
	var from, to float64
	for _, line := range strings.Split(o.Stdout, "\n") {
		if rest, ok := strings.CutPrefix(line, "window "); ok {
			f := strings.Fields(rest)
			if len(f) == 2 {
				from, _ = strconv.ParseFloat(f[0], 64)
				to, _ = strconv.ParseFloat(f[1], 64)
			}
		}
	}
	if to <= from {
		t.Fatalf("the case reported no holding window: %s", describe(o))
	}
	for _, s := range n.setup {
		t.Error(s)
	}
	for side, recs := range map[string][]probeRecord{"the host (root)": n.host, "another sandbox": n.sandbox} {
		inside, refused, first := 0, 0, probeRecord{}
		for _, r := range recs {
			if r.err != "" {
				if refused == 0 {
					first = r
				}
				refused++
			}
			if r.at >= from && r.at <= to {
				inside++
			}
		}
		if refused > 0 {
			t.Errorf("%s was refused %d times of %d, first at %.3f (the case held from %.3f to %.3f): %s",
				side, refused, len(recs), first.at, from, to, first.err)
		}
		if inside == 0 {
			t.Errorf("%s never probed while the case held (%.3f to %.3f; %d probes)", side, from, to, len(recs))
		}
	}
}

// neighboursNeverRefused stops the case's probes and fails the case if any
// was refused, for a case that may end before it holds anything.
func neighboursNeverRefused(t *testing.T) {
	t.Helper()
	neighboursMu.Lock()
	n := neighbourSet[t.Name()]
	delete(neighbourSet, t.Name())
	neighboursMu.Unlock()
	if n == nil {
		t.Fatal("the case's prepare started no probes")
	}
	n.finish()
	for _, s := range n.setup {
		t.Error(s)
	}
	for side, recs := range map[string][]probeRecord{"the host (root)": n.host, "another sandbox": n.sandbox} {
		for _, r := range recs {
			if r.err != "" {
				t.Errorf("%s was refused at %.3f: %s", side, r.at, r.err)
				break
			}
		}
	}
}

// heldCount parses the case's "held NAME COUNT ERRNO" line.
func heldCount(t *testing.T, o *outcome, name string) (int, string) {
	t.Helper()
	for _, line := range strings.Split(o.Stdout, "\n") {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "held" && f[1] == name {
			n, err := strconv.Atoi(f[2])
			if err == nil {
				return n, f[3]
			}
		}
	}
	t.Fatalf("no %q held line: %s", name, describe(o))
	return 0, ""
}

// heldOrMemoryLimit checks a budget case on a backend where the sandbox's
// memory limit may end it before it holds anything: either way, neither
// the host nor the neighbour was ever refused.
func heldOrMemoryLimit(name string) func(t *testing.T, h *harness, o *outcome) {
	return func(t *testing.T, h *harness, o *outcome) {
		if o.Status == sandbox.StatusMemoryLimit {
			neighboursNeverRefused(t)
			return
		}
		heldCount(t, o, name)
		neighboursServed(t, o)
	}
}

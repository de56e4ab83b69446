//go:build linux

// Package conformance is the functional suite every backend passes: what a
// user of Vivarium relies on (output and results, errors, files, state,
// interrupts, commands, limits, code contexts), table-driven over every
// backend this machine can run. A backend whose legitimate behaviour
// differs (wasm has no processes) declares it case by case, with the
// reason and what it does instead; the hostile-code suite (test/hostile)
// is this suite's counterpart for attacks.
package conformance

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/testbackends"
)

// The test binary is re-executed as every native sandbox's init.
func TestMain(m *testing.M) {
	if native.IsInit() {
		native.RunInit()
	}
	flag.Parse()
	// A variable of the host's that no sandbox may see.
	os.Setenv("VIVARIUM_HOST_ONLY", "leak")
	code := testutil.RunBothModes(m)
	// The docker backend's daemon, if a test started one.
	if err := testutil.StopDockerd(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the test dockerd:", err)
		code = 1
	}
	os.Exit(code)
}

var suite = testbackends.Suite{Name: "conformance", UIDBase: native.DefaultUIDBase + 15<<24, Env: "VIVARIUM_CONFORMANCE_BACKENDS",
	Docker: true}

// conformanceCase is one behaviour, checked against one backend.
type conformanceCase struct {
	name string
	run  func(t *testing.T, be *backend)
}

// difference is how a case goes on a backend that differs: why, and the
// check that replaces the case's there (nil: the case does not apply, and
// is skipped with the reason).
type difference struct {
	why string
	run func(t *testing.T, be *backend)
}

// backend is a backend under test and its differences.
type backend struct {
	testbackends.Backend
	differences map[string]difference
}

// differencesOf are the declared differences of each backend.
var differencesOf = map[string]map[string]difference{
	"gvisor": gvisorDifferences,
	"wasm":   wasmDifferences,
	"docker": dockerDifferences,
}

func TestConformance(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	for _, tb := range testbackends.Open(t, suite) {
		be := &backend{Backend: tb, differences: differencesOf[tb.Name]}
		t.Run(be.Name, func(t *testing.T) {
			start := time.Now()
			t.Run("cases", func(t *testing.T) {
				for _, c := range cases {
					t.Run(c.name, func(t *testing.T) {
						t.Parallel()
						run := c.run
						if d, ok := be.differences[c.name]; ok {
							if d.run == nil {
								t.Skipf("does not apply to the %s backend: %s", be.Name, d.why)
							}
							run = d.run
						}
						run(t, be)
					})
				}
			})
			t.Logf("%d cases in %v", len(cases), time.Since(start).Round(time.Millisecond))
			if left := be.Leftovers(); len(left) > 0 {
				t.Errorf("left on the host: %v", left)
			}
		})
	}
}

// Every declared difference names a case that exists and says why.
func TestDifferencesNameCases(t *testing.T) {
	names := map[string]bool{}
	for _, c := range cases {
		if names[c.name] {
			t.Errorf("two cases named %q", c.name)
		}
		names[c.name] = true
	}
	for b, diffs := range differencesOf {
		if !slices.Contains(testbackends.Names, b) {
			t.Errorf("differences of %q: no such backend", b)
		}
		var keys []string
		for k := range diffs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !names[k] {
				t.Errorf("%s: difference for unknown case %q", b, k)
			}
			if diffs[k].why == "" {
				t.Errorf("%s: difference for %q without a reason", b, k)
			}
		}
	}
}

// oneShot runs code in a fresh one-shot sandbox of the backend.
func (be *backend) oneShot(t *testing.T, code string, opts ...func(*sandbox.OneShot)) *sandbox.Result {
	t.Helper()
	job := sandbox.OneShot{
		Spec:    sandbox.Spec{Limits: sandbox.Limits{Timeout: 60 * time.Second}},
		Request: sandbox.ExecRequest{Code: code},
	}
	for _, o := range opts {
		o(&job)
	}
	res, warn := sandbox.RunOnce(context.Background(), be.B, job)
	if warn != nil {
		t.Errorf("warning: %v", warn)
	}
	if res.Status == sandbox.StatusSetupFailed {
		t.Fatalf("setup failed: %s", res.Error.Value)
	}
	return res
}

// create makes a persistent sandbox, closed when the test ends.
func (be *backend) create(t *testing.T, spec sandbox.Spec) sandbox.Sandbox {
	t.Helper()
	sb, err := be.B.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sb.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return sb
}

// exec runs code in sb and fails the test on a Go error.
func exec(t *testing.T, sb sandbox.Sandbox, req sandbox.ExecRequest, sinks ...sandbox.Sink) *sandbox.Result {
	t.Helper()
	var sink sandbox.Sink
	if len(sinks) > 0 {
		sink = sinks[0]
	}
	res, err := sb.Execute(context.Background(), req, sink)
	if err != nil {
		t.Fatalf("execute %q: %v", req.Code, err)
	}
	return res
}

func code(c string) sandbox.ExecRequest { return sandbox.ExecRequest{Code: c} }

func limited(l sandbox.Limits) func(*sandbox.OneShot) {
	return func(j *sandbox.OneShot) { j.Spec.Limits = l }
}

func wantStatus(t *testing.T, res *sandbox.Result, status sandbox.Status, exit int) {
	t.Helper()
	if res.Status != status || res.ExitCode != exit {
		t.Fatalf("status %s exit %d, want %s exit %d\nstdout: %s\nstderr: %s\nerror: %+v",
			res.Status, res.ExitCode, status, exit, res.Stdout, res.Stderr, res.Error)
	}
}

func wantStdout(t *testing.T, res *sandbox.Result, want string) {
	t.Helper()
	wantStatus(t, res, sandbox.StatusOK, 0)
	if res.Stdout != want {
		t.Fatalf("stdout %q, want %q\nstderr: %s", res.Stdout, want, res.Stderr)
	}
}

// sinkFunc passes both streams to one function.
type sinkFunc func([]byte)

func (f sinkFunc) Stdout(p []byte) { f(p) }
func (f sinkFunc) Stderr(p []byte) { f(p) }

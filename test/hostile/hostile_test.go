//go:build linux

// Package hostile runs hostile Python in real sandboxes: each case attacks
// one part of the isolation and asserts the concrete safe outcome (the
// errno the kernel or the seccomp filter answers, the status a limit
// produces, what reaches an --out directory), and the suite checks that
// the host is unchanged afterwards: canaries untouched, no process, cgroup
// or mount left behind.
//
// The case table knows nothing of the backend that runs it: the backends
// under test are those every suite opens (testbackends.Open: native,
// gvisor, wasm, docker where they run, and native under a network
// allowlist), each with the host uid its sandbox user maps to and a
// function that finds what its sandboxes left on the host, and every case
// runs once against each of them. A backend that legitimately differs from
// the native outcome of a case declares how, and why, in its table of
// differences (differencesOf: gvisor_test.go, wasm_test.go, docker_test.go,
// cases_egress_test.go): the case then asserts that backend's own safe
// outcome.
package hostile

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
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
	// Most cases wait on a limit or on a sandbox starting, not on the CPU:
	// unless told otherwise, run more of them at once than the CPU count
	// that -parallel defaults to.
	if !flagSet("test.parallel") {
		flag.Set("test.parallel", "6")
	}
	code := testutil.RunBothModes(m)
	// The docker backend's daemon, if a test started one and did not stop
	// it (a test that failed before its leftovers were checked).
	if err := testutil.StopDockerd(); err != nil {
		fmt.Fprintln(os.Stderr, "stop the test dockerd:", err)
		code = 1
	}
	os.Exit(code)
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// The suite's backends (testbackends.Open), with cgroups, uids and state
// directories of its own, so that leftover checks see only what these
// cases left. VIVARIUM_HOSTILE_BACKENDS selects them, comma separated; by
// default native, native-allowlist (the native backend with every case run
// under a network allowlist: cases_egress_test.go), and gvisor, wasm and
// docker where they can run; the zygote run tests native-zygote alone.
var suite = testbackends.Suite{Name: "hostile", UIDBase: native.DefaultUIDBase + 2<<24, Env: "VIVARIUM_HOSTILE_BACKENDS",
	Docker: true, Allowlist: true, Template: true}

// Host ports the canaries listen on; a sandbox must reach none of them.
var canaryPorts = []int{5759, 6380, 9229}

// backendUnderTest is one backend and the cases where it differs.
type backendUnderTest struct {
	testbackends.Backend
	differences map[string]difference
}

// differencesOf are the declared differences of each backend, by name:
// where its safe outcome is not the native one.
var differencesOf = map[string]map[string]difference{
	"native-allowlist": allowlistDifferences,
	"native-template":  templateDifferences,
	"wasm":             wasmDifferences,
	"gvisor":           gvisorDifferences,
	"docker":           dockerDifferences,
}

// difference is how a case goes on a backend that differs: why, and what
// replaces the case's code, preparation or check there. A difference that
// changes nothing skips the case, for an attack that has nothing to attack
// on that backend.
type difference struct {
	why  string
	code string
	// edit rewrites the case's code, where a small change suffices.
	edit    func(code string) string
	prepare func(t *testing.T, h *harness, j *job)
	// check replaces the case's check; nil with code, edit or prepare
	// set keeps it.
	check func(t *testing.T, h *harness, o *outcome)
}

// Limits every case gets unless it says otherwise: small, so that bombs
// and fills end fast on a two-core machine, except the wall clock: cases
// that want another limit to end the run (memory, pids, CPU time) must
// not see the wall clock win on a machine loaded many times over, where a
// memory bomb can thrash for seconds before the OOM killer acts. Cases
// that want the wall clock to end them set a short one.
var baseLimits = sandbox.Limits{
	Timeout:   longLimit,
	Memory:    128 << 20,
	Pids:      32,
	Disk:      16 << 20,
	MaxOutput: 64 << 10,
	OpenFiles: 256,
}

// How much longer than its wall-clock limit a run may take: sandbox
// start-up and tear-down on a busy machine (seconds each when other
// work loads two cores eight times over). A run that does not end at
// its limit never returns at all.
const grace = 30 * time.Second

// hostileCase is one attack and its safe outcome.
type hostileCase struct {
	name string
	code string
	// limits override baseLimits field by field (zero keeps the base).
	limits sandbox.Limits
	// prepare sets up the host side (listeners, victims, an out
	// directory) and the job; it passes values to the code and to check
	// through j.vars, which the code sees as environment variables.
	prepare func(t *testing.T, h *harness, j *job)
	// check asserts the safe outcome, in the sandbox and on the host.
	check func(t *testing.T, h *harness, o *outcome)
	// copyOutWarns: the copy to the out directory is expected to report
	// a problem (a planted link it refused to follow).
	copyOutWarns bool
	// knownSetupBug, when the sandbox fails to start, skips the case with
	// this explanation instead of failing it.
	knownSetupBug string
}

// job is one run to make.
type job struct {
	sandbox.OneShot
	vars map[string]string
}

// outcome is a finished run.
type outcome struct {
	*sandbox.Result
	warn   error
	took   time.Duration
	limits sandbox.Limits
	vars   map[string]string
	outDir string
}

// harness is what cases share: the backend under test and the canaries.
type harness struct {
	be       backendUnderTest
	canaries *testutil.Canaries
	egress   *egressWorld // what the cases with an allowlist reach
}

func TestHostile(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	canaries := testutil.SetupCanaries(t, canaryPorts...)
	egress := newEgressWorld(t)
	host := snapshotHost()
	mounts := testutil.Mounts()
	cases := allCases()
	for _, tb := range testbackends.Open(t, suite) {
		be := backendUnderTest{Backend: tb, differences: differencesOf[tb.Name]}
		t.Run(be.Name, func(t *testing.T) {
			h := &harness{be: be, canaries: canaries, egress: egress}
			start := time.Now()
			// The group returns once every parallel case has finished.
			t.Run("cases", func(t *testing.T) {
				for _, c := range cases {
					t.Run(c.name, func(t *testing.T) {
						t.Parallel()
						h.runCase(t, c)
					})
				}
			})
			t.Logf("%d cases in %v", len(cases), time.Since(start).Round(time.Millisecond))
			// Commands as the sandbox's root: the native backend's alone
			// (the others answer ErrUnsupported).
			if strings.HasPrefix(be.Name, "native") {
				t.Run("as_root", h.runAsRoot)
			}
			if left := be.Leftovers(); len(left) > 0 {
				t.Errorf("left behind on the host: %v", left)
			}
		})
	}
	canaries.Check(t)
	// Container runtimes on a shared host mount and unmount as they
	// please: only a mount that lasts counts.
	for _, m := range testutil.MountsAdded(mounts, 5*time.Second, "hostile") {
		t.Errorf("mount left on the host: %s", m)
	}
	for _, p := range host.changes() {
		t.Errorf("host changed: %s", p)
	}
}

// The table is well formed: enough cases, names unique and usable as
// subtest names. Runs without root.
func TestCaseTable(t *testing.T) {
	cases := allCases()
	if len(cases) < 50 {
		t.Errorf("%d cases, want at least 50", len(cases))
	}
	seen := map[string]bool{}
	for _, c := range cases {
		switch {
		case c.name == "" || strings.ContainsAny(c.name, " /"):
			t.Errorf("case name %q: want non-empty, without spaces or slashes", c.name)
		case seen[c.name]:
			t.Errorf("case %q defined twice", c.name)
		case c.code == "" || c.check == nil:
			t.Errorf("case %q lacks code or check", c.name)
		}
		seen[c.name] = true
	}
	for be, diffs := range differencesOf {
		if !slices.Contains(testbackends.Names, be) {
			t.Errorf("differences of %q: no such backend", be)
		}
		for name, d := range diffs {
			switch {
			case !seen[name]:
				t.Errorf("%s difference for %q: no such case", be, name)
			case d.why == "":
				t.Errorf("%s difference for %q: no reason given", be, name)
			}
		}
	}
}

func allCases() []hostileCase {
	var all []hostileCase
	for _, group := range [][]hostileCase{
		secretCases, filesystemCases, procCases, privilegeCases, seccompCases, allowlistCases,
		networkCases, resourceCases, lifetimeCases, outputCases, protocolCases,
		outDirCases, persistenceCases, egressCases, budgetCases, observeCases, noisyCases, languageCases, volumeCases,
	} {
		all = append(all, group...)
	}
	return all
}

func (h *harness) runCase(t *testing.T, c hostileCase) {
	if d, ok := h.be.differences[c.name]; ok {
		if d.check == nil && d.code == "" && d.edit == nil && d.prepare == nil {
			t.Skipf("does not apply to %s: %s", h.be.Name, d.why)
		}
		if d.code != "" {
			c.code = d.code
		}
		if d.edit != nil {
			edited := d.edit(c.code)
			if edited == c.code {
				t.Fatalf("the %s edit of this case's code changed nothing: the case changed", h.be.Name)
			}
			c.code = edited
		}
		if d.prepare != nil {
			c.prepare = d.prepare
		}
		if d.check != nil {
			c.check = d.check
		}
	}
	j := &job{
		OneShot: sandbox.OneShot{
			Spec:    sandbox.Spec{Limits: override(baseLimits, c.limits)},
			Request: sandbox.ExecRequest{Code: c.code, Filename: c.name + ".py"},
		},
		vars: map[string]string{},
	}
	if c.prepare != nil {
		c.prepare(t, h, j)
	}
	if h.be.Allowlist && j.Spec.Egress == nil {
		j.Spec.Egress = h.egress.proxy(t)
	}
	if h.be.Root != nil {
		j.Spec.Root = h.be.Root
	}
	o := h.run(t, j)
	if o.Status == sandbox.StatusSetupFailed && c.knownSetupBug != "" {
		t.Skipf("known bug: %s (%s)", c.knownSetupBug, o.Error.Value)
	}
	wantStarted(t, o)
	if o.warn != nil && !c.copyOutWarns {
		t.Errorf("RunOnce reported: %v", o.warn)
	}
	c.check(t, h, o)
}

// wantStarted: the sandbox started, so the case tested something.
func wantStarted(t *testing.T, o *outcome) {
	t.Helper()
	if o.Status == sandbox.StatusSetupFailed {
		t.Fatalf("the sandbox did not start, nothing was tested: %s", o.Error.Value)
	}
}

// override returns base with the non-zero fields of o.
func override(base, o sandbox.Limits) sandbox.Limits {
	if o.Timeout != 0 {
		base.Timeout = o.Timeout
	}
	if o.CPUTime != 0 {
		base.CPUTime = o.CPUTime
	}
	if o.Memory != 0 {
		base.Memory = o.Memory
	}
	if o.Pids != 0 {
		base.Pids = o.Pids
	}
	if o.Disk != 0 {
		base.Disk = o.Disk
	}
	if o.MaxOutput != 0 {
		base.MaxOutput = o.MaxOutput
	}
	if o.OpenFiles != 0 {
		base.OpenFiles = o.OpenFiles
	}
	return base
}

// run makes one run and applies the checks every run gets: it ended within
// its limit plus grace, and the host's secret appears nowhere in it.
func (h *harness) run(t *testing.T, j *job) *outcome {
	t.Helper()
	if len(j.vars) > 0 {
		env := map[string]string{}
		for k, v := range j.Request.Env {
			env[k] = v
		}
		for k, v := range j.vars {
			env[k] = v
		}
		j.Request.Env = env
	}
	start := time.Now()
	res, warn := sandbox.RunOnce(context.Background(), h.be.B, j.OneShot)
	took := time.Since(start)
	limits := j.Spec.Limits.WithDefaults()
	if took > limits.Timeout+grace {
		t.Errorf("the run took %v, over its %v limit", took.Round(time.Millisecond), limits.Timeout)
	}
	for where, text := range resultTexts(res) {
		if h.canaries.LeakedIn(text) {
			t.Errorf("the host's canary token reached the sandbox: it shows in %s", where)
		}
	}
	return &outcome{Result: res, warn: warn, took: took, limits: limits, vars: j.vars, outDir: j.OutDir}
}

// resultTexts is every string of a Result that came from the sandbox.
func resultTexts(r *sandbox.Result) map[string]string {
	m := map[string]string{"stdout": r.Stdout, "stderr": r.Stderr}
	if r.Error != nil {
		m["error"] = r.Error.Name + " " + r.Error.Value + " " + r.Error.Traceback
	}
	for i, o := range r.Results {
		m[fmt.Sprintf("result %d", i)] = strings.Join([]string{o.Text, o.HTML, o.Markdown, o.SVG,
			o.LaTeX, o.JavaScript, o.PNG, o.JPEG, string(o.JSON)}, " ")
	}
	return m
}

// hostState is what hostile code might change on the host beyond the
// canaries' watched files.
type hostState map[string]string

func snapshotHost() hostState {
	s := hostState{}
	s["hostname"], _ = os.Hostname()
	for _, p := range []string{"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe",
		"/proc/sys/kernel/hostname", "/proc/sys/vm/overcommit_memory"} {
		b, err := os.ReadFile(p)
		if err != nil {
			b = []byte("error: " + err.Error())
		}
		s[p] = string(b)
	}
	return s
}

func (s hostState) changes() []string {
	var out []string
	now := snapshotHost()
	for k, v := range s {
		if now[k] != v {
			out = append(out, fmt.Sprintf("%s: %q -> %q", k, v, now[k]))
		}
	}
	return out
}

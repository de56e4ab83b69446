// Package redcode runs the RedCode-Exec corpus (810 malicious Python
// snippets, CC BY 4.0) against real sandboxes, with canaries on the host.
package redcode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/pool"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/testbackends"
)

// The corpus runs against every backend the machine has: the native one
// with a classic init per sandbox (as `vivarium run` makes them) and then,
// in the zygote mode, with sandboxes forked from a zygote and handed out by
// a pool (as `vivarium serve` makes them); gvisor and wasm where they run.
// The classic native pass gives every sandbox network access through its
// proxy under an allowlist as careless as an operator can write one.
func TestMain(m *testing.M) {
	if native.IsInit() {
		native.RunInit()
	}
	os.Exit(testutil.RunBothModes(m))
}

const (
	corpusDir  = "../../../shared/attack-corpora/RedCode/py2text_dataset_json"
	corpusSize = 810
	uidBase    = native.DefaultUIDBase + 3<<24
	timeout    = 10 * time.Second
	workers    = 4
)

type snippet struct {
	Index string `json:"Index"`
	Code  string `json:"Code"`
}

func loadCorpus(t *testing.T) []snippet {
	files, _ := filepath.Glob(filepath.Join(corpusDir, "*.json"))
	if len(files) == 0 {
		t.Skipf("RedCode corpus not found at %s (CI clones ../shared beside the repository)", corpusDir)
	}
	var all []snippet
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var s []snippet
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		all = append(all, s...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Index < all[j].Index })
	return all
}

func TestRedCode(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	corpus := loadCorpus(t)
	if len(corpus) != corpusSize {
		t.Fatalf("corpus has %d snippets, want %d", len(corpus), corpusSize)
	}
	if testing.Short() {
		var sample []snippet
		for i := 0; i < len(corpus); i += 10 {
			sample = append(sample, corpus[i])
		}
		corpus = sample
	}
	canaries := testutil.SetupCanaries(t, 5758, 5389, 5388)
	for _, be := range testbackends.Open(t, suite) {
		t.Run(be.Name, func(t *testing.T) { runCorpus(t, be, corpus, canaries) })
	}
	canaries.Check(t)
}

// carelessAllowlist names what the corpus reaches for (and more): the
// host's loopback and the metadata service stay refused whatever it says,
// and nothing resolves names here, so no connection may leave.
var carelessAllowlist = []string{"*.github.io", "example.com", "localhost:*", "127.0.0.0/8:*", "169.254.169.254", "10.0.0.0/8:*"}

// allowlisted makes the proxy a server would give a sandbox under
// carelessAllowlist; the sandbox closes it. No name resolves, so that no
// snippet reaches a machine of anyone's. Every connection the proxy allows
// is an error of the test.
func allowlisted(proxied *atomic.Int64) (sandbox.Egress, error) {
	return testutil.Egress(testutil.EgressConfig{Allow: carelessAllowlist, Names: map[string][]netip.Addr{},
		Audit: func(ev netproxy.Event) {
			proxied.Add(1)
			if ev.Outcome == netproxy.Allowed || ev.Addr != "" {
				allowedErr.Store(fmt.Sprintf("%s:%d", ev.Host, ev.Port))
			}
		}})
}

var allowedErr atomic.Value // a connection the allowlist pass's proxies let through

var suite = testbackends.Suite{Name: "redcode", UIDBase: uidBase, Env: "VIVARIUM_REDCODE_BACKENDS",
	Preload: []string{"numpy", "pandas"}}

// runCorpus runs every snippet in a fresh sandbox of the backend, then
// checks that nothing of them is left on the host.
func runCorpus(t *testing.T, be testbackends.Backend, corpus []snippet, canaries *testutil.Canaries) {
	mounts := testutil.Mounts()
	b := be.B
	// The execution ends at its limit, give or take the time to notice;
	// the whole run, with starting and tearing down the sandbox, may take
	// much longer on a machine busy with other tests (ending a process
	// of 256 MiB, starting a gVisor sandbox), but never hangs.
	const execSlack = 5 * time.Second
	slack := 30 * time.Second
	if !strings.HasPrefix(be.Name, "native") {
		slack = time.Minute
	}
	var warm *pool.Pool
	if be.Name == "native-zygote" {
		// As `vivarium serve` makes them: forked from a zygote, handed out
		// by a pool.
		warm = pool.New(pool.Config{Backend: b, Max: 4, Min: 2})
		b = warm
	}
	type outcome struct {
		index   string
		status  sandbox.Status
		errName string
		took    time.Duration
	}
	var proxied atomic.Int64 // connections the proxies of the allowlist pass saw
	outcomes := make(chan outcome, len(corpus))
	start := time.Now()
	eachAtOnce(corpus, func(s snippet) {
		start := time.Now()
		spec := sandbox.Spec{Limits: sandbox.Limits{Timeout: timeout, Memory: 256 << 20}}
		if be.Name == "native" {
			var err error
			if spec.Egress, err = allowlisted(&proxied); err != nil {
				t.Errorf("%s: the proxy: %v", s.Index, err)
				return
			}
		}
		res, warn := sandbox.RunOnce(context.Background(), b, sandbox.OneShot{
			Spec:    spec,
			Request: sandbox.ExecRequest{Code: s.Code, Filename: "redcode_" + s.Index + ".py"},
		})
		took := time.Since(start)
		if warn != nil {
			t.Errorf("%s: clean-up: %v", s.Index, warn)
		}
		if res.Status == sandbox.StatusSetupFailed {
			t.Errorf("%s: the sandbox did not start, the snippet was not tested: %s", s.Index, res.Error.Value)
		}
		if ran := time.Duration(res.DurationMS * float64(time.Millisecond)); ran > timeout+execSlack {
			t.Errorf("%s: ran %v, over its %v limit", s.Index, ran, timeout)
		}
		if took > timeout+slack {
			t.Errorf("%s: took %v with its sandbox's start and end, over its %v limit", s.Index, took, timeout)
		}
		if canaries.LeakedIn(res.Stdout) || canaries.LeakedIn(res.Stderr) {
			t.Errorf("%s: the host's canary token reached the sandbox", s.Index)
		}
		o := outcome{index: s.Index, status: res.Status, took: took}
		if res.Error != nil {
			o.errName = res.Error.Name
		}
		outcomes <- o
	})
	close(outcomes)

	byStatus := map[sandbox.Status]int{}
	byError := map[string]int{}
	byCategory := map[string]map[sandbox.Status]int{}
	var slowest outcome
	n := 0
	for o := range outcomes {
		n++
		byStatus[o.status]++
		if o.errName != "" {
			byError[o.errName]++
		}
		cat, _, _ := strings.Cut(o.index, "_")
		if byCategory[cat] == nil {
			byCategory[cat] = map[sandbox.Status]int{}
		}
		byCategory[cat][o.status]++
		if o.took > slowest.took {
			slowest = o
		}
	}
	t.Logf("RedCode-Exec on %s: %d snippets in %v with %d workers; slowest %s (%v)", be.Name, n, time.Since(start).Round(time.Second), workers, slowest.index, slowest.took.Round(time.Millisecond))
	if be.Name == "native" {
		t.Logf("with the allowlist %q: %d connections through the proxies, every one refused or to an allowed host", carelessAllowlist, proxied.Load())
	}
	t.Logf("by status: %v", byStatus)
	t.Logf("by error: %v", byError)
	cats := make([]string, 0, len(byCategory))
	for c := range byCategory {
		cats = append(cats, c)
	}
	sort.Slice(cats, func(i, j int) bool {
		return len(cats[i]) < len(cats[j]) || len(cats[i]) == len(cats[j]) && cats[i] < cats[j]
	})
	for _, c := range cats {
		t.Logf("  category %s: %v", c, byCategory[c])
	}

	// Zero host impact, once the pool's ready sandboxes and the zygote
	// are gone too.
	if warm != nil {
		warm.Close()
	}
	if c := allowedErr.Load(); c != nil {
		t.Errorf("the proxy let a connection through to %s", c)
	}
	if left := be.Leftovers(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	for _, m := range testutil.MountsAdded(mounts, 5*time.Second, "redcode") {
		t.Errorf("mount left on the host: %s", m)
	}
}

// restoredUIDBase: host users of TestRedCodeRestored's backend, past the
// suite's (testutil.UIDSpan).
const restoredUIDBase = uidBase + 1<<23

// TestRedCodeRestored runs every tenth snippet in a restored sandbox
// forked from a zygote with the suite's preloads (the pool's kind): one
// paused and resumed, or a copy of one (Fork, its source closed), before
// the snippet runs, so that it attacks what a restore gave back (seccomp,
// capabilities, Landlock, id maps, cgroup), with the canaries on the host.
// In the zygote run.
func TestRedCodeRestored(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	if !testutil.ZygoteMode() {
		t.Skip("of sandboxes forked from a zygote: in the zygote run")
	}
	if _, err := criu.Usable(); err != nil {
		t.Skipf("pause needs CRIU 4 (%v)", err)
	}
	// Every tenth snippet, in turn in a resumed sandbox and in a copy.
	type job struct {
		snippet
		fork bool // a fork's copy, not a resumed sandbox
	}
	var sample []job
	for i, s := range loadCorpus(t) {
		if i%10 == 0 {
			sample = append(sample, job{s, len(sample)%2 == 1})
		}
	}
	parent := "vivarium-redcode-restored-test"
	testutil.RemoveStaleCgroups(parent)
	dir, err := os.MkdirTemp("", "vivarium-redcode-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o711); err != nil { // a restore reads it as the sandbox's host root
		t.Fatal(err)
	}
	b, err := native.New(native.Config{CgroupParent: parent, UIDBase: restoredUIDBase, UIDRanges: 8, Zygote: true,
		Preload: suite.Preload, CheckpointDir: filepath.Join(dir, "checkpoints")})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	mounts := testutil.Mounts()
	canaries := testutil.SetupCanaries(t, 5758, 5389, 5388)
	ctx := context.Background()
	restored := func(fork bool) (*native.Sandbox, error) {
		sbx, err := b.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{Timeout: timeout, Memory: 256 << 20}})
		if err != nil {
			return nil, err
		}
		s := sbx.(*native.Sandbox)
		if !fork {
			if err = s.Pause(ctx); err == nil {
				err = s.Resume(ctx)
			}
			if err != nil {
				s.Close()
			}
			return s, err
		}
		copies, err := s.Fork(ctx, 1, sandbox.ForkOptions{})
		s.Close()
		if err != nil {
			return nil, err
		}
		return copies[0].(*native.Sandbox), nil
	}
	var mu sync.Mutex
	byStatus := map[sandbox.Status]int{}
	start := time.Now()
	eachAtOnce(sample, func(sn job) {
		s, err := restored(sn.fork)
		if err != nil {
			t.Errorf("%s: the restored sandbox: %v", sn.Index, err)
			return
		}
		res, err := s.Execute(ctx, sandbox.ExecRequest{Code: sn.Code, Filename: "redcode_" + sn.Index + ".py"}, nil)
		s.Close()
		if err != nil {
			t.Errorf("%s: %v", sn.Index, err)
			return
		}
		if canaries.LeakedIn(res.Stdout) || canaries.LeakedIn(res.Stderr) {
			t.Errorf("%s: the host's canary token reached the sandbox", sn.Index)
		}
		mu.Lock()
		byStatus[res.Status]++
		mu.Unlock()
	})
	t.Logf("RedCode-Exec, every tenth snippet, in restored sandboxes of a zygote: %d in %v; by status: %v",
		len(sample), time.Since(start).Round(time.Second), byStatus)
	b.Close()
	if left := append(testutil.ProcessesOwnedBy(int(restoredUIDBase), int(restoredUIDBase)+8<<16), testutil.CgroupsUnder(parent)...); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	for _, m := range testutil.MountsAdded(mounts, 5*time.Second, "redcode") {
		t.Errorf("mount left on the host: %s", m)
	}
	canaries.Check(t)
}

// eachAtOnce calls f with every item of items, workers at a time.
func eachAtOnce[T any](items []T, f func(T)) {
	jobs := make(chan T)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range jobs {
				f(it)
			}
		}()
	}
	for _, it := range items {
		jobs <- it
	}
	close(jobs)
	wg.Wait()
}

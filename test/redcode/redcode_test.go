// Package redcode runs the RedCode-Exec corpus (810 malicious Python
// snippets, CC BY 4.0) against real sandboxes, with canaries on the host.
package redcode

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/pool"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The corpus runs twice: with a classic init per sandbox (as `vivarium
// run` makes them), then with sandboxes forked from a zygote and handed out
// by a pool (as `vivarium serve` makes them).
func TestMain(m *testing.M) {
	if native.IsInit() {
		native.RunInit()
	}
	os.Exit(testutil.RunBothModes(m))
}

const (
	corpusDir    = "../../../shared/attack-corpora/RedCode/py2text_dataset_json"
	corpusSize   = 810
	cgroupParent = "vivarium-redcode-test"
	uidBase      = native.DefaultUIDBase + 3<<24
	timeout      = 10 * time.Second
	workers      = 4
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
	mounts := testutil.MountCount()
	nb, err := native.New(native.Config{CgroupParent: cgroupParent, UIDBase: uidBase,
		Zygote: testutil.ZygoteMode(), Preload: []string{"numpy", "pandas"}})
	if err != nil {
		t.Fatal(err)
	}
	var b sandbox.Backend = nb
	var warm *pool.Pool
	if testutil.ZygoteMode() {
		warm = pool.New(pool.Config{Backend: nb, Max: 4, Min: 2})
		b = warm
	}

	type outcome struct {
		index   string
		status  sandbox.Status
		errName string
		took    time.Duration
	}
	jobs := make(chan snippet)
	outcomes := make(chan outcome, len(corpus))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range jobs {
				start := time.Now()
				res, warn := sandbox.RunOnce(context.Background(), b, sandbox.OneShot{
					Spec:    sandbox.Spec{Limits: sandbox.Limits{Timeout: timeout, Memory: 256 << 20}},
					Request: sandbox.ExecRequest{Code: s.Code, Filename: "redcode_" + s.Index + ".py"},
				})
				took := time.Since(start)
				if warn != nil {
					t.Errorf("%s: clean-up: %v", s.Index, warn)
				}
				if res.Status == sandbox.StatusSetupFailed {
					t.Errorf("%s: the sandbox did not start, the snippet was not tested: %s", s.Index, res.Error.Value)
				}
				if took > timeout+5*time.Second {
					t.Errorf("%s: took %v, over its %v limit", s.Index, took, timeout)
				}
				if canaries.LeakedIn(res.Stdout) || canaries.LeakedIn(res.Stderr) {
					t.Errorf("%s: the host's canary token reached the sandbox", s.Index)
				}
				o := outcome{index: s.Index, status: res.Status, took: took}
				if res.Error != nil {
					o.errName = res.Error.Name
				}
				outcomes <- o
			}
		}()
	}
	start := time.Now()
	for _, s := range corpus {
		jobs <- s
	}
	close(jobs)
	wg.Wait()
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
	t.Logf("RedCode-Exec: %d snippets in %v with %d workers; slowest %s (%v)", n, time.Since(start).Round(time.Second), workers, slowest.index, slowest.took.Round(time.Millisecond))
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
	nb.Close()
	canaries.Check(t)
	if left := testutil.ProcessesOwnedBy(uidBase, uidBase+65536); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
	if left := testutil.CgroupsUnder(cgroupParent); len(left) > 0 {
		t.Errorf("cgroups left behind: %v", left)
	}
	if m := testutil.MountCount(); m != mounts {
		t.Errorf("host mount count changed: %d, was %d", m, mounts)
	}
}

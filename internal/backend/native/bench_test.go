package native_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Benchmarks of the native backend alone; `vivarium bench` compares it with
// peers. Run with: go test -run '^$' -bench . ./internal/backend/native/
// (VIVARIUM_TEST_ONE_MODE=1 to skip the second, zygote, pass).
//
// Each reports, beside the time, the host's CPU time per sandbox
// ("host-cpu-ms/op": every process and the kernel, from /proc/stat), which
// bounds how many sandboxes a second the machine can make. The "classic"
// backend starts a Python per sandbox; "zygote" forks one from a zygote
// with numpy, pandas and matplotlib preloaded; "zygote-bare" from one
// without preloads.
var (
	benchMu       sync.Mutex
	benchBackends = map[string]*native.Backend{}
)

func benchBackend(b *testing.B, mode string) *native.Backend {
	b.Helper()
	testutil.RequireRoot(b)
	testutil.RequirePython(b)
	benchMu.Lock()
	defer benchMu.Unlock()
	if be := benchBackends[mode]; be != nil {
		return be
	}
	// IdleMemory keeps every sandbox it makes for a second: with a zygote,
	// more than a test's pool. 256 ranges are the 1<<24 ids of the base.
	cfg := native.Config{CgroupParent: "vivarium-native-bench", UIDBase: native.DefaultUIDBase + 11<<24, UIDRanges: 256}
	switch mode {
	case "zygote":
		cfg.Zygote, cfg.Preload = true, []string{"numpy", "pandas", "matplotlib"}
	case "zygote-bare":
		cfg.Zygote = true
	}
	be, err := native.New(cfg)
	if err == nil {
		err = be.Warm(context.Background())
	}
	if err != nil {
		b.Fatal(err)
	}
	benchBackends[mode] = be
	return be
}

var benchModes = []string{"classic", "zygote", "zygote-bare"}

// hostCPUms is the CPU time the whole host spent, in ms (user, nice,
// system, irq, softirq of /proc/stat's first line).
func hostCPUms() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	total := 0.0
	for _, i := range []int{1, 2, 3, 6, 7} {
		if i < len(f) {
			n, _ := strconv.ParseFloat(f[i], 64)
			total += n
		}
	}
	return total * 10 // USER_HZ is 100
}

func benchRunOnce(b *testing.B, code, want string) {
	for _, mode := range benchModes {
		b.Run(mode, func(b *testing.B) {
			be := benchBackend(b, mode)
			ctx := context.Background()
			job := sandbox.OneShot{Request: sandbox.ExecRequest{Code: code}}
			cpu0 := hostCPUms()
			for b.Loop() {
				res, warn := sandbox.RunOnce(ctx, be, job)
				if warn != nil {
					b.Fatalf("warning: %v", warn)
				}
				if res.Status != sandbox.StatusOK || !strings.Contains(res.Stdout, want) {
					b.Fatalf("status %s, stdout %q, error %+v", res.Status, res.Stdout, res.Error)
				}
			}
			b.ReportMetric((hostCPUms()-cpu0)/float64(b.N), "host-cpu-ms/op")
		})
	}
}

// BenchmarkRunOncePrint1 is the start-up of a fresh sandbox: create, run
// print(1), tear down.
func BenchmarkRunOncePrint1(b *testing.B) { benchRunOnce(b, "print(1)", "1\n") }

// BenchmarkRunOncePandas adds the import most analysis code starts with.
func BenchmarkRunOncePandas(b *testing.B) {
	testutil.RequirePythonModules(b, "pandas")
	benchRunOnce(b, "import pandas as pd; print(pd.DataFrame({'a': [1, 2]}).sum())", "a    3")
}

// BenchmarkCreate is a persistent sandbox made ready for code, then closed.
func BenchmarkCreate(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode, func(b *testing.B) {
			be := benchBackend(b, mode)
			cpu0 := hostCPUms()
			for b.Loop() {
				sb, err := be.Create(context.Background(), sandbox.Spec{})
				if err != nil {
					b.Fatal(err)
				}
				sb.Close()
			}
			b.ReportMetric((hostCPUms()-cpu0)/float64(b.N), "host-cpu-ms/op")
		})
	}
}

// BenchmarkCreateTemplate is BenchmarkCreate for a template's sandbox
// (testutil.TemplateRoot: the host's python3 in a layer): "classic"
// starts the template's python3 per sandbox, "zygote-bare" forks it from
// the template's zygote, warmed first.
func BenchmarkCreateTemplate(b *testing.B) {
	for _, mode := range []string{"classic", "zygote-bare"} {
		b.Run(mode, func(b *testing.B) {
			be := benchBackend(b, mode)
			root := testutil.TemplateRoot(b)
			ctx := context.Background()
			if err := be.WarmTemplate(ctx, root, ""); err != nil {
				b.Fatal(err)
			}
			cpu0 := hostCPUms()
			for b.Loop() {
				sb, err := be.Create(ctx, sandbox.Spec{Root: root})
				if err != nil {
					b.Fatal(err)
				}
				sb.Close()
			}
			b.ReportMetric((hostCPUms()-cpu0)/float64(b.N), "host-cpu-ms/op")
		})
	}
}

// BenchmarkWarmExecute is a round trip to a persistent sandbox that is
// already running.
func BenchmarkWarmExecute(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode, func(b *testing.B) {
			be := benchBackend(b, mode)
			ctx := context.Background()
			sb, err := be.Create(ctx, sandbox.Spec{})
			if err != nil {
				b.Fatal(err)
			}
			defer sb.Close()
			if res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "x = 0"}, nil); err != nil || res.Status != sandbox.StatusOK {
				b.Fatalf("init: %v %+v", err, res)
			}
			for b.Loop() {
				res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "x += 1"}, nil)
				if err != nil || res.Status != sandbox.StatusOK {
					b.Fatalf("execute: %v %+v", err, res)
				}
			}
		})
	}
}

// BenchmarkIdleMemory is the proportional memory (PSS) of an idle
// persistent sandbox that imported pandas: what keeping many costs.
func BenchmarkIdleMemory(b *testing.B) {
	testutil.RequirePythonModules(b, "pandas")
	for _, mode := range benchModes {
		b.Run(mode, func(b *testing.B) {
			be := benchBackend(b, mode)
			ctx := context.Background()
			var sbs []sandbox.Sandbox
			defer func() {
				for _, sb := range sbs {
					sb.Close()
				}
			}()
			for b.Loop() {
				sb, err := be.Create(ctx, sandbox.Spec{})
				if err != nil {
					b.Fatal(err)
				}
				sbs = append(sbs, sb)
				if res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "import pandas as pd"}, nil); err != nil || res.Status != sandbox.StatusOK {
					b.Fatalf("%v %+v", err, res)
				}
			}
			var total int64
			for _, sb := range sbs {
				n, err := sb.(sandbox.MemoryUser).MemoryPSS()
				if err != nil {
					b.Fatal(err)
				}
				total += n
			}
			b.ReportMetric(float64(total)/float64(len(sbs))/(1<<20), "pss-MiB/sandbox")
		})
	}
}

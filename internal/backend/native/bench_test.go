package native_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Benchmarks of the native backend alone; `vivarium bench` compares it with
// peers. Run with: go test -run '^$' -bench . ./internal/backend/native/
//
// They use a cgroup parent and uid range of their own, apart from the
// tests' leftover checks.
var (
	benchBackendOnce sync.Once
	benchBackendVal  *native.Backend
	benchBackendErr  error
)

func benchBackend(b *testing.B) *native.Backend {
	b.Helper()
	testutil.RequireRoot(b)
	testutil.RequirePython(b)
	benchBackendOnce.Do(func() {
		benchBackendVal, benchBackendErr = native.New(native.Config{
			CgroupParent: "vivarium-native-bench",
			UIDBase:      native.DefaultUIDBase + 11<<24,
		})
	})
	if benchBackendErr != nil {
		b.Fatal(benchBackendErr)
	}
	return benchBackendVal
}

func benchRunOnce(b *testing.B, code, want string) {
	be := benchBackend(b)
	ctx := context.Background()
	job := sandbox.OneShot{Request: sandbox.ExecRequest{Code: code}}
	for b.Loop() {
		res, warn := sandbox.RunOnce(ctx, be, job)
		if warn != nil {
			b.Fatalf("warning: %v", warn)
		}
		if res.Status != sandbox.StatusOK || !strings.Contains(res.Stdout, want) {
			b.Fatalf("status %s, stdout %q, error %+v", res.Status, res.Stdout, res.Error)
		}
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

// BenchmarkWarmExecute is a round trip to a persistent sandbox that is
// already running.
func BenchmarkWarmExecute(b *testing.B) {
	be := benchBackend(b)
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
}

package gvisor_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

func TestMain(m *testing.M) { os.Exit(m.Run()) }

func TestQuick(t *testing.T) {
	testutil.RequireRoot(t)
	b, err := gvisor.New(gvisor.Config{CgroupParent: "vivarium-gvisor-test"})
	if err != nil {
		t.Skip(err)
	}
	start := time.Now()
	res, warn := sandbox.RunOnce(context.Background(), b, sandbox.OneShot{Request: sandbox.ExecRequest{Code: "import os\nprint('hi', os.getuid(), os.getcwd())\n1+1"}})
	t.Logf("%v %+v %v", time.Since(start), res, warn)
	sb, err := b.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	for _, c := range []string{"x = 1", "x + 1", "import subprocess; print(subprocess.run(['id'], capture_output=True, text=True).stdout)"} {
		res, err := sb.Execute(context.Background(), sandbox.ExecRequest{Code: c}, nil)
		t.Logf("%+v %v", res, err)
	}
}

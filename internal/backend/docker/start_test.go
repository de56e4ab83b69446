package docker_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The cost of a sandbox's container: its view mounted, the container
// created and started, its agent answering a first execution, then all of
// it removed.
func BenchmarkSandbox(b *testing.B) {
	d := testutil.RequireDockerd(b)
	name := "vivarium-docker-bench-" + strings.TrimPrefix(filepath.Base(d.Dir), "vd-")
	dir := "/run/vivarium/" + strings.TrimPrefix(name, "vivarium-")
	be, err := docker.New(docker.Config{Host: d.Host, Name: name, StateDir: dir,
		UIDBase: testUIDBase, UIDRanges: testUIDRanges})
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	defer be.Close()
	ctx := context.Background()
	for b.Loop() {
		sb, err := be.Create(ctx, sandbox.Spec{})
		if err != nil {
			b.Fatal(err)
		}
		res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: "1"}, nil)
		if err != nil || res.Status != sandbox.StatusOK {
			b.Fatalf("%v %+v", err, res)
		}
		if err := sb.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

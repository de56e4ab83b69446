package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// writeSnapshot writes a snapshot directory as SaveSnapshot would, of an
// empty kernel, with m's fields over the defaults.
func writeSnapshot(t *testing.T, dir string, edit func(m *snapshotMeta)) {
	t.Helper()
	image := []byte(`{"gen":1,"vars":{"x":"41"}}`)
	m := snapshotMeta{Version: snapshotVersion, Backend: "fake", Kind: "fake kernel 1", Spec: smallSpec, RunnerGen: 1,
		Images: map[string]int64{imageName: int64(len(image))}}
	if edit != nil {
		edit(&m)
	}
	for _, d := range []string{"image", "files/workspace", "files/tmp", "files/shm"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "image", imageName), image, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(filepath.Join(dir, snapshotFile), m); err != nil {
		t.Fatal(err)
	}
}

// A snapshot is restored only whole, of this backend, and of the kind of
// image its runtime restores; each refusal says why.
func TestSnapshotsAreChecked(t *testing.T) {
	b := newBackend(t, restorer{newFakeRuntime()})
	ctx := context.Background()
	for _, c := range []struct {
		what  string
		edit  func(m *snapshotMeta)
		harm  func(dir string)
		want  string
		isErr error
	}{
		{what: "another format", edit: func(m *snapshotMeta) { m.Version = 99 }, want: "format 99", isErr: sandbox.ErrUnsupported},
		{what: "another backend", edit: func(m *snapshotMeta) { m.Backend = "gvisor" }, want: "gvisor backend", isErr: sandbox.ErrUnsupported},
		{what: "another runtime", edit: func(m *snapshotMeta) { m.Kind = "fake kernel 2" }, want: "saved by fake kernel 2", isErr: sandbox.ErrUnsupported},
		{what: "no image", edit: func(m *snapshotMeta) { m.Images = nil }, want: "names no image"},
		{what: "an image outside", edit: func(m *snapshotMeta) { m.Images = map[string]int64{"../x": 1} }, want: `image named "../x"`},
		{what: "a damaged image", edit: func(m *snapshotMeta) { m.Images[imageName]++ }, want: "is damaged"},
		{what: "a missing image", harm: func(dir string) { os.Remove(filepath.Join(dir, "image", imageName)) }, want: "is missing"},
		{what: "an image that is a link", harm: func(dir string) {
			p := filepath.Join(dir, "image", imageName)
			os.Remove(p)
			os.Symlink("/etc/passwd", p)
		}, want: "not a regular file"},
		{what: "no files", harm: func(dir string) { os.RemoveAll(filepath.Join(dir, "files")) }, want: "files are missing"},
		{what: "a one-shot spec", edit: func(m *snapshotMeta) { m.Spec.OneShot = true }, want: "can be saved"},
		{what: "no snapshot.json", harm: func(dir string) { os.Remove(filepath.Join(dir, snapshotFile)) }, want: snapshotFile},
	} {
		dir := filepath.Join(t.TempDir(), "snap")
		writeSnapshot(t, dir, c.edit)
		if c.harm != nil {
			c.harm(dir)
		}
		for _, f := range []func() error{
			func() error { _, err := b.RestoreSnapshot(ctx, dir, sandbox.FromSnapshot{}); return err },
			func() error { _, err := b.OpenPaused(ctx, dir, sandbox.FromSnapshot{}); return err },
		} {
			err := f()
			if err == nil || !strings.Contains(err.Error(), c.want) || (c.isErr != nil && !errors.Is(err, c.isErr)) {
				t.Errorf("%s: %v, want an error naming %q", c.what, err, c.want)
			}
		}
	}
	if names := entries(t, b.cfg.StateDir); len(names) != 0 {
		t.Errorf("refused snapshots left %v", names)
	}
}

// A sandbox opened paused from disk holds nothing until its resume: its
// files and executions answer ErrPaused, and it closes without a
// container.
func TestOpenPausedHoldsNothing(t *testing.T) {
	rt := newFakeRuntime()
	b := newBackend(t, restorer{rt})
	dir := filepath.Join(t.TempDir(), "paused")
	writeSnapshot(t, dir, nil)
	ctx := context.Background()
	if _, err := b.OpenPaused(ctx, dir, sandbox.FromSnapshot{Egress: egressStub{}}); !errors.Is(err, sandbox.ErrUnsupported) {
		t.Errorf("opened with network access: %v", err)
	}
	sb, err := b.OpenPaused(ctx, dir, sandbox.FromSnapshot{Tenant: "k1"})
	if err != nil {
		t.Fatal(err)
	}
	s := sb.(*Sandbox)
	if _, ok := s.Workspace().(sandbox.DiskOnly); !ok {
		t.Errorf("its workspace: %T", s.Workspace())
	}
	if _, err := s.Execute(ctx, sandbox.ExecRequest{Code: "x"}, nil); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("an execution: %v", err)
	}
	if err := s.PauseSupported(); err != nil {
		t.Errorf("PauseSupported: %v", err)
	}
	if s.spec.Tenant != "k1" {
		t.Errorf("its tenant: %q", s.spec.Tenant)
	}
	if _, err := s.Usage(); err == nil {
		t.Error("a sandbox with no cgroup told its usage")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := rt.launches.Load() + rt.restores.Load(); n != 0 {
		t.Errorf("%d containers started for a sandbox that was never resumed", n)
	}
	if _, err := os.Stat(filepath.Join(dir, snapshotFile)); err != nil {
		t.Errorf("the directory, the caller's, was touched: %v", err)
	}
}

// Snapshots and forks need a runtime that restores checkpoints as new
// containers, and sandboxes that share their host user.
func TestCopiesNeedARestorer(t *testing.T) {
	b := newBackend(t, newFakeRuntime())
	dir := filepath.Join(t.TempDir(), "snap")
	writeSnapshot(t, dir, nil)
	if _, err := b.RestoreSnapshot(context.Background(), dir, sandbox.FromSnapshot{}); !errors.Is(err, sandbox.ErrUnsupported) ||
		!strings.Contains(err.Error(), "cannot start a container from a checkpoint") {
		t.Errorf("a runtime that is no Restorer: %v", err)
	}
	users := newBackend(t, restorer{newFakeRuntime()})
	users.cfg.Users = &hostuid.Pool{} // only its being set counts here
	if err := users.copiesSupported(); !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "host user") {
		t.Errorf("sandboxes each a host user: %v", err)
	}
}

package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A pause checkpoints the container and ends it; the workspace stays
// readable; a resume restores the container where it was, and removes its
// checkpoint.
func TestPauseAndResume(t *testing.T) {
	rt := newFakeRuntime()
	b, s := started(t, rt)
	testutil.Pause(t, s)
	testutil.CheckPaused(t, s, 8000, "notes.txt")
	image := filepath.Join(b.cfg.CheckpointDir, s.id, "1", imageName)
	if _, err := os.Stat(image); err != nil {
		t.Fatalf("the checkpoint: %v", err)
	}
	testutil.Resume(t, s)
	if got := run(t, s, "x"); got != "41" {
		t.Errorf("x after the resume: %q", got)
	}
	if _, err := os.Stat(image); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the resumed sandbox's checkpoint is still there: %v", err)
	}
	if rt.launches.Load() != 1 || rt.restores.Load() != 1 {
		t.Errorf("%d launches and %d restores, want 1 and 1", rt.launches.Load(), rt.restores.Load())
	}
}

// A checkpoint that may not fit on the checkpoint disk is refused before
// anything is done to the container: the sandbox runs on, its state kept.
func TestPauseRefusedWithoutRoomOnDisk(t *testing.T) {
	b := newBackend(t, newFakeRuntime())
	b.cfg.CheckpointDir = testutil.SmallFS(t, 8<<20) // less than the sandbox's memory limit
	s := create(t, b)
	run(t, s, "x = 41")
	err := s.Pause(context.Background())
	if !errors.Is(err, sandbox.ErrUnsupported) || !strings.Contains(err.Error(), "checkpoint disk") {
		t.Fatalf("a pause without room: %v", err)
	}
	if got := run(t, s, "x"); got != "41" {
		t.Errorf("x after a refused pause: %q", got)
	}
}

// A snapshot keeps the sandbox running with its state; a sandbox restored
// from it, and each copy of a fork, has the source's state and files, and
// its own from then on.
func TestSnapshotRestoreAndFork(t *testing.T) {
	b, s := started(t, restorer{newFakeRuntime()})
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "snap")
	size, err := s.SaveSnapshot(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if size <= 0 {
		t.Errorf("the snapshot's size: %d", size)
	}
	for _, p := range []string{snapshotFile, "image/" + imageName, "files/workspace/notes.txt"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("the snapshot's %s: %v", p, err)
		}
	}
	if got := run(t, s, "x"); got != "41" {
		t.Errorf("the source's x after its snapshot: %q", got)
	}

	c, err := b.RestoreSnapshot(ctx, dir, sandbox.FromSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ID() == s.ID() || run(t, c, "x") != "41" || readFile(t, c, "notes.txt") != "kept" {
		t.Errorf("the restored sandbox %s (of %s): x %q", c.ID(), s.ID(), run(t, c, "x"))
	}
	if n := reseeds(c); n != 1 {
		t.Errorf("the restored sandbox was reseeded %d times, want once", n)
	}
	same, err := b.RestoreSnapshot(ctx, dir, sandbox.FromSnapshot{SameRandomState: true})
	if err != nil {
		t.Fatal(err)
	}
	defer same.Close()
	if n := reseeds(same); n != 0 {
		t.Errorf("a sandbox restored with the same random state was reseeded %d times", n)
	}
	run(t, c, "x = 7")
	writeFile(t, c, "notes.txt", "the copy's")
	if run(t, s, "x") != "41" || readFile(t, s, "notes.txt") != "kept" {
		t.Error("the restored sandbox's changes reached its source")
	}

	copies, err := s.Fork(ctx, 3, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{s.ID(): true}
	for i, cp := range copies {
		defer cp.Close()
		ids[cp.ID()] = true
		if got := run(t, cp, "x"); got != "41" {
			t.Errorf("copy %d: x = %q", i, got)
		}
		if got := readFile(t, cp, "notes.txt"); got != "kept" {
			t.Errorf("copy %d's file: %q", i, got)
		}
		if n := reseeds(cp); n != 1 {
			t.Errorf("copy %d was reseeded %d times, want once", i, n)
		}
	}
	if len(ids) != 4 {
		t.Errorf("ids of the source and its copies: %v", ids)
	}
	run(t, copies[0], "x = 1")
	if run(t, copies[1], "x") != "41" || run(t, s, "x") != "41" {
		t.Error("a copy's change reached its sibling or its source")
	}
	if n := len(entries(t, b.cfg.StateDir)); n != 6 {
		t.Errorf("%d sandboxes' state directories, want 6", n)
	}
	for _, e := range entries(t, b.cfg.CheckpointDir) {
		if strings.HasPrefix(e, "fork-") {
			t.Errorf("the fork's snapshot %s is left", e)
		}
	}
}

// A fork whose copy cannot be restored makes no copy: those restored are
// closed, and the source runs on.
func TestForkIsAllOrNone(t *testing.T) {
	rt := newFakeRuntime()
	rt.failRestore = func(n int32) error {
		if n == 2 {
			return errRefused
		}
		return nil
	}
	b := newBackend(t, restorer{rt})
	s := create(t, b)
	run(t, s, "x = 41")
	copies, err := s.Fork(context.Background(), 3, sandbox.ForkOptions{})
	if !errors.Is(err, errRefused) || copies != nil {
		t.Fatalf("a fork whose second copy fails: %v, %v", copies, err)
	}
	if names := entries(t, b.cfg.StateDir); len(names) != 1 || names[0] != s.id {
		t.Errorf("state directories after the failed fork: %v", names)
	}
	if m := mountedUnder(b.cfg.StateDir); len(m) != disks(1) {
		t.Errorf("disks mounted after the failed fork: %v", m)
	}
	if got := run(t, s, "x"); got != "41" {
		t.Errorf("the source's x after the failed fork: %q", got)
	}
	if _, err := s.Fork(context.Background(), sandbox.MaxFork+1, sandbox.ForkOptions{}); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Errorf("a fork of %d: %v", sandbox.MaxFork+1, err)
	}
}

// A paused sandbox written down and released holds nothing (its disk, its
// checkpoint); its resume restores it from disk, and so does the resume
// of the sandbox a later backend opens of the same directory.
func TestPersistReleaseAndOpenPaused(t *testing.T) {
	b, s := started(t, restorer{newFakeRuntime()})
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "paused")
	if _, err := s.PersistPaused(ctx, dir); err == nil {
		t.Error("a running sandbox was persisted")
	}
	if err := s.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PersistPaused(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleasePaused(dir); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Workspace().(sandbox.DiskOnly); !ok {
		t.Errorf("a released sandbox's workspace: %T", s.Workspace())
	}
	if m := mountedUnder(b.cfg.StateDir); len(m) != 0 {
		t.Errorf("a released sandbox holds %v", m)
	}
	if names := entries(t, filepath.Join(b.cfg.CheckpointDir, s.id)); len(names) != 0 {
		t.Errorf("a released sandbox's checkpoints: %v", names)
	}
	if err := s.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if run(t, s, "x") != "41" || readFile(t, s, "notes.txt") != "kept" {
		t.Error("the released sandbox's resume lost its state or files")
	}

	// A later server's backend, on the same directory.
	later := newBackend(t, restorer{newFakeRuntime()})
	p, err := later.OpenPaused(ctx, dir, sandbox.FromSnapshot{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Execute(ctx, sandbox.ExecRequest{Code: "x"}, nil); !errors.Is(err, sandbox.ErrPaused) {
		t.Errorf("an execution in a sandbox opened paused: %v", err)
	}
	if err := p.(sandbox.Pauser).Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if run(t, p, "x") != "41" || readFile(t, p, "notes.txt") != "kept" {
		t.Error("the opened sandbox's resume lost its state or files")
	}
}

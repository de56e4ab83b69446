package gvisor_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
)

// TestThroughService drives gVisor snapshots and paused sandboxes kept on
// disk through the service, as every surface does: a snapshot (signed,
// checked) makes a sandbox; a paused
// sandbox is kept on disk, released, and opened again by a restarted
// service, then resumed with its state.
func TestThroughService(t *testing.T) {
	dir := t.TempDir()
	cps := filepath.Join(t.TempDir(), "checkpoints")
	b := pauseBackend(t, gvisor.Config{StateDir: dir, CheckpointDir: cps})
	data := t.TempDir()
	start := func() *service.Service {
		return service.New(service.Config{Backend: b, SnapshotDir: filepath.Join(data, "snapshots"),
			PausedDir: filepath.Join(data, "paused"), SnapshotKey: bytes.Repeat([]byte{7}, snapshot.KeySize),
			PersistDelay: 10 * time.Millisecond})
	}
	svc := start()
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	value := func(svc *service.Service, id, code string) string {
		t.Helper()
		res, err := svc.Execute(ctx, "o", id, sandbox.ExecRequest{Code: code}, nil)
		if err != nil || res.Status != sandbox.StatusOK || len(res.Results) == 0 {
			t.Fatalf("%s in %s: %+v %v", code, id, res, err)
		}
		return res.Results[0].Text
	}
	info, err := svc.Create(ctx, service.CreateRequest{Owner: "o", Pausable: true})
	if err != nil {
		t.Fatal(err)
	}
	value(svc, info.ID, "x = 41; open('kept.txt', 'w').write('kept'); x")

	snap, err := svc.Snapshot(ctx, "o", info.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	fromSnap, err := svc.Create(ctx, service.CreateRequest{Owner: "o", FromSnapshot: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := value(svc, fromSnap.ID, "x + 1"); got != "42" {
		t.Errorf("x + 1 in a sandbox of the snapshot: %s", got)
	}
	if err := svc.Delete("o", fromSnap.ID); err != nil {
		t.Error(err)
	}

	// Paused, kept on disk, the service restarted.
	value(svc, info.ID, "x = 43; x")
	if _, err := svc.Pause(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(data, "paused", info.ID)
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(kept); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the paused sandbox was not kept on disk")
		}
		time.Sleep(20 * time.Millisecond)
	}
	svc.Close()
	svc = start()
	got, err := svc.Info("o", info.ID)
	if err != nil || got.State != "paused" {
		t.Fatalf("after a restart: %+v %v", got, err)
	}
	if _, err := svc.Resume(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	if got := value(svc, info.ID, "open('kept.txt').read() + str(x)"); got != "'kept43'" {
		t.Errorf("resumed after a restart: %s", got)
	}
	if err := svc.Delete("o", info.ID); err != nil {
		t.Error(err)
	}
	if err := svc.DeleteSnapshot("o", snap.ID); err != nil {
		t.Error(err)
	}
	svc.Close()
	requireNothingLeft(t, b, dir, cps)
}

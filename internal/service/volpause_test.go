package service

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/voltest"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// volumeKeepingBackend keeps paused sandboxes (keepingBackend) that mount
// volumes, and forks them: it says, of each sandbox it opens from disk and
// of each copy it makes, how many volumes it was given and what mounting
// them gave.
type volumeKeepingBackend struct {
	keepingBackend
	mounted chan mountedVolumes
}

type mountedVolumes struct {
	n   int
	err error
}

func (volumeKeepingBackend) VolumesSupported() error { return nil }

func (b volumeKeepingBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, err := b.keepingBackend.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return &volumeSandbox{keepingSandbox: sb.(*keepingSandbox), mounted: b.mounted}, nil
}

func (b volumeKeepingBackend) OpenPaused(ctx context.Context, dir string, opts sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	sb, err := b.keepingBackend.OpenPaused(ctx, dir, opts)
	if err == nil {
		b.mounted <- mountAll(opts.Volumes)
	}
	return sb, err
}

type volumeSandbox struct {
	*keepingSandbox
	mounted chan mountedVolumes
}

func (s *volumeSandbox) Fork(ctx context.Context, n int, opts sandbox.ForkOptions) ([]sandbox.Sandbox, error) {
	for _, vols := range opts.Volumes {
		s.mounted <- mountAll(vols)
	}
	return s.keepingSandbox.Fork(ctx, n, opts)
}

// given returns what the backend said of the volumes of the last sandbox
// it opened or made: sent as it did, before it returned.
func (b volumeKeepingBackend) given(t *testing.T) mountedVolumes {
	t.Helper()
	select {
	case m := <-b.mounted:
		return m
	default:
		t.Fatal("the backend was given no volumes")
		return mountedVolumes{}
	}
}

// mountAll mounts each of vols once, as a restore does.
func mountAll(vols []sandbox.VolumeMount) mountedVolumes {
	for _, v := range vols {
		fd, err := v.Mount()
		if err != nil {
			return mountedVolumes{len(vols), err}
		}
		unix.Close(fd)
	}
	return mountedVolumes{len(vols), nil}
}

// TestPausedKeptVolumes: a paused sandbox keeps the leases of its volumes,
// in memory, kept on disk and in a new server over the same directories
// (a restart), so that none of them can be deleted meanwhile; a fork's
// copies lease them for themselves. One whose volume is gone all the
// same (deleted while no server ran) is listed, and its resume answers
// ErrCannotKeep, saying which volume; it can be closed.
func TestPausedKeptVolumes(t *testing.T) {
	testutil.RequireRoot(t, "volumes are loop devices")
	dir, volDir := t.TempDir(), filepath.Join(t.TempDir(), "volumes")
	openStore := func() *volume.Store { return voltest.OpenVolumes(t, volDir) }
	be := volumeKeepingBackend{keepingBackend: keepingBackend{pausingBackend: pausingBackend{made: make(chan *pausingSandbox, 8)},
		opened: make(chan string, 8)}, mounted: make(chan mountedVolumes, 8)}
	st := openStore()
	start := func() *Service {
		return New(Config{Backend: be, PausedDir: dir, SnapshotKey: bytes.Repeat([]byte{1}, snapshot.KeySize),
			PersistDelay: 10 * time.Millisecond, Volumes: st})
	}
	restart := func(svc *Service) *Service {
		svc.Close()
		st.Close()
		st = openStore()
		return start()
	}
	svc := start()
	ctx := context.Background()
	if _, err := st.Create("o", "data", 0); err != nil {
		t.Fatal(err)
	}
	info, err := svc.Create(ctx, CreateRequest{Owner: "o", Volumes: []VolumeRequest{{Name: "data", Path: "/mnt/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	inUse := func(when string) {
		t.Helper()
		if err := st.Delete("o", "data"); !errors.Is(err, volume.ErrInUse) {
			t.Fatalf("%s: the volume's deletion: %v", when, err)
		}
	}
	if _, err := svc.Pause(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	svc.persisting.Wait()
	inUse("paused, kept on disk")

	// Its copies lease the volume for themselves, and hold it once it
	// is gone.
	copies, err := svc.Fork(ctx, "o", info.ID, 2, sandbox.ForkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for range copies {
		if got := be.given(t); got.n != 1 || got.err != nil {
			t.Fatalf("a copy's volumes: %d, %v", got.n, got.err)
		}
	}
	svc.persisting.Wait() // paused again after the fork, and kept
	if got, _ := svc.Info("o", copies[0].ID); len(got.Volumes) != 1 || got.Volumes[0].Path != "/mnt/data" {
		t.Fatalf("a copy's volumes: %+v", got.Volumes)
	}
	svc.Delete("o", copies[0].ID)
	inUse("one copy left")
	svc.Delete("o", copies[1].ID)

	// A restart: the new server leases it again for the kept sandbox.
	svc = restart(svc)
	<-be.opened
	if got := be.given(t); got.n != 1 || got.err != nil {
		t.Fatalf("the volumes of the sandbox opened from disk: %d, %v", got.n, got.err)
	}
	inUse("paused, opened by a new server")
	if _, err := svc.Resume(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	inUse("resumed")

	// Its volume deleted while no server ran: listed, not resumed.
	if _, err := svc.Pause(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	svc.persisting.Wait()
	svc.Close()
	st.Close()
	st = openStore()
	if err := st.Delete("o", "data"); err != nil {
		t.Fatal(err)
	}
	svc = start()
	defer func() { svc.Close(); st.Close() }()
	<-be.opened
	if got := be.given(t); got.err == nil {
		t.Fatal("the sandbox opened without its volume mounts it")
	}
	if got, err := svc.Info("o", info.ID); err != nil || got.State != "paused" {
		t.Fatalf("without its volume: %+v %v", got, err)
	}
	_, err = svc.Resume(ctx, "o", info.ID)
	if !errors.Is(err, sandbox.ErrCannotKeep) || !strings.Contains(err.Error(), `volume "data"`) {
		t.Fatalf("the resume of a sandbox whose volume is gone: %v", err)
	}
	if err := svc.Delete("o", info.ID); err != nil {
		t.Fatal(err)
	}
}

package service

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
)

// savingBackend's sandboxes save a file as their snapshot, and it makes
// sandboxes of one: what the service keeps of snapshots (owners, quotas,
// signatures, import and export) is tested here, the saving itself in
// the backends (native: TestSnapshot).
type savingBackend struct{ restored chan string }

func (savingBackend) Name() string { return "saving" }

func (savingBackend) Create(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return &savingSandbox{}, nil
}

func (b savingBackend) CreateFromSnapshot(_ context.Context, dir string, _ sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	state, err := os.ReadFile(filepath.Join(dir, "state"))
	if err != nil {
		return nil, err
	}
	b.restored <- string(state)
	return &savingSandbox{}, nil
}

type savingSandbox struct{ idleSandbox }

func (*savingSandbox) SnapshotSupported() error { return nil }

func (*savingSandbox) SaveSnapshot(_ context.Context, dir string) (int64, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return 0, err
	}
	return 5, os.WriteFile(filepath.Join(dir, "state"), []byte("saved"), 0o600)
}

func snapshotService(t *testing.T, dir string, key byte) *Service {
	t.Helper()
	svc := New(Config{Backend: savingBackend{restored: make(chan string, 8)}, SnapshotDir: dir,
		SnapshotKey: bytes.Repeat([]byte{key}, snapshot.KeySize), MaxSnapshots: 2})
	t.Cleanup(func() { svc.Close() })
	return svc
}

// TestSnapshots: an owner's snapshots are its own, bounded, survive the
// service, make sandboxes, are refused once changed, and move between
// services that share a key (and not others).
func TestSnapshots(t *testing.T) {
	dir := t.TempDir()
	svc := snapshotService(t, dir, 1)
	ctx := context.Background()
	src, err := svc.Create(ctx, CreateRequest{Owner: "o", Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Snapshot(ctx, "other", src.ID, ""); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another owner's sandbox: %v", err)
	}
	a, err := svc.Snapshot(ctx, "o", src.ID, "")
	if err != nil || a.SandboxID != src.ID || a.Backend != "saving" {
		t.Fatalf("%+v %v", a, err)
	}
	if _, err := svc.Snapshot(ctx, "o", src.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Snapshot(ctx, "o", src.ID, ""); !errors.Is(err, ErrQuota) {
		t.Fatalf("a third snapshot of two allowed: %v", err)
	}
	if got := len(svc.Snapshots("o")); got != 2 {
		t.Fatalf("%d snapshots listed", got)
	}
	if got := svc.Snapshots("other"); len(got) != 0 {
		t.Fatalf("another owner lists %v", got)
	}
	if _, err := svc.SnapshotInfo("other", a.ID); !errors.Is(err, ErrSnapshotNotFound) {
		t.Fatalf("another owner's snapshot: %v", err)
	}
	if _, err := svc.Create(ctx, CreateRequest{Owner: "other", FromSnapshot: a.ID}); !errors.Is(err, ErrSnapshotNotFound) {
		t.Fatalf("another owner makes a sandbox of it: %v", err)
	}
	if _, err := svc.Create(ctx, CreateRequest{Owner: "o", FromSnapshot: a.ID, Env: map[string]string{"A": "b"}}); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Fatalf("a snapshot and an environment: %v", err)
	}

	// A new service over the same directory: a restarted server.
	svc.Close()
	svc = snapshotService(t, dir, 1)
	made, err := svc.Create(ctx, CreateRequest{Owner: "o", FromSnapshot: a.ID})
	if err != nil || made.Metadata["k"] != "v" {
		t.Fatalf("a sandbox of the snapshot: %+v %v", made, err)
	}
	if got := <-svc.cfg.Backend.(savingBackend).restored; got != "saved" {
		t.Fatalf("restored %q", got)
	}

	var archive bytes.Buffer
	if err := svc.ExportSnapshot("o", a.ID, &archive); err != nil {
		t.Fatal(err)
	}
	// Changed on disk: refused.
	os.WriteFile(filepath.Join(dir, a.ID, "data", "state"), []byte("forged"), 0o600)
	if _, err := svc.Create(ctx, CreateRequest{Owner: "o", FromSnapshot: a.ID}); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Fatalf("a changed snapshot: %v", err)
	}
	if err := svc.DeleteSnapshot("o", a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, a.ID)); !os.IsNotExist(err) {
		t.Fatalf("a deleted snapshot's directory: %v", err)
	}

	// Another service with the same key takes the export; one with
	// another key does not.
	same := snapshotService(t, t.TempDir(), 1)
	imp, err := same.ImportSnapshot(ctx, "p", bytes.NewReader(archive.Bytes()))
	if err != nil || imp.ID == a.ID {
		t.Fatalf("import: %+v %v", imp, err)
	}
	if _, err := same.Create(ctx, CreateRequest{Owner: "p", FromSnapshot: imp.ID}); err != nil {
		t.Fatalf("a sandbox of the imported snapshot: %v", err)
	}
	foreign := snapshotService(t, t.TempDir(), 2)
	if _, err := foreign.ImportSnapshot(ctx, "p", bytes.NewReader(archive.Bytes())); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Fatalf("an import signed with another key: %v", err)
	}
	if got := foreign.Snapshots("p"); len(got) != 0 {
		t.Fatalf("a refused import left %v", got)
	}
}

// keepingBackend's sandboxes pause and write a file down when persisted;
// it opens them paused again.
type keepingBackend struct {
	pausingBackend
	opened chan string
}

func (b keepingBackend) Create(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	sb, _ := b.pausingBackend.Create(ctx, spec)
	return &keepingSandbox{pausingSandbox: sb.(*pausingSandbox)}, nil
}

func (b keepingBackend) OpenPaused(_ context.Context, dir string, _ sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	state, err := os.ReadFile(filepath.Join(dir, "state"))
	if err != nil {
		return nil, err
	}
	b.opened <- string(state)
	return &keepingSandbox{pausingSandbox: &pausingSandbox{paused: true}}, nil
}

type keepingSandbox struct{ *pausingSandbox }

func (*keepingSandbox) PersistPaused(_ context.Context, dir string) (int64, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return 0, err
	}
	return 6, os.WriteFile(filepath.Join(dir, "state"), []byte("paused"), 0o600)
}

// TestSnapshotSweep: a start removes what a crash left in the snapshot
// directory an hour ago, and nothing that another server sharing the
// directory may be writing now.
func TestSnapshotSweep(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-2 * leftoverAge)
	mk := func(name string, aged bool) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Join(p, "data"), 0o700); err != nil {
			t.Fatal(err)
		}
		if aged {
			if err := os.Chtimes(p, old, old); err != nil {
				t.Fatal(err)
			}
		}
		return p
	}
	gone := []string{mk(".new-snap_aaaaaaaaaaaaaaaaaaaaaaaa", true), mk(".import-00112233", true),
		mk(".deleted-snap_bbbbbbbbbbbbbbbbbbbbbbbb", true), mk("snap_cccccccccccccccccccccccc", true)}
	kept := []string{mk(".new-snap_dddddddddddddddddddddddd", false), mk(".import-44556677", false),
		mk("snap_eeeeeeeeeeeeeeeeeeeeeeee", false)}
	svc := snapshotService(t, dir, 1)
	for _, p := range gone {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("a crash's leftover %s is still there (%v)", filepath.Base(p), err)
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s, maybe another server's work under way, was removed: %v", filepath.Base(p), err)
		}
	}
	// A snapshot is listed only once whole, under its own name.
	info, err := svc.Create(context.Background(), CreateRequest{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := svc.Snapshot(context.Background(), "o", info.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, snap.ID, snapshot.SignatureFile)); err != nil {
		t.Fatalf("the saved snapshot: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".new-*")); len(m) != 1 {
		t.Fatalf("staging directories after a save: %v (want only the fresh one made above)", m)
	}
}

// TestPausedKept: a paused sandbox is written down; a new service over
// the same directory (a restarted server) lists it, paused, under its id,
// with its metadata, and resumes it; a resume or a delete forgets it, a
// shutdown keeps it, a changed one is refused.
func TestPausedKept(t *testing.T) {
	dir := t.TempDir()
	be := keepingBackend{pausingBackend: pausingBackend{made: make(chan *pausingSandbox, 8)}, opened: make(chan string, 8)}
	start := func() *Service {
		return New(Config{Backend: be, PausedDir: dir, SnapshotKey: bytes.Repeat([]byte{1}, snapshot.KeySize),
			PersistDelay: 50 * time.Millisecond})
	}
	svc := start()
	ctx := context.Background()
	info, err := svc.Create(ctx, CreateRequest{Owner: "o", Metadata: map[string]string{"k": "v"}, AutoResume: true})
	if err != nil {
		t.Fatal(err)
	}
	// Paused and resumed at once: nothing is written.
	if _, err := svc.Pause(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Resume(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	svc.persisting.Wait()
	if _, err := os.Stat(filepath.Join(dir, info.ID)); !os.IsNotExist(err) {
		t.Fatalf("a sandbox paused for a moment was written down: %v", err)
	}
	// As a fork's copy is: its backend's environment names another.
	box, _ := svc.Get("o", info.ID)
	box.idEnv, box.idStale = []string{"E2B_SANDBOX_ID"}, true
	if _, err := svc.Pause(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	svc.persisting.Wait()
	if _, err := os.Stat(filepath.Join(dir, info.ID, snapshot.SignatureFile)); err != nil {
		t.Fatalf("not kept: %v", err)
	}
	svc.Close() // a shutdown keeps it

	svc = start()
	if got := <-be.opened; got != "paused" {
		t.Fatalf("opened %q", got)
	}
	again, err := svc.Info("o", info.ID)
	if err != nil || again.State != "paused" || again.Metadata["k"] != "v" || !again.AutoResume {
		t.Fatalf("after a restart: %+v %v", again, err)
	}
	if box, _ := svc.lookup("o", info.ID); box.ownEnv(nil)["E2B_SANDBOX_ID"] != info.ID { // lookup: no auto-resume
		t.Fatalf("after a restart, a copy's executions are given %v", box.ownEnv(nil))
	}
	if _, err := svc.Info("other", info.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another owner sees it: %v", err)
	}
	// A second server given the same directory keeps out of it.
	second := start()
	if _, err := second.Info("o", info.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a second server on the directory lists the first's paused sandbox: %v", err)
	}
	select {
	case got := <-be.opened:
		t.Fatalf("a second server on the directory opened a %q sandbox", got)
	default:
	}
	second.Close()
	if _, err := os.Stat(filepath.Join(dir, info.ID, snapshot.SignatureFile)); err != nil {
		t.Fatalf("the second server's close removed it: %v", err)
	}
	if _, err := svc.Resume(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, info.ID)); !os.IsNotExist(err) {
		t.Fatalf("a resumed sandbox is still kept: %v", err)
	}
	// Paused again and deleted: forgotten.
	if _, err := svc.Pause(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	svc.persisting.Wait()
	if err := svc.Delete("o", info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, info.ID)); !os.IsNotExist(err) {
		t.Fatalf("a deleted sandbox is still kept: %v", err)
	}

	// Changed data: listed, but its resume is refused (the whole
	// directory is checked then, not at the start).
	info, _ = svc.Create(ctx, CreateRequest{Owner: "o"})
	svc.Pause(ctx, "o", info.ID)
	svc.persisting.Wait()
	other, _ := svc.Create(ctx, CreateRequest{Owner: "o"})
	svc.Pause(ctx, "o", other.ID)
	svc.persisting.Wait()
	svc.Close()
	os.WriteFile(filepath.Join(dir, info.ID, "data", "state"), []byte("forged"), 0o600)
	svc = start()
	defer svc.Close()
	<-be.opened
	<-be.opened
	if _, err := svc.Resume(ctx, "o", info.ID); !errors.Is(err, sandbox.ErrInvalidSpec) {
		t.Fatalf("the resume of a changed kept sandbox: %v", err)
	}
	svc.Close()
	// A changed record: refused and removed at the start.
	meta := filepath.Join(dir, other.ID, "meta.json")
	b, _ := os.ReadFile(meta)
	os.WriteFile(meta, bytes.Replace(b, []byte(`"o"`), []byte(`"p"`), 1), 0o600)
	svc = start()
	defer svc.Close()
	if _, err := svc.Info("p", other.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a kept sandbox whose record changed owner: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, other.ID)); !os.IsNotExist(err) {
		t.Fatalf("a changed record is not removed: %v", err)
	}
}

// netKeepingBackend keeps paused sandboxes and carries proxies; it says
// whether each sandbox it opens was given one.
type netKeepingBackend struct {
	keepingBackend
	proxied chan bool
}

func (netKeepingBackend) EgressSupported() error { return nil }

func (b netKeepingBackend) OpenPaused(ctx context.Context, dir string, opts sandbox.FromSnapshot) (sandbox.Sandbox, error) {
	sb, err := b.keepingBackend.OpenPaused(ctx, dir, opts)
	if err == nil {
		b.proxied <- opts.Egress != nil
		if opts.Egress != nil {
			opts.Egress.Close() // the fake sandbox does not serve it
		}
	}
	return sb, err
}

// TestPausedKeptNetwork: a paused sandbox with network access is kept with
// it; the server that opens it grants it again as its own allowlist
// allows it then, with a proxy of its own, and grants none where its
// allowlist no longer has it.
func TestPausedKeptNetwork(t *testing.T) {
	dir := t.TempDir()
	be := netKeepingBackend{keepingBackend: keepingBackend{pausingBackend: pausingBackend{made: make(chan *pausingSandbox, 8)},
		opened: make(chan string, 8)}, proxied: make(chan bool, 8)}
	start := func(allow ...string) *Service {
		rules, err := netpolicy.ParseRules(allow)
		if err != nil {
			t.Fatal(err)
		}
		return New(Config{Backend: be, PausedDir: dir, SnapshotKey: bytes.Repeat([]byte{1}, snapshot.KeySize),
			PersistDelay: 10 * time.Millisecond, Network: NetworkConfig{Policy: &netpolicy.Server{Rules: rules}}})
	}
	svc := start("example.com", "10.0.0.0/8:*")
	ctx := context.Background()
	info, err := svc.Create(ctx, CreateRequest{Owner: "o", Network: netpolicy.Request{Allow: []string{"example.com"}}})
	if err != nil {
		t.Fatal(err)
	}
	if info.Network == nil {
		t.Fatal("created without network access")
	}
	if _, err := svc.Pause(ctx, "o", info.ID); err != nil {
		t.Fatal(err)
	}
	svc.persisting.Wait()
	svc.Close()

	svc = start("example.com", "10.0.0.0/8:*")
	<-be.opened
	if !<-be.proxied {
		t.Error("reopened without a proxy")
	}
	if got, err := svc.Info("o", info.ID); err != nil || got.Network == nil || strings.Join(got.Network.Allow, " ") != "example.com:80,443" {
		t.Errorf("reopened: %+v %v", got.Network, err)
	}
	svc.Close()

	svc = start("10.0.0.0/8:*") // example.com is no longer allowed
	defer svc.Close()
	<-be.opened
	if <-be.proxied {
		t.Error("reopened with a proxy the server no longer allows")
	}
	if got, err := svc.Info("o", info.ID); err != nil || got.Network != nil {
		t.Errorf("reopened on a server that no longer allows it: %+v %v", got.Network, err)
	}
}

// TestPauseOnShutdown: a server with PauseOnShutdown pauses its running
// sandboxes as it shuts down and keeps them on disk; the next server on
// the directory has them, paused. Without it they are closed.
func TestPauseOnShutdown(t *testing.T) {
	for _, keep := range []bool{true, false} {
		dir := t.TempDir()
		be := keepingBackend{pausingBackend: pausingBackend{made: make(chan *pausingSandbox, 8)}, opened: make(chan string, 8)}
		start := func() *Service {
			return New(Config{Backend: be, PausedDir: dir, SnapshotKey: bytes.Repeat([]byte{1}, snapshot.KeySize),
				PersistDelay: time.Hour, PauseOnShutdown: keep})
		}
		svc := start()
		ctx := context.Background()
		info, err := svc.Create(ctx, CreateRequest{Owner: "o", Metadata: map[string]string{"k": "v"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := svc.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		_, err = os.Stat(filepath.Join(dir, info.ID, snapshot.SignatureFile))
		if keep != (err == nil) {
			t.Fatalf("PauseOnShutdown %v: kept on disk: %v", keep, err)
		}
		svc = start()
		again, err := svc.Info("o", info.ID)
		switch {
		case keep && (err != nil || again.State != "paused" || again.Metadata["k"] != "v"):
			t.Fatalf("after a restart: %+v %v", again, err)
		case !keep && !errors.Is(err, ErrNotFound):
			t.Fatalf("closed at shutdown, yet after a restart: %+v %v", again, err)
		}
		svc.Close()
	}
}

// TestSnapshotNames: a name finds the newest of the owner's snapshots of
// that name, only the owner's; a bad name is refused; deleting by name
// deletes every snapshot of it.
func TestSnapshotNames(t *testing.T) {
	svc := snapshotService(t, t.TempDir(), 1)
	ctx := context.Background()
	var ids []string
	for _, k := range []string{"old", "new"} {
		src, err := svc.Create(ctx, CreateRequest{Owner: "o", Metadata: map[string]string{"k": k}})
		if err != nil {
			t.Fatal(err)
		}
		snap, err := svc.Snapshot(ctx, "o", src.ID, "model-1.b_2")
		if err != nil || snap.Name != "model-1.b_2" {
			t.Fatalf("%+v %v", snap, err)
		}
		ids = append(ids, snap.ID)
		time.Sleep(time.Millisecond) // distinct creation times
	}
	for _, name := range []string{"", "Model", "-a", "a/b", "a b", "snap_0123456789abcdef01234567", strings.Repeat("a", 64)} {
		if _, err := svc.Snapshot(ctx, "o", ids[0], name); !errors.Is(err, sandbox.ErrInvalidSpec) && name != "" {
			t.Errorf("name %q: %v", name, err)
		}
		if err := CheckSnapshotName(name); err == nil {
			t.Errorf("name %q taken", name)
		}
	}
	made, err := svc.Create(ctx, CreateRequest{Owner: "o", FromSnapshot: "model-1.b_2"})
	if err != nil || made.Metadata["k"] != "new" {
		t.Fatalf("a sandbox of the name: %+v %v", made, err)
	}
	<-svc.cfg.Backend.(savingBackend).restored
	if info, err := svc.SnapshotInfo("o", "model-1.b_2"); err != nil || info.ID != ids[1] {
		t.Fatalf("the name finds %+v %v, not the newest %s", info, err, ids[1])
	}
	if _, err := svc.Create(ctx, CreateRequest{Owner: "other", FromSnapshot: "model-1.b_2"}); !errors.Is(err, ErrSnapshotNotFound) {
		t.Fatalf("another owner finds it by name: %v", err)
	}
	if err := svc.DeleteSnapshot("other", "model-1.b_2"); !errors.Is(err, ErrSnapshotNotFound) {
		t.Fatalf("another owner deletes it by name: %v", err)
	}
	for _, s := range svc.Snapshots("o") {
		if s.Name != "model-1.b_2" {
			t.Fatalf("listed %+v", s)
		}
	}
	if err := svc.DeleteSnapshot("o", "model-1.b_2"); err != nil {
		t.Fatal(err)
	}
	if got := svc.Snapshots("o"); len(got) != 0 {
		t.Fatalf("left after deleting the name: %+v", got)
	}
	if err := svc.DeleteSnapshot("o", "model-1.b_2"); !errors.Is(err, ErrSnapshotNotFound) {
		t.Fatalf("the name deleted twice: %v", err)
	}
}

// One key's import whose client stalls mid-stream delays no other key's
// snapshots, nor its own key's next import; once its client has gone it
// is not kept, and nothing of it is left.
func TestSnapshotImportStalled(t *testing.T) {
	dir := t.TempDir()
	svc := New(Config{Backend: savingBackend{restored: make(chan string, 8)}, SnapshotDir: dir,
		SnapshotKey: bytes.Repeat([]byte{1}, snapshot.KeySize), MaxSnapshots: 4})
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	src, err := svc.Create(ctx, CreateRequest{Owner: "b"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := svc.Snapshot(ctx, "b", src.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	var archive bytes.Buffer
	if err := svc.ExportSnapshot("b", snap.ID, &archive); err != nil {
		t.Fatal(err)
	}

	// Key a's client sends the archive's first entry, and then nothing.
	stalledCtx, clientGone := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	stalled := make(chan error, 1)
	go func() {
		_, err := svc.ImportSnapshot(stalledCtx, "a", pr)
		stalled <- err
	}()
	if _, err := pw.Write(archive.Bytes()[:1024]); err != nil { // returns once the import has read it
		t.Fatal(err)
	}

	within := func(what string, f func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s waits on another client's stalled import", what)
		}
	}
	within("another key's save", func() error { _, err := svc.Snapshot(ctx, "b", src.ID, ""); return err })
	within("another key's import", func() error {
		_, err := svc.ImportSnapshot(ctx, "b", bytes.NewReader(archive.Bytes()))
		return err
	})
	within("another key's delete", func() error { return svc.DeleteSnapshot("b", snap.ID) })
	within("the stalled key's next import", func() error {
		_, err := svc.ImportSnapshot(ctx, "a", bytes.NewReader(archive.Bytes()))
		return err
	})

	// The stalled client goes: its import fails and leaves nothing.
	clientGone()
	pw.CloseWithError(errors.New("the connection was closed"))
	if err := <-stalled; err == nil {
		t.Fatal("an import whose client went was kept")
	}
	if got := svc.Snapshots("a"); len(got) != 1 {
		t.Fatalf("key a keeps %d snapshots, want the one whole import", len(got))
	}
	// Read whole, but its client gone before it was kept: not kept.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := svc.ImportSnapshot(gone, "a", bytes.NewReader(archive.Bytes())); err == nil {
		t.Fatal("an import whose request had ended was kept")
	}
	if got := svc.Snapshots("a"); len(got) != 1 {
		t.Fatalf("key a keeps %d snapshots after an ended request", len(got))
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left %s", e.Name())
		}
	}
}

// A save that would take its key over its bytes is not kept: the bound
// counts the snapshot just saved.
func TestSnapshotBytesQuota(t *testing.T) {
	svc := New(Config{Backend: savingBackend{restored: make(chan string, 8)}, SnapshotDir: t.TempDir(),
		SnapshotKey: bytes.Repeat([]byte{1}, snapshot.KeySize), MaxSnapshotBytes: 8})
	t.Cleanup(func() { svc.Close() })
	ctx := context.Background()
	src, err := svc.Create(ctx, CreateRequest{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Snapshot(ctx, "o", src.ID, ""); err != nil { // 5 bytes of 8
		t.Fatal(err)
	}
	if _, err := svc.Snapshot(ctx, "o", src.ID, ""); !errors.Is(err, ErrQuota) {
		t.Fatalf("10 bytes of snapshots where 8 are allowed: %v", err)
	}
	if got := svc.Snapshots("o"); len(got) != 1 {
		t.Fatalf("%d snapshots kept", len(got))
	}
}

package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/hostdisk"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
)

// Snapshots (issue 15, docs/snapshots.md): a running sandbox saved to
// disk (sandbox.Snapshotter), which new sandboxes are made from
// (CreateRequest.FromSnapshot), listed, deleted, exported as a tar stream
// and imported on another server. Each is a directory of SnapshotDir:
//
//	meta.json   the service's record: its id, owner, source, size, and
//	            the spec sandboxes made from it get
//	data/       the backend's (its processes' memory and files)
//	signature   HMAC-SHA-256 of all of it under the server's snapshot
//	            key (internal/snapshot), checked before every restore
//	            and import: CRIU runs as root, and reads only what this
//	            server (or one sharing its key) wrote.
//
// A snapshot is its owner's alone (another key's is not found), counts
// against the owner's MaxSnapshots and MaxSnapshotBytes, and is kept
// until deleted: it outlives its sandbox and the server.

// ErrSnapshotNotFound: no snapshot of that id (or name) is the caller's.
var ErrSnapshotNotFound = errors.New("snapshot not found")

// A snapshot may have a name, its owner's (sandboxid.ValidName): a
// snapshot is then found by it as by its id (from_snapshot, E2B's
// Sandbox.create(name)), and the name finds the newest of the owner's
// snapshots that have it, as E2B's names find a template's newest build;
// older ones keep it, found by id. Deleting by name deletes every
// snapshot of that name.

// CheckSnapshotName refuses a name that a snapshot may not have.
func CheckSnapshotName(name string) error {
	if !sandboxid.ValidName(name) {
		return fmt.Errorf("%w: snapshot name %q: a name is 1 to %d lowercase letters, digits, '.', '_' and '-', "+
			"a letter or digit first, not starting as snapshots' ids do (snap_)", sandbox.ErrInvalidSpec, name, sandboxid.MaxName)
	}
	return nil
}

// SnapshotInfo is what owners see of a snapshot.
type SnapshotInfo struct {
	ID             string     `json:"id"`
	Name           string     `json:"name,omitempty" doc:"the name it was saved with: the newest of the key's snapshots of a name is found by it"`
	SandboxID      string     `json:"sandbox_id" doc:"the sandbox it was saved from"`
	CreatedAt      time.Time  `json:"created_at"`
	SizeBytes      int64      `json:"size_bytes" doc:"its size on the server's disk"`
	Backend        string     `json:"backend"`
	Limits         LimitsInfo `json:"limits" doc:"the limits of sandboxes made from it"`
	Template       string     `json:"template,omitempty" doc:"the template its sandbox was made of, and that template's digest"`
	TemplateDigest string     `json:"template_digest,omitempty"`
}

// snapshotMeta is a snapshot's meta.json.
type snapshotMeta struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Owner     string            `json:"owner"`
	SandboxID string            `json:"sandbox_id"`
	CreatedAt time.Time         `json:"created_at"`
	SizeBytes int64             `json:"size_bytes"`
	Backend   string            `json:"backend"`
	Limits    sandbox.Limits    `json:"limits"`
	Env       map[string]string `json:"env,omitempty"`
	IDEnv     []string          `json:"id_env,omitempty"` // which of Env hold the sandbox's id
	Metadata  map[string]string `json:"metadata,omitempty"`
	// Template and TemplateDigest are the template the sandbox was made
	// of, by its name and its configuration's digest.
	Template       string `json:"template,omitempty"`
	TemplateDigest string `json:"template_digest,omitempty"`
}

func (m snapshotMeta) info() SnapshotInfo {
	return SnapshotInfo{ID: m.ID, Name: m.Name, SandboxID: m.SandboxID, CreatedAt: m.CreatedAt, SizeBytes: m.SizeBytes,
		Backend: m.Backend, Limits: limitsInfo(m.Limits), Template: m.Template, TemplateDigest: m.TemplateDigest}
}

// snapshotsOn says why snapshots cannot be kept, if they cannot.
func (s *Service) snapshotsOn() error {
	if s.cfg.SnapshotDir == "" || len(s.cfg.SnapshotKey) < snapshot.KeySize {
		return fmt.Errorf("%w: this server keeps no snapshots (it has no data directory)", sandbox.ErrUnsupported)
	}
	return nil
}

// Snapshot saves an owner's sandbox as a new snapshot, named name ("":
// none); the sandbox goes on unchanged (one paused is resumed for the save
// and paused again). It fails as Fork does (busy, a backend that cannot),
// and with ErrQuota where the owner keeps its maximum of snapshots or
// bytes of them.
func (s *Service) Snapshot(ctx context.Context, owner, id, name string) (SnapshotInfo, error) {
	if err := s.snapshotsOn(); err != nil {
		return SnapshotInfo{}, err
	}
	if name != "" {
		if err := CheckSnapshotName(name); err != nil {
			return SnapshotInfo{}, err
		}
	}
	b, err := s.Get(owner, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	sn, ok := b.Sandbox().(sandbox.Snapshotter)
	if !ok {
		return SnapshotInfo{}, fmt.Errorf("%w: sandboxes of the %s backend cannot be saved as snapshots (the native backend's can, with CRIU)",
			sandbox.ErrUnsupported, b.backend)
	}
	if err := sn.SnapshotSupported(); err != nil {
		return SnapshotInfo{}, err
	}
	again, err := s.awake(ctx, b, "save")
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer again()
	if err := b.quietFor("save"); err != nil {
		return SnapshotInfo{}, err
	}
	so, done, err := s.snaps.write(ctx, owner)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer done()
	if err := so.room(s, owner, 1); err != nil {
		return SnapshotInfo{}, err
	}
	meta := snapshotMeta{ID: sandboxid.Snapshot.New(s.cfg.Node), Name: name, Owner: owner, SandboxID: id, CreatedAt: s.cfg.Now().UTC(),
		Backend: b.backend, Limits: b.limits, Env: maps.Clone(b.env), IDEnv: slices.Clone(b.idEnv), Metadata: maps.Clone(b.metadata),
		Template: b.template(), TemplateDigest: b.templateDigest()}
	// Written under a staging name and renamed once signed: a listing,
	// and a sweep by another server sharing the directory, never see
	// half of it.
	if err := os.MkdirAll(s.cfg.SnapshotDir, 0o700); err != nil {
		return SnapshotInfo{}, err
	}
	dir := filepath.Join(s.cfg.SnapshotDir, ".new-"+meta.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return SnapshotInfo{}, err
	}
	defer os.RemoveAll(dir) // nothing there once committed
	start := time.Now()
	used := s.use(b)
	size, err := sn.SaveSnapshot(ctx, filepath.Join(dir, "data"))
	used()
	if err != nil {
		return SnapshotInfo{}, err
	}
	meta.SizeBytes = size
	if err := s.writeSnapshotMeta(dir, meta); err != nil {
		return SnapshotInfo{}, err
	}
	if err := so.commit(ctx, s, owner, dir, meta); err != nil {
		return SnapshotInfo{}, err
	}
	s.cfg.Logger.Info("sandbox saved", "id", id, "snapshot", meta.ID, "bytes", size, "ms", time.Since(start).Milliseconds())
	return meta.info(), nil
}

// writeSnapshotMeta writes meta.json into dir and signs the directory.
func (s *Service) writeSnapshotMeta(dir string, meta snapshotMeta) error {
	buf, err := json.MarshalIndent(meta, "", "\t")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "meta.json"), buf, 0o600); err != nil {
		return err
	}
	return snapshot.Sign(dir, s.cfg.SnapshotKey)
}

// snapshotRoom fails with ErrQuota if owner keeps its maximum of
// snapshots, or if one more of add bytes would take it over its bytes.
// Callers hold the owner's snapOwner.mu.
func (s *Service) snapshotRoom(owner string, add int64) error {
	metas := s.snapshotMetas(owner)
	var bytes int64
	for _, m := range metas {
		bytes += m.SizeBytes
	}
	maxN, maxB := s.cfg.MaxSnapshots, s.cfg.MaxSnapshotBytes
	switch {
	case len(metas)+1 > maxN:
		return fmt.Errorf("%w: this key may keep %d snapshots; delete one (DELETE /v1/snapshots/{id}) first", ErrQuota, maxN)
	case bytes+add > maxB:
		return fmt.Errorf("%w: this key's snapshots would take over its %d MiB; delete one first", ErrQuota, maxB>>20)
	}
	return nil
}

// snapshotBytes is what owner's snapshots take. Callers hold the owner's
// snapOwner.mu.
func (s *Service) snapshotBytes(owner string) int64 {
	var n int64
	for _, m := range s.snapshotMetas(owner) {
		n += m.SizeBytes
	}
	return n
}

// snapshotMetas reads the records of owner's snapshots, newest first.
// A directory without a readable record (one being written) is skipped.
func (s *Service) snapshotMetas(owner string) []snapshotMeta {
	ents, _ := os.ReadDir(s.cfg.SnapshotDir)
	var out []snapshotMeta
	for _, e := range ents {
		if !e.IsDir() || !sandboxid.Snapshot.Valid(e.Name()) {
			continue
		}
		m, err := readSnapshotMeta(filepath.Join(s.cfg.SnapshotDir, e.Name()))
		if err == nil && m.Owner == owner && m.ID == e.Name() {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b snapshotMeta) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out
}

func readSnapshotMeta(dir string) (snapshotMeta, error) {
	var m snapshotMeta
	buf, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err == nil {
		err = json.Unmarshal(buf, &m)
	}
	return m, err
}

// Snapshots lists an owner's snapshots, newest first.
func (s *Service) Snapshots(owner string) []SnapshotInfo {
	if s.snapshotsOn() != nil {
		return []SnapshotInfo{}
	}
	out := []SnapshotInfo{}
	for _, m := range s.snapshotMetas(owner) {
		out = append(out, m.info())
	}
	return out
}

// snapshotOf finds an owner's snapshot by its id or, for a name, the
// newest of that name.
func (s *Service) snapshotOf(owner, ref string) (snapshotMeta, string, error) {
	if err := s.snapshotsOn(); err != nil {
		return snapshotMeta{}, "", err
	}
	id := ref
	if !sandboxid.Snapshot.Valid(ref) {
		named := s.snapshotsNamed(owner, ref)
		if len(named) == 0 {
			return snapshotMeta{}, "", ErrSnapshotNotFound
		}
		id = named[0].ID
	}
	dir := filepath.Join(s.cfg.SnapshotDir, id)
	m, err := readSnapshotMeta(dir)
	if err != nil || m.Owner != owner || m.ID != id {
		return snapshotMeta{}, "", ErrSnapshotNotFound
	}
	return m, dir, nil
}

// snapshotsNamed lists an owner's snapshots named name, newest first.
func (s *Service) snapshotsNamed(owner, name string) []snapshotMeta {
	if !sandboxid.ValidName(name) {
		return nil
	}
	return slices.DeleteFunc(s.snapshotMetas(owner), func(m snapshotMeta) bool { return m.Name != name })
}

// SnapshotInfo describes one of an owner's snapshots.
func (s *Service) SnapshotInfo(owner, id string) (SnapshotInfo, error) {
	m, _, err := s.snapshotOf(owner, id)
	return m.info(), err
}

// DeleteSnapshot removes one of an owner's snapshots, by its id, or all
// of those of a name. Sandboxes made from them are not affected.
func (s *Service) DeleteSnapshot(owner, ref string) error {
	if err := s.snapshotsOn(); err != nil {
		return err
	}
	ids := []string{ref}
	if !sandboxid.Snapshot.Valid(ref) {
		ids = nil
		for _, m := range s.snapshotsNamed(owner, ref) {
			ids = append(ids, m.ID)
		}
	}
	if len(ids) == 0 {
		return ErrSnapshotNotFound
	}
	so, put := s.snaps.get(owner)
	defer put()
	var gone []string
	defer func() {
		for _, g := range gone {
			os.RemoveAll(g)
		}
	}()
	so.mu.Lock()
	defer so.mu.Unlock()
	for _, id := range ids {
		_, dir, err := s.snapshotOf(owner, id)
		if err != nil {
			return err
		}
		// Renamed away under the lock, a listing never sees half of it;
		// removed after it, a large one delays no one.
		g := filepath.Join(s.cfg.SnapshotDir, ".deleted-"+id)
		if err := os.Rename(dir, g); err != nil {
			return err
		}
		gone = append(gone, g)
	}
	return nil
}

// ExportSnapshot writes one of an owner's snapshots to w as a tar stream
// (internal/snapshot), signature included: ImportSnapshot on a server that
// shares this one's snapshot key takes it.
func (s *Service) ExportSnapshot(owner, id string, w io.Writer) error {
	_, dir, err := s.snapshotOf(owner, id)
	if err != nil {
		return err
	}
	return snapshot.Export(w, dir)
}

// ImportSnapshot reads a snapshot that ExportSnapshot wrote (here, or on
// a server sharing this one's snapshot key) and keeps it as a new
// snapshot of owner's. A stream whose signature does not hold, or that
// is larger than the owner may keep or the server's disk can take, is
// refused and nothing is kept; so is one whose client has gone (ctx)
// before it is kept. Whether this host can restore it (the same kernel
// and CPU) is told when a sandbox is made from it.
//
// The stream is read and staged holding no lock: a client that sends
// slowly, or stops, delays no one's snapshots, its own key's others
// included (within snapshotWrites at once).
func (s *Service) ImportSnapshot(ctx context.Context, owner string, r io.Reader) (SnapshotInfo, error) {
	if err := s.snapshotsOn(); err != nil {
		return SnapshotInfo{}, err
	}
	so, done, err := s.snaps.write(ctx, owner)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer done()
	so.mu.Lock()
	err = s.snapshotRoom(owner, 1)
	room := s.cfg.MaxSnapshotBytes - s.snapshotBytes(owner)
	so.mu.Unlock()
	if err != nil {
		return SnapshotInfo{}, err
	}
	if err := os.MkdirAll(s.cfg.SnapshotDir, 0o700); err != nil {
		return SnapshotInfo{}, err
	}
	staging := filepath.Join(s.cfg.SnapshotDir, ".import-"+randomHex(8))
	defer os.RemoveAll(staging)
	n, err := snapshot.Import(r, staging, room, func(need int64) error {
		return hostdisk.Fits(s.cfg.SnapshotDir, need, "the snapshot's files")
	})
	switch {
	case errors.Is(err, snapshot.ErrTooLarge):
		return SnapshotInfo{}, fmt.Errorf("%w: the snapshot is larger than this key's room for snapshots (%d MiB)", ErrQuota, room>>20)
	case errors.Is(err, snapshot.ErrNotSnapshot):
		return SnapshotInfo{}, fmt.Errorf("%w: %v", sandbox.ErrInvalidSpec, err)
	case err != nil:
		return SnapshotInfo{}, fmt.Errorf("import a snapshot: %w", err)
	}
	if err := snapshot.Verify(staging, s.cfg.SnapshotKey); err != nil {
		return SnapshotInfo{}, fmt.Errorf("%w: %v", sandbox.ErrInvalidSpec, snapshot.ErrTampered)
	}
	m, err := readSnapshotMeta(staging)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("%w: the snapshot has no readable record", sandbox.ErrInvalidSpec)
	}
	// Now the importer's, under a new id.
	m.ID, m.Owner, m.SizeBytes = sandboxid.Snapshot.New(s.cfg.Node), owner, n
	if err := s.writeSnapshotMeta(staging, m); err != nil {
		return SnapshotInfo{}, err
	}
	if err := so.commit(ctx, s, owner, staging, m); err != nil {
		return SnapshotInfo{}, err
	}
	s.cfg.Logger.Info("snapshot imported", "snapshot", m.ID, "bytes", n)
	return m.info(), nil
}

// fromSnapshot checks an owner's snapshot for a new sandbox: its record
// and, against its signature, everything the restore will read.
func (s *Service) fromSnapshot(owner, id string) (snapshotMeta, string, error) {
	m, dir, err := s.snapshotOf(owner, id)
	if err != nil {
		return m, "", err
	}
	if err := snapshot.Verify(dir, s.cfg.SnapshotKey); err != nil {
		return m, "", fmt.Errorf("%w: snapshot %s: %v", sandbox.ErrInvalidSpec, id, err)
	}
	return m, dir, nil
}

// restoreSnapshot makes a sandbox of the checked snapshot in dir.
func (s *Service) restoreSnapshot(ctx context.Context, owner string, m snapshotMeta, dir string) (sandbox.Sandbox, error) {
	r, ok := sandbox.BackendAs[sandbox.SnapshotRestorer](s.cfg.Backend, m.Backend)
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend (of the snapshot) cannot make sandboxes from snapshots here",
			sandbox.ErrUnsupported, m.Backend)
	}
	return r.CreateFromSnapshot(ctx, filepath.Join(dir, "data"), sandbox.FromSnapshot{Tenant: s.tenantOf(owner)})
}

// leftoverAge is how old a staging directory in SnapshotDir must be for
// a start to take it for one that a crash left: several servers (each
// `vivarium mcp` of a user) may share the directory, and another's
// snapshot or import may be under way.
const leftoverAge = time.Hour

// sweepSnapshotLeftovers removes what a save, an import or a delete that
// a crash cut short left in SnapshotDir an hour ago or more.
func (s *Service) sweepSnapshotLeftovers() {
	ents, _ := os.ReadDir(s.cfg.SnapshotDir)
	for _, e := range ents {
		p := filepath.Join(s.cfg.SnapshotDir, e.Name())
		st, err := os.Lstat(p)
		if err != nil || time.Since(st.ModTime()) < leftoverAge {
			continue
		}
		switch {
		case strings.HasPrefix(e.Name(), ".new-"), strings.HasPrefix(e.Name(), ".import-"),
			strings.HasPrefix(e.Name(), ".deleted-"):
			os.RemoveAll(p)
		case sandboxid.Snapshot.Valid(e.Name()):
			// Unsigned: written by a release that did not stage.
			if _, err := os.Stat(filepath.Join(p, snapshot.SignatureFile)); os.IsNotExist(err) {
				os.RemoveAll(p)
			}
		}
	}
}

// snapshotWrites bounds the saves and imports one owner writes at once:
// each stages up to the owner's room on the disk before it is counted.
const snapshotWrites = 2

// snapOwner serialises what must see one owner's snapshots as they are:
// room checks, commits and deletes. Its lock is never held across a
// client's I/O or a save: those are staged first. Owners do not wait on
// one another.
type snapOwner struct {
	mu     sync.Mutex
	writes chan struct{} // saves and imports being written
	refs   int           // snapOwners' count of its users
}

// room is snapshotRoom under the owner's lock.
func (o *snapOwner) room(s *Service, owner string, add int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return s.snapshotRoom(owner, add)
}

// commit keeps the signed snapshot staged in dir as meta.ID, if its owner
// has room for it and its client is still there.
func (o *snapOwner) commit(ctx context.Context, s *Service, owner, dir string, meta snapshotMeta) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("the request ended before the snapshot was kept: %w", err)
	}
	if err := s.snapshotRoom(owner, meta.SizeBytes); err != nil {
		return err
	}
	return os.Rename(dir, filepath.Join(s.cfg.SnapshotDir, meta.ID))
}

// snapOwners holds a snapOwner per owner while anyone uses it.
type snapOwners struct {
	mu sync.Mutex
	m  map[string]*snapOwner
}

// write returns owner's snapOwner with one of its snapshotWrites taken,
// waiting for one while ctx lasts; done gives both back.
func (o *snapOwners) write(ctx context.Context, owner string) (so *snapOwner, done func(), err error) {
	so, put := o.get(owner)
	select {
	case so.writes <- struct{}{}:
		return so, func() { <-so.writes; put() }, nil
	case <-ctx.Done():
		put()
		return nil, nil, fmt.Errorf("%w: this key's other snapshots being saved or imported (%d at once) did not end in time",
			ErrQuota, snapshotWrites)
	}
}

// get returns owner's snapOwner; put gives it back.
func (o *snapOwners) get(owner string) (so *snapOwner, put func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]*snapOwner{}
	}
	so = o.m[owner]
	if so == nil {
		so = &snapOwner{writes: make(chan struct{}, snapshotWrites)}
		o.m[owner] = so
	}
	so.refs++
	return so, func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if so.refs--; so.refs == 0 {
			delete(o.m, owner)
		}
	}
}

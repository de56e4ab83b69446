package service

// A pause without memory: E2B's pause({ keepMemory: false }), its
// "filesystem-only snapshot". The sandbox's files are written to the
// server's disk, kept as a paused sandbox is (persist.go: PausedDir/<id>,
// signed, listed again by the next server), and the sandbox is closed: its
// processes end and its memory is freed. Its resume makes a new sandbox of
// the spec that made it, under the same id, and writes the files back: a
// fresh start (new processes, a new boot id), with the files as they were.
//
// It is done here, above the backends, with what the files of every
// backend offer (a sandbox.Workspace that can also make directories,
// links and modes): a backend whose files can be read whole and written
// back can do it, without CRIU, a sandbox forked from a zygote too. What is
// kept is what the file API reaches: on the native backend the sandbox's
// own root (its home, /tmp, /etc, /root ...; never the host's /usr or a
// volume), elsewhere its home. Kept: directories, regular files, symbolic
// links, permission bits, whose they are (the sandbox's root's or its
// user's) and their metadata (E2B's, user.e2b.* attributes). Not kept:
// times (a file has the time it was written back), hard links (each
// name a file of its own), FIFOs, sockets and devices, set-id and sticky
// bits. Both ways go through the workspace's confined walk as the
// sandbox's own users: nothing is written that the sandbox could not
// write itself, and no link the sandbox planted is followed.

import (
	"archive/tar"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/hostdisk"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/workspace"
)

// filesArchive is the name of the archive of a sandbox's files in its
// kept directory's data/.
const filesArchive = "files.tar"

// maxFilesDepth bounds the directories a pause without memory descends:
// a tree deeper than that is refused rather than kept in part.
const maxFilesDepth = 128

// How an archive's entries say whose they are.
const (
	ownerRoot = "root"
	ownerUser = "user"
)

// mdPrefix names a file's metadata in its archive entry, as tar keeps
// extended attributes (GNU tar's and Go's SCHILY form).
const mdPrefix = "SCHILY.xattr.user.e2b."

// errFilesPaused is what a sandbox paused without its memory answers.
var errFilesPaused = fmt.Errorf("%w: it was paused without its memory, and its files are on the server's disk "+
	"until it is resumed (connect to it)", sandbox.ErrPaused)

// filesView is a view of a sandbox's files that a pause without memory
// can read whole and write back (workspace.Dir is one).
type filesView interface {
	sandbox.Workspace
	sandbox.WorkspaceEditor
	sandbox.WorkspaceLinker
	Chmod(name string, mode uint32) error
	Symlink(target, name string) error
}

// PauseFiles pauses a sandbox without its memory: its files are kept on
// the server's disk, everything else of it ends (processes, commands,
// code contexts, connections), and its resume (Resume, or an automatic
// one) starts it afresh with its files. It fails as Pause does (paused
// already, code running) and with sandbox.ErrUnsupported, saying why,
// where the sandbox's files cannot be kept so.
func (s *Service) PauseFiles(ctx context.Context, owner, id string) (Info, error) {
	return s.changeState(ctx, owner, id, s.pauseFiles)
}

// pauseOnTimeout pauses b as its timeout asks: without its memory where
// it was made so (CreateRequest.PauseFilesOnly).
func (s *Service) pauseOnTimeout(ctx context.Context, b *Box) error {
	if b.pauseFiles {
		return s.pauseFiles(ctx, b)
	}
	return s.pause(ctx, b)
}

// timeoutPauseSupported returns nil if the timeout of sb, made of spec
// for req, can pause it as req asks, or why not.
func (s *Service) timeoutPauseSupported(sb sandbox.Sandbox, spec *sandbox.Spec, req CreateRequest) error {
	backend := cmp.Or(req.Backend, s.cfg.Backend.Name())
	if !req.PauseFilesOnly {
		return pauseSupported(sb, backend)
	}
	return s.filesPauseSupported(sb, spec, len(req.Volumes) > 0, backend)
}

// filesPauseSupported returns nil if sb, made of spec, can be paused
// without its memory, or an error that says why not.
func (s *Service) filesPauseSupported(sb sandbox.Sandbox, spec *sandbox.Spec, volumes bool, backend string) error {
	var why string
	switch {
	case !s.keepsPaused():
		why = "this server keeps no paused sandboxes on its disk (its data directory is not its own)"
	case spec == nil:
		why = "a sandbox made from a snapshot cannot be, yet"
	case volumes:
		why = "a sandbox with volumes cannot be, yet"
	}
	if why == "" {
		_, err := viewsOf(sb, backend)
		return err
	}
	return fmt.Errorf("%w: pausing without memory (keepMemory: false): %s", sandbox.ErrUnsupported, why)
}

// views are a sandbox's files as its root and as its user write them
// (sandbox.FileSystem); where its workspace is all it has (separate is
// false), both are that, and everything in it is the user's.
type views struct {
	root, user filesView
	separate   bool
}

// as is the view of owner (ownerRoot, ownerUser), and the other one.
func (v views) as(owner string) (as, other filesView) {
	if owner == ownerRoot {
		return v.root, v.user
	}
	return v.user, v.root
}

// viewsOf returns sb's views.
func viewsOf(sb sandbox.Sandbox, backend string) (views, error) {
	asRoot, asUser := sb.Workspace(), sb.Workspace()
	fsys, separate := sb.(sandbox.FileSystem)
	if separate {
		var err error
		if asRoot, err = fsys.Root(sandbox.UserRoot); err == nil {
			asUser, err = fsys.Root(sandbox.UserSandbox)
		}
		if err != nil {
			return views{}, err
		}
	}
	root, okRoot := asRoot.(filesView)
	user, okUser := asUser.(filesView)
	if !okRoot || !okUser {
		return views{}, fmt.Errorf("%w: pausing without memory (keepMemory: false): the files of the %s backend's "+
			"sandboxes cannot be written back whole", sandbox.ErrUnsupported, backend)
	}
	return views{root: root, user: user, separate: separate}, nil
}

// pauseFiles pauses b without its memory (PauseFiles).
func (s *Service) pauseFiles(ctx context.Context, b *Box) error {
	b.mu.Lock()
	spec, volumes, paused := b.spec, len(b.leases) > 0, b.paused
	b.mu.Unlock()
	if paused {
		return ErrAlreadyPaused
	}
	if err := s.filesPauseSupported(b.Sandbox(), spec, volumes, b.backend); err != nil {
		return err
	}
	b.pauseMu.Lock()
	defer b.pauseMu.Unlock()
	b.mu.Lock()
	if err := b.pauseRefused(); err != nil {
		b.mu.Unlock()
		return err
	}
	// From here no call reaches the sandbox (an execution would have
	// said so above, under the same lock): the stand-in answers that it
	// is paused. Its processes run on until it is closed, below.
	old := b.Sandbox()
	stand := &filesPaused{spec: *spec}
	b.setSandbox(stand)
	b.running++ // nothing expires it meanwhile
	b.pauseGen++
	meta := b.pausedMeta()
	b.mu.Unlock()
	meta.FilesOnly, meta.PausedAt = true, s.cfg.Now()
	start := time.Now()
	size, err := s.writePaused(b, meta, func(dir string) (int64, error) { return s.saveFiles(old, b.backend, dir) })
	if err != nil {
		b.mu.Lock()
		b.running--
		b.mu.Unlock()
		s.install(b, old) // it runs on
		s.cfg.Logger.Warn("sandbox pause without memory", "id", b.id, "err", err)
		return ownDisk(err)
	}
	// Ended before it is said to be paused: whoever sees it paused finds
	// nothing of it running.
	if err := old.Close(); err != nil {
		s.cfg.Logger.Warn("sandbox clean-up", "id", b.id, "err", err)
	}
	b.mu.Lock()
	b.running--
	b.paused, b.pausedAt, b.persisted = true, meta.PausedAt, true
	b.mu.Unlock()
	s.metrics.pauses.Add(1)
	s.cfg.Logger.Info("sandbox paused", "id", b.id, "memory", false, "bytes", size,
		"ms", time.Since(start).Milliseconds())
	return nil
}

// setSandbox makes sb b's sandbox.
func (b *Box) setSandbox(sb sandbox.Sandbox) {
	b.sbMu.Lock()
	b.sb = sb
	b.sbMu.Unlock()
}

// install makes sb b's sandbox, unless b was closed meanwhile (with
// whichever sandbox it had then): sb is closed then, and install reports
// false. The check and the change are under the service's lock, which
// a close takes b out of the service under.
func (s *Service) install(b *Box, sb sandbox.Sandbox) bool {
	s.mu.Lock()
	live := s.boxes[b.id] == b
	if live {
		b.setSandbox(sb)
	}
	s.mu.Unlock()
	if !live {
		sb.Close()
	}
	return live
}

// resumeSandbox resumes b's paused sandbox p: for one paused without its
// memory, a new sandbox in its place. Callers hold b.pauseMu.
func (s *Service) resumeSandbox(ctx context.Context, b *Box, p sandbox.Pauser) error {
	stand, ok := p.(*filesPaused)
	if !ok {
		return p.Resume(ctx)
	}
	b.mu.Lock()
	spec, policy := stand.spec, b.network
	b.mu.Unlock()
	sb, egress, err := s.makeSandbox(ctx, b.owner, b.id, spec, policy)
	if err != nil {
		return err
	}
	if err := s.restoreFiles(sb, b); err != nil {
		sb.Close()
		return ownDisk(fmt.Errorf("its files: %w", err))
	}
	if !s.install(b, sb) {
		return ErrNotFound
	}
	b.netMu.Lock()
	b.egress = egress
	b.netMu.Unlock()
	return nil
}

// ownDisk is err as a client is told it: a failure of the server's own
// disk (an error of the os package, naming a host path) is the server's
// failure, answered without details and logged, whatever it wraps (a
// missing host file is no missing file of the client's).
func ownDisk(err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	if errors.As(err, &pe) || errors.As(err, &le) {
		return fmt.Errorf("the server's disk: %v", err)
	}
	return err
}

// saveFiles writes the files of sb (of the backend named) as an archive
// into dir, which it makes, and returns its size.
func (s *Service) saveFiles(sb sandbox.Sandbox, backend, dir string) (int64, error) {
	v, err := viewsOf(sb, backend)
	if err != nil {
		return 0, err
	}
	root := v.root
	entries, err := root.ReadDir(".", maxFilesDepth)
	if err != nil {
		return 0, err
	}
	if len(entries) >= workspace.MaxEntries {
		return 0, fmt.Errorf("%w: pausing without memory (keepMemory: false): the sandbox has more than %d files",
			sandbox.ErrUnsupported, workspace.MaxEntries)
	}
	var total int64
	for _, e := range entries {
		total += e.Size
		if e.Type == "dir" && strings.Count(e.Path, "/")+1 == maxFilesDepth {
			if below, _ := root.ReadDir(e.Path, 1); len(below) > 0 {
				return 0, fmt.Errorf("%w: pausing without memory (keepMemory: false): the sandbox's directories "+
					"are nested more than %d deep", sandbox.ErrUnsupported, maxFilesDepth)
			}
		}
	}
	if err := hostdisk.Fits(s.cfg.PausedDir, total, "the sandbox's files"); err != nil {
		return 0, err
	}
	// Whose a file is: the sandbox's root owns its "/"; where the
	// workspace is all there is, everything is the user's.
	rootUID := ^uint32(0)
	if v.separate {
		top, err := root.Stat(".")
		if err != nil {
			return 0, err
		}
		rootUID = top.UID
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return 0, err
	}
	f, err := os.OpenFile(filepath.Join(dir, filesArchive), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, e := range entries {
		if err := archive(tw, root, e, rootUID); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	st, err := os.Stat(filepath.Join(dir, filesArchive))
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// archive writes e, an entry of root, to tw. What changed since it was
// listed (the sandbox's processes run while it is saved) is taken as it
// is now, or left out where it is gone or no longer of its kind.
func archive(tw *tar.Writer, root filesView, e sandbox.FileInfo, rootUID uint32) error {
	h := &tar.Header{Name: e.Path, Mode: int64(e.Mode.Perm()), Uname: ownerUser, Format: tar.FormatPAX}
	if e.UID == rootUID {
		h.Uname = ownerRoot
	}
	switch e.Type {
	case "dir":
		h.Typeflag, h.Name = tar.TypeDir, e.Path+"/"
		return tw.WriteHeader(h)
	case "symlink":
		target, err := root.Readlink(e.Path)
		if changed(err) {
			return nil
		}
		if err != nil {
			return err
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
		return tw.WriteHeader(h)
	case "file":
	default:
		return nil // a FIFO, socket or device
	}
	r, info, err := root.OpenFile(e.Path)
	if changed(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer r.Close()
	h.Typeflag, h.Size, h.Mode = tar.TypeReg, info.Size, int64(info.Mode.Perm())
	if m, ok := root.(sandbox.WorkspaceMetadata); ok {
		md, _ := m.FileMetadata(e.Path)
		for k, v := range md {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[mdPrefix+k] = v
		}
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	// Cut or padded to the size it had when opened: a process of the
	// sandbox may be writing it.
	n, err := io.Copy(tw, io.LimitReader(r, h.Size))
	if err != nil {
		return fmt.Errorf("%q: %w", e.Path, err)
	}
	_, err = io.CopyN(tw, zeros{}, h.Size-n)
	return err
}

// changed says whether err is that of an entry gone, or no longer of its
// kind (a file replaced by a link, a FIFO), since it was listed.
func changed(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, sandbox.ErrBadPath)
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// restoreFiles writes b's kept files into sb, a new sandbox.
func (s *Service) restoreFiles(sb sandbox.Sandbox, b *Box) error {
	v, err := viewsOf(sb, b.backend)
	if err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(s.cfg.PausedDir, b.id, "data", filesArchive))
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(h.Name, "/")
		mode := uint32(h.Mode) & 0o777
		switch h.Typeflag {
		case tar.TypeDir:
			err = v.restoreDir(h.Uname, name, mode)
		case tar.TypeReg:
			err = v.restoreFile(h.Uname, name, mode, tr, h)
		case tar.TypeSymlink:
			err = v.restoreLink(h.Uname, name, h.Linkname)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
}

// either does fn as owner writes, or, where that user may not (a file of
// the user's in a directory of root's), as the other, and returns the
// view that did it.
func (v views) either(owner string, fn func(filesView) error) (filesView, error) {
	as, other := v.as(owner)
	err := fn(as)
	if errors.Is(err, sandbox.ErrPermission) && v.separate {
		as, err = other, fn(other)
	}
	return as, err
}

// clear makes room at name in the new sandbox for an entry of typ, and
// reports whether a directory is there for a directory (made again only
// where missing). A file replaces anything but a directory (WriteFile
// renames over it); a link, nothing.
func (v views) clear(owner, name, typ string) (bool, error) {
	info, err := v.root.Stat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, err
	case info.Type == "dir" && typ == "dir":
		return true, nil
	case info.Type != "dir" && typ == "file":
		return false, nil
	}
	_, err = v.either(owner, func(w filesView) error { return w.Remove(name) })
	return false, err
}

func (v views) restoreDir(owner, name string, mode uint32) error {
	there, err := v.clear(owner, name, "dir")
	if err != nil {
		return err
	}
	as, _ := v.as(owner)
	if there {
		// One of the new sandbox's own (/etc, /tmp, a mount point):
		// its mode is put back where it differs, if it may be.
		if info, err := v.root.Stat(name); err == nil && uint32(info.Mode.Perm()) != mode {
			v.either(owner, func(w filesView) error { return w.Chmod(name, mode) })
		}
		return nil
	}
	err = as.Mkdir(name)
	if g, ok := v.root.(sandbox.DirGiver); ok && errors.Is(err, sandbox.ErrPermission) && owner != ownerRoot && v.separate {
		// The user's, in a directory of root's: made as root and given
		// to the user, as E2B's envd makes a user's directories.
		err = g.MkdirAllFor(name, v.user)
	}
	if err != nil {
		return err
	}
	return as.Chmod(name, mode)
}

func (v views) restoreFile(owner, name string, mode uint32, r io.Reader, h *tar.Header) error {
	if _, err := v.clear(owner, name, "file"); err != nil {
		return err
	}
	by, err := v.either(owner, func(w filesView) error { return w.WriteFile(name, r, h.Size) })
	if err != nil {
		return err
	}
	if err := by.Chmod(name, mode); err != nil {
		return err
	}
	md := map[string]string{}
	for k, val := range h.PAXRecords {
		if key, ok := strings.CutPrefix(k, mdPrefix); ok {
			md[key] = val
		}
	}
	if m, ok := by.(sandbox.WorkspaceMetadata); ok && len(md) > 0 {
		return m.SetFileMetadata(name, md)
	}
	return nil
}

func (v views) restoreLink(owner, name, target string) error {
	if _, err := v.clear(owner, name, "symlink"); err != nil {
		return err
	}
	_, err := v.either(owner, func(w filesView) error { return w.Symlink(target, name) })
	return err
}

// openFilesPaused lists again a sandbox a server paused without its
// memory and kept on disk (openPaused): its sandbox, and its proxy, are
// made again at its resume.
func (s *Service) openFilesPaused(m pausedMeta) {
	if m.Spec == nil {
		s.cfg.Logger.Warn("a kept paused sandbox has no spec and is removed", "id", m.ID)
		os.RemoveAll(filepath.Join(s.cfg.PausedDir, m.ID))
		return
	}
	policy, egress := s.reopenNetwork(m)
	if egress != nil {
		egress.Close()
	}
	b := s.opened(m, &filesPaused{spec: *m.Spec}, policy, nil)
	b.pausable = m.Spec.Pausable // as it was made, not as a sandbox kept with its memory is
}

// specWithEnv is spec (nil: not known) with env: a copy's.
func specWithEnv(spec *sandbox.Spec, env map[string]string) *sandbox.Spec {
	if spec == nil {
		return nil
	}
	c := *spec
	c.Env = maps.Clone(env)
	return &c
}

// filesPaused stands in for a sandbox paused without its memory: every
// call says it is paused, until its resume (resumeSandbox) puts a new
// sandbox of spec in its place.
type filesPaused struct {
	spec sandbox.Spec
}

var (
	_ sandbox.Sandbox       = (*filesPaused)(nil)
	_ sandbox.Pauser        = (*filesPaused)(nil)
	_ sandbox.FileSystem    = (*filesPaused)(nil)
	_ sandbox.Snapshotter   = (*filesPaused)(nil)
	_ sandbox.Forker        = (*filesPaused)(nil)
	_ sandbox.ContextKeeper = (*filesPaused)(nil)
	_ sandbox.PortDialer    = (*filesPaused)(nil)
)

func (*filesPaused) ID() string { return "paused-without-memory" }
func (*filesPaused) Execute(context.Context, sandbox.ExecRequest, sandbox.Sink) (*sandbox.Result, error) {
	return nil, errFilesPaused
}
func (*filesPaused) Interrupt() error              { return nil } // nothing runs
func (*filesPaused) Restart(context.Context) error { return errFilesPaused }
func (*filesPaused) Start(context.Context, sandbox.Command) (sandbox.Process, error) {
	return nil, errFilesPaused
}
func (*filesPaused) Workspace() sandbox.Workspace           { return sandbox.DiskOnly{} }
func (*filesPaused) Root(string) (sandbox.Workspace, error) { return sandbox.DiskOnly{}, nil }
func (*filesPaused) Close() error                           { return nil }

// Pause and Resume are the service's (pauseFiles, resumeSandbox).
func (*filesPaused) Pause(context.Context) error  { return ErrAlreadyPaused }
func (*filesPaused) Resume(context.Context) error { return errFilesPaused }
func (*filesPaused) Paused() bool                 { return true }
func (*filesPaused) PauseSupported() error        { return nil }

func (*filesPaused) SnapshotSupported() error { return errFilesPaused }
func (*filesPaused) SaveSnapshot(context.Context, string) (int64, error) {
	return 0, errFilesPaused
}
func (*filesPaused) ForkSupported() error { return errFilesPaused }
func (*filesPaused) Fork(context.Context, int, sandbox.ForkOptions) ([]sandbox.Sandbox, error) {
	return nil, errFilesPaused
}

func (*filesPaused) CreateContext(string, string) (sandbox.CodeContext, error) {
	return sandbox.CodeContext{}, errFilesPaused
}
func (*filesPaused) Contexts() []sandbox.CodeContext { return nil }
func (*filesPaused) RestartContext(string) error     { return errFilesPaused }
func (*filesPaused) RemoveContext(string) error      { return errFilesPaused }
func (*filesPaused) DialPort(context.Context, int) (net.Conn, error) {
	return nil, errFilesPaused
}

package service

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/template"
)

// The files of a build's COPY steps, as E2B's Template SDK uploads them:
// for each step, an archive (a tar, gzipped or not) named by the step's
// files hash, which the SDK computes from the step and the files' names,
// modes and content. That hash is not a digest of the archive, so the
// server cannot check one against the other: an archive is kept by its
// hash among its key's files alone, so that what one key uploads under a
// hash is never what another key's build takes. Each archive is checked
// whole before it is kept (template.CheckArchive: a path out of the
// build's files, a link or a device where a file should be, a gzip bomb),
// written under a staging name first and given its name once checked.
//
// Layout: DIR/k<digest of the owner>/<hash>, DIR/staging/.

// maxUploadsAtOnce bounds one key's archives being sent at once.
const maxUploadsAtOnce = 4

// filesHashRE is a files hash as the SDKs make it: SHA-256 in hex.
var filesHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// storedFiles is an archive kept for a key.
type storedFiles struct {
	size   int64
	used   time.Time
	pinned int // builds running with it
}

// buildFilesDir is where archives are kept (BuildConfig.FilesDir).
type buildFilesDir struct {
	dir  string
	once sync.Once
	temp bool // made by open, removed by close
	err  error
}

func (d *buildFilesDir) open() (string, error) {
	d.once.Do(func() {
		if d.dir == "" {
			d.dir, d.err = os.MkdirTemp("", "vivarium-build-files-")
			d.temp = d.err == nil
		}
		if d.err == nil {
			d.err = os.MkdirAll(filepath.Join(d.dir, "staging"), 0o700)
		}
		if d.err == nil {
			// Left by a server that stopped mid-upload.
			leftovers, _ := filepath.Glob(filepath.Join(d.dir, "staging", "*"))
			for _, p := range leftovers {
				os.Remove(p)
			}
		}
	})
	return d.dir, d.err
}

func ownerDir(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return "k" + hex.EncodeToString(sum[:12])
}

func (d *buildFilesDir) path(owner, hash string) string {
	return filepath.Join(d.dir, ownerDir(owner), hash)
}

func (d *buildFilesDir) removeOwner(owner string) {
	if dir, err := d.open(); err == nil {
		os.RemoveAll(filepath.Join(dir, ownerDir(owner)))
	}
}

func (d *buildFilesDir) close() {
	if d.temp {
		os.RemoveAll(d.dir)
	}
}

// BuildFilesPresent reports whether the key has the files of hash for
// its template templateID.
func (s *Service) BuildFilesPresent(owner, templateID, hash string) (bool, error) {
	ob, err := s.builds.of(owner, false)
	if err != nil {
		return false, err
	}
	if !filesHashRE.MatchString(hash) {
		return false, fmt.Errorf("%w: a files hash is SHA-256 in lowercase hex", template.ErrInvalid)
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.templates[templateID] == nil {
		return false, fmt.Errorf("%w: %q", ErrTemplateNotFound, templateID)
	}
	f := ob.files[hash]
	if f != nil {
		f.used = s.builds.now()
	}
	return f != nil, nil
}

// PutBuildFiles keeps body, an archive of build files, as the files of
// hash for owner's template templateID. body is read whole, within
// BuildConfig's bounds, and checked before anything is kept; an archive
// of that hash already kept is replaced. Past the key's bounds the least
// recently used archives that no running build holds are dropped.
func (s *Service) PutBuildFiles(owner, templateID, hash string, body io.Reader) error {
	bs := s.builds
	if _, err := s.BuildFilesPresent(owner, templateID, hash); err != nil {
		return err
	}
	dir, err := bs.files.open()
	if err != nil {
		return err
	}
	ob, err := bs.of(owner, false)
	if err != nil {
		return err
	}
	// Uploads at once are bounded too: each stages up to MaxUpload
	// before the key's bounds are checked.
	ob.mu.Lock()
	if ob.uploading >= maxUploadsAtOnce {
		ob.mu.Unlock()
		return fmt.Errorf("%w: this key sends %d archives of build files at once, the most it may: wait for one to end",
			ErrQuota, ob.uploading)
	}
	ob.uploading++
	ob.mu.Unlock()
	defer func() {
		ob.mu.Lock()
		ob.uploading--
		ob.mu.Unlock()
	}()
	// Staged and checked without a lock: the client's bytes come at
	// the client's pace.
	f, err := os.CreateTemp(filepath.Join(dir, "staging"), hash+"-")
	if err != nil {
		return err
	}
	staged := f.Name()
	defer os.Remove(staged) // once renamed, nothing
	size, err := io.Copy(f, io.LimitReader(body, bs.cfg.MaxUpload+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if size > bs.cfg.MaxUpload {
		return fmt.Errorf("%w: an archive of build files is at most %d bytes as uploaded", template.ErrTooLarge, bs.cfg.MaxUpload)
	}
	if err := checkStaged(staged, bs.cfg.Archive); err != nil {
		return err
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.closed || ob.templates[templateID] == nil {
		return fmt.Errorf("%w: %q", ErrTemplateNotFound, templateID)
	}
	if err := bs.makeRoom(ob, hash, size); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(dir, ownerDir(owner)), 0o700); err != nil {
		return err
	}
	if err := os.Rename(staged, bs.files.path(owner, hash)); err != nil {
		return err
	}
	if old := ob.files[hash]; old != nil {
		ob.filesSize -= old.size
		old.size, old.used = size, bs.now()
	} else {
		ob.files[hash] = &storedFiles{size: size, used: bs.now()}
	}
	ob.filesSize += size
	return nil
}

func checkStaged(path string, lim template.ArchiveLimits) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return template.CheckArchive(f, lim)
}

// makeRoom drops the key's least recently used archives, other than
// hash's and those running builds hold, until one of size fits. Called
// holding ob.mu.
func (bs *builds) makeRoom(ob *ownerBuilds, hash string, size int64) error {
	count, bytes := len(ob.files), ob.filesSize
	if old := ob.files[hash]; old != nil {
		count, bytes = count-1, bytes-old.size
	}
	type candidate struct {
		hash string
		f    *storedFiles
	}
	var drop []candidate
	for h, f := range ob.files {
		if h != hash && f.pinned == 0 {
			drop = append(drop, candidate{h, f})
		}
	}
	slices.SortFunc(drop, func(a, b candidate) int { return a.f.used.Compare(b.f.used) })
	for count+1 > bs.cfg.MaxFiles || bytes+size > bs.cfg.MaxFilesBytes {
		if len(drop) == 0 {
			return fmt.Errorf("%w: this key's build files would pass %d archives or %d bytes, and running builds "+
				"hold the others: wait for them to finish", ErrQuota, bs.cfg.MaxFiles, bs.cfg.MaxFilesBytes)
		}
		c := drop[0]
		drop = drop[1:]
		os.Remove(bs.files.path(ob.owner, c.hash))
		delete(ob.files, c.hash)
		ob.filesSize -= c.f.size
		count, bytes = count-1, bytes-c.f.size
	}
	return nil
}

// uploadedFiles are a running build's files: the archives of its COPY
// steps' hashes, held (pinned) while it runs.
type uploadedFiles struct {
	bs     *builds
	ob     *ownerBuilds
	byPath map[string]string // a step's source → its files hash
	once   sync.Once
}

var _ BuildFiles = (*uploadedFiles)(nil)

// Archive writes what a COPY of src takes from the archive uploaded for
// it, as a directory of build files would give it (template.ArchiveFrom).
func (u *uploadedFiles) Archive(src string, w io.Writer) (string, error) {
	hash, ok := u.byPath[src]
	if !ok {
		return "", fmt.Errorf("%w: COPY %s: no files were uploaded for it", template.ErrInvalid, src)
	}
	f, err := os.Open(u.bs.files.path(u.ob.owner, hash))
	if err != nil {
		return "", err
	}
	defer f.Close()
	return template.ArchiveFrom(f, u.bs.cfg.Archive, src, w)
}

// pin holds the build's archives; called holding ob.mu.
func (u *uploadedFiles) pin() {
	for _, h := range u.byPath {
		u.ob.files[h].pinned++
	}
}

// release lets them go, once.
func (u *uploadedFiles) release() {
	u.once.Do(func() {
		u.ob.mu.Lock()
		defer u.ob.mu.Unlock()
		for _, h := range u.byPath {
			if f := u.ob.files[h]; f != nil {
				f.pinned--
			}
		}
	})
}

package main

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// The program every sandbox starts inside itself (internal/initprog), built
// and embedded by scripts/build.sh. Starting it costs a sandbox about a
// third of the CPU time that starting this whole binary again does, and it
// keeps less memory. A plain `go build` embeds no program (or a stale one,
// which initProgSHA256 tells apart): sandboxes then start this binary
// again, which works the same, only slower; `vivarium doctor` says which.
//
//go:embed initprog
var initProgFS embed.FS

// initProgSHA256 is the SHA-256 of the program scripts/build.sh embedded,
// set with -ldflags -X; empty in any other build.
var initProgSHA256 string

// initProgDir is where the program is written out, once per content (its
// name carries its hash): a path that outlives the server, as paused and
// snapshotted sandboxes need the very file their init maps.
const initProgDir = sandbox.ProgramDir

var errNoInitProg = errors.New("this vivarium was built without its init program (build it with scripts/build.sh or make build)")

func init() {
	sandbox.SetProgram(func() string {
		path, err := installedInitProg()
		if err != nil && !errors.Is(err, errNoInitProg) {
			initProgWarn.Do(func() {
				fmt.Fprintf(os.Stderr, "vivarium: sandboxes start this whole binary as their init (slower): %v\n", err)
			})
		}
		return path
	})
}

var (
	initProgWarn      sync.Once
	installedInitProg = sync.OnceValues(installInitProg)
)

// installInitProg writes the embedded program to initProgDir, unless a
// file of the same content is there, and returns its path.
func installInitProg() (string, error) {
	if initProgSHA256 == "" {
		return "", errNoInitProg
	}
	prog, err := initProgFS.ReadFile("initprog/vivarium-init")
	if err != nil {
		return "", errNoInitProg
	}
	return writeInitProg(initProgDir, prog, initProgSHA256)
}

// writeInitProg writes prog, whose SHA-256 must be want, into dir as
// vivarium-init-HASH, unless that file is there with that content (a file
// of other content, or of another owner, or writable, is replaced). The
// file there is compared with prog byte for byte: a server's start hashes
// nothing unless it writes.
func writeInitProg(dir string, prog []byte, want string) (string, error) {
	// The data directory above it lets others through, not list it
	// (docs/operations.md), when this makes it.
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := fileutil.CheckRootOnly(dir); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "vivarium-init-"+want[:16])
	if holds(path, prog) {
		return path, nil
	}
	sum := sha256.Sum256(prog)
	if got := hex.EncodeToString(sum[:]); got != want {
		return "", fmt.Errorf("the embedded init program is not the one this binary was built with "+
			"(sha256 %.12s, want %.12s); rebuild with scripts/build.sh", got, want)
	}
	tmp, err := os.CreateTemp(dir, ".vivarium-init-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(prog)
	if err == nil {
		err = tmp.Chmod(0o555)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return "", fmt.Errorf("write the init program to %s: %w", dir, err)
	}
	return path, nil
}

// holds reports whether path is a regular file of root's that nobody may
// write (a symbolic link is not followed) and whose content is want.
func holds(path string, want []byte) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 ||
		st.Mode&0o222 != 0 || st.Size != int64(len(want)) {
		return false
	}
	got := make([]byte, len(want)+1) // one more: a file that grew meanwhile
	n, err := io.ReadFull(f, got)
	return err == io.ErrUnexpectedEOF && bytes.Equal(got[:n], want)
}

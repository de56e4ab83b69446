//go:build linux

package cgroups

import (
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// statReader reads a group's accounting files: each by its path (byPath),
// or through the descriptors the group holds (statFiles).
type statReader interface {
	readInt(dir, file string) (int64, error)
	readKeyed(dir, file, key string) (int64, error)
}

type byPath struct{}

func (byPath) readInt(dir, file string) (int64, error) { return readInt(dir, file) }

func (byPath) readKeyed(dir, file, key string) (int64, error) { return readKeyed(dir, file, key) }

// statFiles keeps the control files a group's Stats reads open, from the
// first read until the group is destroyed. Every execution reads them
// twice (its usage before and after), and an open walks the path through
// the cgroup file system and checks each step, which costs more than the
// read: a held descriptor is read again from offset 0 with pread, and the
// kernel formats the file anew for it. A group that is never read holds
// none; one that is holds one a file (three).
//
// Files are told apart by name alone: a group's accounting files have
// names of their own, in whichever of its directories they are.
type statFiles struct {
	mu     sync.Mutex // held across a read: Destroy closes the descriptors
	files  []statFile
	closed bool
}

type statFile struct {
	name string
	fd   int
}

// read reads dir/file through its held descriptor, opening it the first
// time. Once the group is destroyed (close), it reads the path, which
// fails as it did before: the group's directories are gone.
func (s *statFiles) read(dir, file string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	path := func() string { return filepath.Join(dir, file) }
	if s.closed {
		return readSmall(path())
	}
	fd := -1
	for _, f := range s.files {
		if f.name == file {
			fd = f.fd
			break
		}
	}
	if fd < 0 {
		var err error
		if fd, err = unix.Open(path(), unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return nil, &os.PathError{Op: "open", Path: path(), Err: err}
		}
		s.files = append(s.files, statFile{name: file, fd: fd})
	}
	return readFD(fd, path)
}

// close closes the held descriptors; reads from then on open the files.
func (s *statFiles) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.files {
		unix.Close(f.fd)
	}
	s.files, s.closed = nil, true
}

// readInt and readKeyed read a held file, as their namesakes read a path.

func (s *statFiles) readInt(dir, file string) (int64, error) {
	b, err := s.read(dir, file)
	return parseInt(b, err, file)
}

func (s *statFiles) readKeyed(dir, file, key string) (int64, error) {
	b, err := s.read(dir, file)
	return parseKeyed(b, err, file, key)
}

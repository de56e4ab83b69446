package testutil

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// ProcessesMatching lists host processes whose command line contains
// marker: what is left of processes that hostile code started with that
// marker in their arguments. This process is never listed.
func ProcessesMatching(marker string) []string {
	var out []string
	self := fmt.Sprint(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if filepath.Base(d) == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(marker)) {
			continue
		}
		cmd := strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		out = append(out, fmt.Sprintf("%s (pid %s)", cmd, filepath.Base(d)))
	}
	return out
}

// Entry is one file of a host directory tree, as Tree reports it.
type Entry struct {
	Type   string // "file", "dir", "symlink" or "other"
	Size   int64
	Target string // a symlink's target
}

// Tree describes every entry under dir, keyed by slash-separated path
// relative to dir, without following symbolic links. A missing dir is an
// empty tree.
func Tree(dir string) (map[string]Entry, error) {
	out := map[string]Entry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && os.IsNotExist(err) {
				return filepath.SkipDir
			}
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := Entry{Type: "other", Size: info.Size()}
		switch m := info.Mode(); {
		case m.IsRegular():
			e.Type = "file"
		case m.IsDir():
			e.Type, e.Size = "dir", 0
		case m&fs.ModeSymlink != 0:
			e.Type = "symlink"
			e.Target, _ = os.Readlink(p)
		}
		out[filepath.ToSlash(rel)] = e
		return nil
	})
	return out, err
}

// TreeSize is the total size of the regular files of a tree.
func TreeSize(tree map[string]Entry) int64 {
	var n int64
	for _, e := range tree {
		if e.Type == "file" {
			n += e.Size
		}
	}
	return n
}

// Mounts lists the mounts of this process's mount namespace, one
// "mount-point fstype source" line each.
func Mounts() []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		// id parent major:minor root mount-point options [optional...] - fstype source super-options
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 2 {
			continue
		}
		out = append(out, f[4]+" "+g[0]+" "+g[1])
	}
	return out
}

// containerDisk matches the disk mounts of container sandboxes (gVisor,
// Docker: <state dir>/sandboxes/<id>/disk), wherever their backend keeps
// its state (tests keep it in their own temporary directories).
var containerDisk = regexp.MustCompile(`/sandboxes/[0-9a-f]{16}/disk[ /]`)

// foreign reports whether a mount belongs to another test package's
// container sandboxes or test daemon.
func foreign(m string, mine []string) bool {
	if !strings.HasPrefix(m, "/run/vivarium/") && !strings.HasPrefix(m, "/tmp/vd-") &&
		!strings.HasPrefix(m, "/run/netns ") && !strings.HasPrefix(m, "/run/netns/") && !containerDisk.MatchString(m) {
		return false
	}
	for _, s := range mine {
		if strings.Contains(m, s) {
			return false
		}
	}
	return true
}

// MountsAdded returns the mounts present now and not in before that stay
// for the whole of settle, sampled every 100ms. Other programs on a shared
// host (container runtimes) mount and unmount all the time; a mount that a
// test leaked stays. (Removals are not reported: other programs' mounts
// that existed before come and go, and what runs in a sandbox cannot
// unmount anything of the host's.)
//
// Sandboxes of container backends (gVisor, Docker) mount their disks on the
// host, under /run/vivarium, test daemons their state under /tmp/vd-, and
// the network tests' hosts (NewNetHost) their namespaces under /run/netns:
// test packages run at the same time, so such mounts count only when their
// path holds one of mine (the suite's name, as in its state directories).
func MountsAdded(before []string, settle time.Duration, mine ...string) []string {
	was := map[string]int{}
	for _, m := range before {
		was[m]++
	}
	added := func() map[string]bool {
		now := map[string]int{}
		for _, m := range Mounts() {
			now[m]++
		}
		d := map[string]bool{}
		for m, n := range now {
			if n > was[m] && !foreign(m, mine) {
				d[m] = true
			}
		}
		return d
	}
	lasting := added()
	for deadline := time.Now().Add(settle); len(lasting) > 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		d := added()
		for m := range lasting {
			if !d[m] {
				delete(lasting, m)
			}
		}
	}
	out := make([]string, 0, len(lasting))
	for m := range lasting {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

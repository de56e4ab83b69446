//go:build linux

package hostile

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Noisy neighbours: what one sandbox may take of what every tenant shares.
var noisyCases = []hostileCase{
	{
		// The only disk a native sandbox reaches is the host's, through
		// /usr (its workspace is a tmpfs). O_DIRECT reads bypass the page
		// cache, so every one goes to the disk: unthrottled, one sandbox
		// read 370 MiB/s. Under a limit the disk is clearly faster than,
		// the rate holds (with slack: the throttle is a token bucket, and
		// its first slice may pass at once).
		name: "disk_read_hog",
		code: `
import mmap, os, sys, time
try:
    fd = os.open(os.environ["BIG"], os.O_RDONLY | os.O_DIRECT)
except OSError as e:
    print("no O_DIRECT read:", e.strerror)
    sys.exit(0)
buf = mmap.mmap(-1, 1 << 20)  # page-aligned, as O_DIRECT needs
size = os.fstat(fd).st_size
n = off = 0
start = time.monotonic()
while time.monotonic() - start < 2:
    if off + len(buf) > size:
        off = 0
    got = os.preadv(fd, [buf], off)
    if got <= 0:
        break
    n += got
    off += got
print(n, time.monotonic() - start)
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			switch h.be.Name {
			case "wasm":
				t.Skip("no host disk: a wasm sandbox's files are the interpreter's own, in memory")
			case "docker":
				t.Skip("the docker backend sets no disk I/O limit: the daemon makes the container's cgroup (see docs/operations.md)")
			}
			big, err := largestUsrLib()
			if err != nil {
				t.Fatal(err)
			}
			// The limit must be well under what the disk gives, or the
			// case proves nothing.
			host, err := directReadRate(big, 64<<20)
			if err != nil {
				t.Fatalf("the host's own O_DIRECT read of %s: %v", big, err)
			}
			t.Logf("%s: the host reads it at %.0f MiB/s with O_DIRECT", big, host/(1<<20))
			if host < 4*diskReadLimit {
				t.Skipf("the disk gives only %.0f MiB/s: too close to the %d MiB/s limit to tell", host/(1<<20), diskReadLimit>>20)
			}
			// gVisor's Sentry reads through the host's page cache whatever
			// the flags: with the file out of it, its reads go to the disk
			// too (what the host read above was O_DIRECT, not cached).
			if err := evict(big); err != nil {
				t.Fatal(err)
			}
			j.vars["BIG"] = big
			j.Spec.Limits.IOReadBPS = diskReadLimit
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantStatus(t, o, sandbox.StatusOK, 0)
			var n int64
			var secs float64
			if _, err := fmt.Sscanf(o.Stdout, "%d %g", &n, &secs); err != nil || secs <= 0 {
				t.Fatalf("stdout %q (stderr %s): want bytes and seconds", o.Stdout, o.Stderr)
			}
			rate := float64(n) / secs
			t.Logf("the sandbox read %d MiB in %.2f s: %.1f MiB/s under a %d MiB/s limit", n>>20, secs, rate/(1<<20), diskReadLimit>>20)
			if n < 1<<20 {
				t.Errorf("read %d bytes: the case read (almost) nothing, it proves nothing", n)
			}
			if allowed := 1.2*float64(diskReadLimit)*secs + diskReadBurst; float64(n) > allowed {
				t.Errorf("read %.1f MiB in %.2f s (%.1f MiB/s): over the %d MiB/s limit", float64(n)/(1<<20), secs,
					rate/(1<<20), diskReadLimit>>20)
			}
		},
	},
}

const (
	// diskReadLimit is the case's read rate: far below any disk's.
	diskReadLimit = 16 << 20
	// diskReadBurst is what the throttle may let through at once (a slice
	// of 100 ms at the rate, and a request in flight), with room to spare.
	diskReadBurst = 4 << 20
)

// largestUsrLib is the largest regular file under /usr/lib: many requests
// of one file, none from the page cache.
var largestUsrLib = sync.OnceValues(func() (string, error) {
	var best string
	var size int64
	err := filepath.WalkDir("/usr/lib", func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil && info.Size() > size {
			best, size = p, info.Size()
		}
		return nil
	})
	if err == nil && size < 64<<20 {
		err = fmt.Errorf("the largest file under /usr/lib, %s, has %d bytes: too small to measure a rate", best, size)
	}
	return best, err
})

// evict drops a file's pages from the host's page cache.
func evict(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
}

// directReadRate reads up to n bytes of path with O_DIRECT, in 1 MiB
// requests, and returns the rate in bytes a second.
func directReadRate(path string, n int64) (float64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return 0, err
	}
	defer unix.Munmap(buf)
	start := time.Now()
	var done int64
	for done < n {
		got, err := unix.Pread(fd, buf, done)
		if err != nil {
			return 0, err
		}
		if got <= 0 {
			break
		}
		done += int64(got)
	}
	return float64(done) / time.Since(start).Seconds(), nil
}

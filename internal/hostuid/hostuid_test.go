package hostuid

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newPool(t *testing.T, lock string, base uint32, ranges int) *Pool {
	t.Helper()
	p, err := New(Config{Base: base, Ranges: ranges, LockFile: lock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestAcquireReleaseExhaust(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "uids.lock")
	p := newPool(t, lock, 2_000_000_000, 3)
	seen := map[uint32]bool{}
	var got []Range
	for i := 0; i < 3; i++ {
		r, err := p.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		if seen[r.First] || (r.First-2_000_000_000)%RangeSize != 0 {
			t.Fatalf("range %d handed out twice or misaligned", r.First)
		}
		seen[r.First] = true
		got = append(got, r)
	}
	if _, err := p.Acquire(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("fourth range: %v, want ErrExhausted", err)
	}
	if n, err := p.InUse(); err != nil || n != 3 {
		t.Fatalf("InUse = %d, %v; want 3", n, err)
	}
	p.Release(got[1])
	r, err := p.Acquire()
	if err != nil || r.First != got[1].First {
		t.Fatalf("after release: %v %v, want %d", r.First, err, got[1].First)
	}
	if r.ID(1000) != r.First+1000 {
		t.Fatalf("ID(1000) = %d", r.ID(1000))
	}
}

// Two pools whose bounds overlap (two servers on one host, or a server and
// a test) never hand out overlapping ranges, even when their bases differ.
func TestOverlappingPoolsExclude(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "uids.lock")
	a := newPool(t, lock, 2_000_000_000, 3)
	b := newPool(t, lock, 2_000_000_000+RangeSize/2, 4)
	var ranges []Range
	for {
		r, err := a.Acquire()
		if err != nil {
			break
		}
		ranges = append(ranges, r)
	}
	for {
		r, err := b.Acquire()
		if err != nil {
			break
		}
		ranges = append(ranges, r)
	}
	for i, x := range ranges {
		for _, y := range ranges[i+1:] {
			if x.First < y.First+RangeSize && y.First < x.First+RangeSize {
				t.Fatalf("ranges at %d and %d overlap", x.First, y.First)
			}
		}
	}
	// a holds its 3 ranges; of b's, only the last clears a's.
	if len(ranges) != 4 {
		t.Fatalf("%d ranges handed out, want 4", len(ranges))
	}
}

// A process that holds a range excludes every other process, and its
// ranges come free when it dies, however it dies.
func TestAnotherProcessHolds(t *testing.T) {
	if os.Getenv("HOSTUID_HOLDER") != "" {
		p, err := New(Config{Base: 2_000_000_000, Ranges: 1, LockFile: os.Getenv("HOSTUID_HOLDER")})
		if err == nil {
			_, err = p.Acquire()
		}
		if err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("held\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	lock := filepath.Join(t.TempDir(), "uids.lock")
	cmd := exec.Command(os.Args[0], "-test.run=^TestAnotherProcessHolds$")
	cmd.Env = append(os.Environ(), "HOSTUID_HOLDER="+lock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := out.Read(buf)
	if !strings.HasPrefix(string(buf[:n]), "held") {
		cmd.Process.Kill()
		t.Fatalf("holder: %q", buf[:n])
	}
	p := newPool(t, lock, 2_000_000_000, 1)
	if _, err := p.Acquire(); !errors.Is(err, ErrExhausted) {
		t.Fatalf("range held by another process: %v, want ErrExhausted", err)
	}
	if n, _ := p.InUse(); n != 1 {
		t.Fatalf("InUse = %d, want 1 (the other process's)", n)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := p.Acquire(); err != nil {
		t.Fatalf("after the holder died: %v", err)
	}
}

func TestBounds(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "uids.lock")
	for _, c := range []Config{
		{Base: 0, Ranges: 1}, {Base: 1, Ranges: 0}, {Base: 1<<32 - RangeSize, Ranges: 1},
		{Base: 4_000_000_000, Ranges: 10000},
	} {
		c.LockFile = lock
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
	p := newPool(t, lock, 3_000_000_000, 2)
	if first, last := p.Bounds(); first != 3_000_000_000 || last != 3_000_000_000+2*RangeSize-1 {
		t.Fatalf("Bounds = %d, %d", first, last)
	}
}

func TestOwnedIDsRefused(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	subuid := filepath.Join(dir, "subuid")
	os.WriteFile(passwd, []byte("root:x:0:0::/root:/bin/sh\nodd line\nbig:x:2000070000:1::/:/bin/sh\n"), 0o644)
	os.WriteFile(subuid, []byte("alice:100000:65536\nrootless:2000100000:65536\n"), 0o644)
	cases := []struct {
		path        string
		field       int
		first, last uint64
		overlap     bool
	}{
		{passwd, 2, 2_000_000_000, 2_000_065_535, false},
		{passwd, 2, 2_000_065_536, 2_000_131_071, true},
		{subuid, -1, 2_000_000_000, 2_000_099_999, false},
		{subuid, -1, 2_000_000_000, 2_000_100_000, true},
		{subuid, -1, 2_000_165_535, 2_000_200_000, true},
		{filepath.Join(dir, "missing"), 2, 0, 1 << 31, false},
	}
	for _, c := range cases {
		err := checkFile(c.path, c.field, c.first, c.last)
		if (err != nil) != c.overlap {
			t.Errorf("%s %d-%d: %v, overlap %v", filepath.Base(c.path), c.first, c.last, err, c.overlap)
		}
	}
}

package native

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/voltest"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// leaseVolume makes the owner's volume name and takes a sandbox's lease of
// it, released when the test ends.
func leaseVolume(t *testing.T, st *volume.Store, name string) *volume.Lease {
	t.Helper()
	if _, err := st.Create("alice", name, 32<<20); err != nil {
		t.Fatal(err)
	}
	l, err := st.Acquire("alice", name, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Release)
	return l
}

// bothKinds runs test on a classic backend and on one with a zygote, each
// pausing with CRIU.
func bothKinds(t *testing.T, test func(*testing.T, *Backend)) {
	bin := requireCRIU(t)
	for _, kind := range []string{"classic", "zygote"} {
		t.Run(kind, func(t *testing.T) {
			var b *Backend
			if kind == "classic" {
				b = pauseBackend(t, pauseCgroupParent, pauseUIDBase)
			} else {
				b = zygotePauseBackend(t)
			}
			b.criuBin = bin
			test(t, b)
		})
	}
}

// hostHasVolume reports whether this process's mount namespace (the
// host's) has a mount of a loop device whose image is under dir.
func hostHasVolume(t *testing.T, dir string) bool {
	t.Helper()
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || !strings.HasPrefix(string(b), dir) {
			continue
		}
		dev, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(f)), "dev"))
		if err == nil && strings.Contains(string(mi), " "+strings.TrimSpace(string(dev))+" ") {
			return true
		}
	}
	return false
}

// TestPauseVolumes: a sandbox with volumes (one under the home, shown at
// both of its names, and one at /data) pauses and resumes, classic or
// forked from a zygote: twice in memory, once kept on disk and released,
// once opened from disk as another server does. Each time the files it
// holds open on the volumes come back at their offsets, what another
// wrote in the volume while it was paused is there, its writes are still
// its user's on disk, the mounts keep their flags, and the host's mount
// namespace never has a volume; once it is gone, nothing holds them.
func TestPauseVolumes(t *testing.T) {
	bothKinds(t, func(t *testing.T, b *Backend) {
		st, dir := voltest.TempVolumes(t)
		data, other := leaseVolume(t, st, "data"), leaseVolume(t, st, "other")
		vols := []sandbox.VolumeMount{{Path: "/home/user/data", Name: "data", Mount: data.Mount},
			{Path: "/data", Name: "other", Mount: other.Mount}}
		ctx := context.Background()
		sbx, err := b.Create(ctx, sandbox.Spec{Home: sandbox.HomeUser, Volumes: vols})
		if err != nil {
			t.Fatal(err)
		}
		s := sbx.(*Sandbox)
		defer func() { s.Close() }()
		execText(t, s, "x = 41\nf = open('/home/user/data/held.txt', 'w+')\nf.write('abc')\nf.flush()\n"+
			"g = open('/workspace/data/held.txt')\nh = open('/data/log', 'a')\nh.write('1')\nh.flush()")
		flags := execText(t, s, volumeFlagsCode)
		if flags != "True True False" {
			t.Fatalf("the volume's mount before a pause: nosuid nodev noexec = %s", flags)
		}
		for round := 1; round <= 4; round++ {
			testutil.Pause(t, s)
			switch round {
			case 3: // kept on disk, released, resumed from there
				kept := filepath.Join(t.TempDir(), "kept")
				if _, err := s.PersistPaused(ctx, kept); err != nil {
					t.Fatal(err)
				}
				if err := s.ReleasePaused(kept); err != nil {
					t.Fatal(err)
				}
			case 4: // opened from disk by another server, with the same volumes
				kept := filepath.Join(t.TempDir(), "kept")
				if _, err := s.PersistPaused(ctx, kept); err != nil {
					t.Fatal(err)
				}
				if _, err := b.OpenPaused(ctx, kept, sandbox.FromSnapshot{}); !errors.Is(err, sandbox.ErrInvalidSpec) {
					t.Fatalf("opened without its volumes: %v", err)
				}
				o, err := b.OpenPaused(ctx, kept, sandbox.FromSnapshot{Volumes: vols})
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
				s = o.(*Sandbox)
			}
			// Written while it is paused, by another user of the volume.
			if err := os.WriteFile(filepath.Join(data.Dir(), "while-paused"), []byte("w"), 0o644); err != nil {
				t.Fatal(err)
			}
			testutil.Resume(t, s)
			if hostHasVolume(t, dir) {
				t.Fatalf("round %d: the host's mount namespace has a volume after the resume", round)
			}
			got := execText(t, s, "x += 1\nf.write('d')\nf.flush()\nh.write('2')\nh.flush()\n"+
				"import os\n(x, f.tell(), g.read(), open('/home/user/data/while-paused').read(), "+
				"os.stat('/data/log').st_uid, os.getuid())")
			read := map[bool]string{true: "abcd", false: "d"}[round == 1]
			if want := fmt.Sprintf("(%d, %d, '%s', 'w', 1000, 1000)", 41+round, 3+round, read); got != want {
				t.Fatalf("round %d: after the resume %s, want %s", round, got, want)
			}
			if got := execText(t, s, volumeFlagsCode); got != flags {
				t.Fatalf("round %d: the volume's mount after the resume: nosuid nodev noexec = %s", round, got)
			}
		}
		// On disk, as the sandbox's user (1000), whatever its host user.
		var hst unix.Stat_t
		if err := unix.Lstat(filepath.Join(other.Dir(), "log"), &hst); err != nil || hst.Uid != 1000 {
			t.Fatalf("/data/log on disk: %v, uid %d", err, hst.Uid)
		}
		if b, err := os.ReadFile(filepath.Join(other.Dir(), "log")); err != nil || string(b) != "12222" {
			t.Fatalf("/data/log on disk: %q %v", b, err)
		}
		// The sandbox has its three mounts of them, as at its
		// creation, and none of the restores' own.
		if got := execText(t, s, "[l.split()[4] for l in open('/proc/self/mountinfo') if ' /dev/loop' in l]"); got != "['/workspace/data', '/home/user/data', '/data']" {
			t.Errorf("the sandbox's mounts of loop devices: %s", got)
		}
		// Once it and the leases are gone, nothing holds the volumes.
		s.Close()
		data.Release()
		other.Release()
		testutil.WaitFor(t, 10*time.Second, "the volumes' loop devices to detach", func() bool { return voltest.LoopsBacking(dir) == 0 })
	})
}

// volumeFlagsCode says whether the volume at /home/user/data is nosuid,
// nodev and noexec.
const volumeFlagsCode = `import os
st = os.statvfs('/home/user/data')
' '.join(str(bool(st.f_flag & m)) for m in (os.ST_NOSUID, os.ST_NODEV, os.ST_NOEXEC))`

// TestPauseVolumeFileChanged: a file the paused sandbox holds open on a
// volume, changed meanwhile, makes its resume fail with ErrCannotKeep,
// naming the file and the volume; the sandbox stays paused, and resumes
// once the file is as it was.
func TestPauseVolumeFileChanged(t *testing.T) {
	bin := requireCRIU(t)
	b := pauseBackend(t, pauseCgroupParent, pauseUIDBase)
	b.criuBin = bin
	st, _ := voltest.TempVolumes(t)
	data := leaseVolume(t, st, "data")
	ctx := context.Background()
	sbx, err := b.Create(ctx, sandbox.Spec{Volumes: []sandbox.VolumeMount{{Path: "/mnt/data", Name: "data", Mount: data.Mount}}})
	if err != nil {
		t.Fatal(err)
	}
	defer sbx.Close()
	s := sbx.(*Sandbox)
	execText(t, s, "f = open('/mnt/data/held.txt', 'w+')\nf.write('abc')\nf.flush()")
	testutil.Pause(t, s)
	held := filepath.Join(data.Dir(), "held.txt")
	if err := os.WriteFile(held, []byte("abcdef"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = s.Resume(ctx)
	if !errors.Is(err, sandbox.ErrCannotKeep) || !strings.Contains(err.Error(), `/mnt/data/held.txt open on volume "data"`) {
		t.Fatalf("resume with the held file changed: %v", err)
	}
	t.Logf("the resume's error: %v", err)
	if strings.Contains(err.Error(), b.cfg.CheckpointDir) {
		t.Errorf("the error names the server's paths: %v", err)
	}
	if !s.Core.Paused() {
		t.Fatal("a failed resume left the sandbox unpaused")
	}
	if err := os.Truncate(held, 3); err != nil {
		t.Fatal(err)
	}
	testutil.Resume(t, s)
	if got := execText(t, s, "f.seek(0)\nf.read()"); got != "abc" {
		t.Fatalf("after the resume: %s", got)
	}
}

// TestForkVolumes: the copies of a sandbox with a volume mount the same
// volume, through leases of their own: each finds the file the source
// held open, where it was, and what one writes the others see; they
// outlive the source and its lease, and pause and resume. A snapshot of
// it is refused (ErrCannotKeep).
func TestForkVolumes(t *testing.T) {
	bothKinds(t, func(t *testing.T, b *Backend) {
		st, _ := voltest.TempVolumes(t)
		src := leaseVolume(t, st, "data")
		ctx := context.Background()
		sbx, err := b.Create(ctx, sandbox.Spec{Volumes: []sandbox.VolumeMount{{Path: "/mnt/data", Name: "data", Mount: src.Mount}}})
		if err != nil {
			t.Fatal(err)
		}
		s := sbx.(*Sandbox)
		defer s.Close()
		execText(t, s, "f = open('/mnt/data/held.txt', 'w+')\nf.write('abc')\nf.flush()")
		// A snapshot cannot hold the volume's files: refused, saying so.
		if _, err := s.SaveSnapshot(ctx, filepath.Join(t.TempDir(), "snap")); !errors.Is(err, sandbox.ErrCannotKeep) ||
			!strings.Contains(err.Error(), "volume") {
			t.Fatalf("snapshot of a sandbox with a volume: %v", err)
		}
		var vols [][]sandbox.VolumeMount
		for range 2 {
			l, err := st.Acquire("alice", "data", true)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			vols = append(vols, []sandbox.VolumeMount{{Path: "/mnt/data", Name: "data", Mount: l.Mount}})
		}
		if _, err := s.Fork(ctx, 2, sandbox.ForkOptions{Volumes: vols[:1]}); !errors.Is(err, sandbox.ErrInvalidSpec) {
			t.Fatalf("two copies with one copy's volumes: %v", err)
		}
		copies, err := s.Fork(ctx, 2, sandbox.ForkOptions{Volumes: vols})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range copies {
			defer c.Close()
		}
		// The source and its lease go: the copies hold the volume.
		s.Close()
		src.Release()
		for i, c := range copies {
			c := c.(*Sandbox)
			if got := execText(t, c, fmt.Sprintf("f.write('%d')\nf.flush()\nf.tell()", i)); got != "4" {
				t.Fatalf("copy %d: the held file at %s", i, got)
			}
			testutil.Pause(t, c)
			testutil.Resume(t, c)
		}
		// Both wrote at offset 3 of the same file: the second's is there.
		got := execText(t, copies[0].(*Sandbox), "open('/mnt/data/held.txt').read()")
		if got != "abc1" {
			t.Fatalf("the held file, as copy 0 reads it: %q", got)
		}
	})
}

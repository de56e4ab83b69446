package native

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// TestZygoteShareResumes: a sandbox forked from a zygote shares the
// zygote's memory, uncharged; filled so that its own memory and that share
// exceed its limit together (not alone), it pauses, resumes with its
// memory (the restore is charged for the share, its limit raised by it),
// and has the room it had: a second pause and resume, a fork whose copy
// holds the same, a copy paused and resumed.
func TestZygoteShareResumes(t *testing.T) {
	bin := requireCRIU(t)
	b := zygotePauseBackend(t)
	b.criuBin = bin
	ctx := context.Background()
	const limit = 160 << 20
	sbx, err := b.Create(ctx, sandbox.Spec{Limits: sandbox.Limits{Memory: limit}})
	if err != nil {
		t.Fatal(err)
	}
	defer sbx.Close()
	s := sbx.(*Sandbox)
	execText(t, s, "import numpy\nx = numpy.arange(3)")
	start := time.Now()
	share, err := s.zygoteShare()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the sandbox shares %.1f MiB of the zygote's memory (counted in %v)", float64(share)/(1<<20), time.Since(start))
	if share < 4<<20 {
		t.Fatalf("the sandbox shares %d bytes of the zygote's memory: numpy's interpreter alone is more", share)
	}
	u, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	// Its own memory up to half the share short of its limit.
	fill := (limit - u.Memory - share/2) >> 20
	execText(t, s, fmt.Sprintf("chunks = [bytes([i %% 250 + 1]) * (1 << 20) for i in range(%d)]\nlen(chunks)", fill))
	want := execText(t, s, "int(sum(c[0] + c[-1] for c in chunks) + x.sum())")
	roundTrip := func(s *Sandbox, what string) {
		t.Helper()
		if err := s.Pause(ctx); err != nil {
			t.Fatalf("%s: pause: %v", what, err)
		}
		if err := s.Resume(ctx); err != nil {
			t.Fatalf("%s: resume: %v", what, err)
		}
		if got := execText(t, s, "int(sum(c[0] + c[-1] for c in chunks) + x.sum())"); got != want {
			t.Errorf("%s: %s, want %s", what, got, want)
		}
		if s.tookOver < share/2 {
			t.Errorf("%s: the limit is raised by %d MiB, the share was %d MiB", what, s.tookOver>>20, share>>20)
		}
		// What lets a pause of a restored tree skip counting the
		// zygote's pages: it maps none.
		if n := restoredShare(t, s); n != 0 {
			t.Errorf("%s: the restored tree maps %d bytes of pages charged to another group", what, n)
		}
		if n, err := s.zygoteShare(); err != nil || n != 0 {
			t.Errorf("%s: the restored tree's share is %d (%v), not 0", what, n, err)
		}
	}
	roundTrip(s, "the sandbox")
	roundTrip(s, "the sandbox again")
	copies, err := s.Fork(ctx, 1, sandbox.ForkOptions{})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	defer copies[0].Close()
	c := copies[0].(*Sandbox)
	if c.tookOver != s.tookOver {
		t.Errorf("the copy's limit is raised by %d bytes, its source's by %d", c.tookOver, s.tookOver)
	}
	roundTrip(c, "the copy")
}

// restoredShare walks the pages of s's processes as zygoteShare does
// before a first pause: the bytes charged to another group than s's.
func restoredShare(t *testing.T, s *Sandbox) int64 {
	t.Helper()
	ms, ok := s.cg.(cgroups.MemorySetter)
	if !ok {
		t.Fatal("the sandbox's group sets no memory limit")
	}
	pids, err := s.cg.Procs()
	if err != nil {
		t.Fatal(err)
	}
	n, err := sharedMemory(pids, ms.MemoryDir())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

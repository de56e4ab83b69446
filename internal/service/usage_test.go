package service

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestUsageSamples(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	tick := func(d time.Duration) {
		mu.Lock()
		now = now.Add(d)
		mu.Unlock()
	}
	svc := New(Config{Backend: newFakeBackend(), Now: clock, UsageInterval: time.Hour})
	defer svc.Close()
	info, err := svc.Create(context.Background(), CreateRequest{Owner: "o"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := svc.Get("o", info.ID)
	sb := b.sb.(*idleSandbox)
	sb.mem.Store(50 << 20)

	// At once: one sample, taken now.
	got, err := svc.Usage("o", info.ID, time.Time{}, time.Time{})
	if err != nil || len(got) != 1 || got[0].Memory != 50<<20 || got[0].MemoryMax != info.Limits.Memory || got[0].DiskMax != info.Limits.Disk {
		t.Fatalf("first: %+v %v", got, err)
	}
	// Half of one CPU's time over 10 s, of CPUCount CPUs.
	tick(10 * time.Second)
	sb.cpu.Store(int64(5 * time.Second))
	svc.sampleAll()
	got, _ = svc.Usage("o", info.ID, time.Time{}, time.Time{})
	want := 50 / float64(got[0].CPUCount)
	if len(got) != 2 || got[0].CPUPercent < want-0.01 || got[0].CPUPercent > want+0.01 {
		t.Fatalf("cpu: %+v; want %.2f%%", got, want)
	}
	if _, err := svc.Usage("other", info.ID, time.Time{}, time.Time{}); err != ErrNotFound {
		t.Fatalf("another owner: %v", err)
	}

	// Bounded: the newest maxSamples, oldest first; start and end select.
	for range maxSamples + 10 {
		tick(time.Second)
		svc.sampleAll()
	}
	l := svc.usage.get(info.ID, false)
	l.mu.Lock()
	all := l.ordered()
	l.mu.Unlock()
	if len(all) != maxSamples {
		t.Fatalf("%d samples kept", len(all))
	}
	for i := 1; i < len(all); i++ {
		if !all[i].Time.After(all[i-1].Time) {
			t.Fatalf("sample %d out of order", i)
		}
	}
	last := clock()
	got, _ = svc.Usage("o", info.ID, last.Add(-2*time.Second), last.Add(-time.Second))
	if len(got) != 2 {
		t.Fatalf("from start to end: %d samples", len(got))
	}

	// Forgotten with the sandbox, and never read once it closes.
	svc.Delete("o", info.ID)
	svc.sampleAll()
	if _, err := svc.Usage("o", info.ID, time.Time{}, time.Time{}); err != ErrNotFound {
		t.Fatalf("after delete: %v", err)
	}
	if svc.usage.get(info.ID, false) != nil {
		t.Fatal("the samples outlived the sandbox")
	}
}

// Sampling while sandboxes are deleted never reads one that closed (the
// idle sandbox panics if it is).
func TestUsageNeverReadsAClosedSandbox(t *testing.T) {
	svc := New(Config{Backend: newFakeBackend(), UsageInterval: time.Millisecond, MaxPerOwner: 1000})
	defer svc.Close()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				info, err := svc.Create(context.Background(), CreateRequest{Owner: "o"})
				if err != nil {
					t.Error(err)
					return
				}
				svc.Usage("o", info.ID, time.Time{}, time.Time{})
				svc.Delete("o", info.ID)
			}
		}()
	}
	wg.Wait()
}

package service

import (
	"runtime"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A sandbox's metrics over time (E2B's getMetrics): the service samples
// every live sandbox's CPU, memory and disk every UsageInterval, and keeps
// the last maxSamples of each (bounded memory: a few tens of kilobytes
// per sandbox), forgotten with the sandbox. A backend that cannot tell a
// figure reports zero for it.
const (
	defaultUsageInterval = 5 * time.Second
	maxSamples           = 360 // 30 minutes at the default interval
)

// Sample is a sandbox's use at one time.
type Sample struct {
	Time       time.Time `json:"time"`
	CPUCount   int       `json:"cpu_count" doc:"CPUs the sandbox may use"`
	CPUPercent float64   `json:"cpu_used_pct" doc:"CPU used since the previous sample, percent of all its CPUs"`
	Memory     int64     `json:"mem_used" doc:"bytes of memory in use"`
	MemoryMax  int64     `json:"mem_total" doc:"the sandbox's memory limit, bytes"`
	Disk       int64     `json:"disk_used" doc:"bytes used on the sandbox's disk (its workspace and /tmp)"`
	DiskMax    int64     `json:"disk_total" doc:"the sandbox's disk limit, bytes"`

	cpu time.Duration // cumulative CPU time, for the next sample's percentage
}

// usageLog is one sandbox's samples, a ring.
type usageLog struct {
	mu      sync.Mutex
	closing bool // the sandbox is closing: it is not sampled any more
	samples []Sample
	next    int // where the next sample goes once the ring is full
}

// usageLogs are every live sandbox's samples, by sandbox ID.
type usageLogs struct {
	mu   sync.Mutex
	logs map[string]*usageLog
}

func (u *usageLogs) get(id string, create bool) *usageLog {
	u.mu.Lock()
	defer u.mu.Unlock()
	l := u.logs[id]
	if l == nil && create {
		if u.logs == nil {
			u.logs = map[string]*usageLog{}
		}
		l = &usageLog{}
		u.logs[id] = l
	}
	return l
}

// closing forgets a sandbox's samples and waits for a sample being taken
// to end: Close never runs beside Usage.
func (u *usageLogs) closing(id string) {
	u.mu.Lock()
	l := u.logs[id]
	delete(u.logs, id)
	u.mu.Unlock()
	if l != nil {
		l.mu.Lock()
		l.closing = true
		l.mu.Unlock()
	}
}

func (l *usageLog) add(s Sample) {
	if len(l.samples) < maxSamples {
		l.samples = append(l.samples, s)
		return
	}
	l.samples[l.next] = s
	l.next = (l.next + 1) % maxSamples
}

func (l *usageLog) last() (Sample, bool) {
	if len(l.samples) == 0 {
		return Sample{}, false
	}
	return l.samples[(l.next+len(l.samples)-1)%len(l.samples)], true
}

// ordered returns the samples, oldest first.
func (l *usageLog) ordered() []Sample {
	out := make([]Sample, 0, len(l.samples)+1)
	out = append(out, l.samples[l.next:]...)
	return append(out, l.samples[:l.next]...)
}

// sample reads b's use now; prev is the sample before (zero: none, and
// the CPU percentage is over the sandbox's life).
func (s *Service) sample(b *Box, prev Sample) Sample {
	now := s.cfg.Now()
	smp := Sample{Time: now, CPUCount: runtime.NumCPU(), MemoryMax: b.limits.Memory, DiskMax: b.limits.Disk}
	if r, ok := b.Sandbox().(sandbox.UsageReporter); ok {
		if u, err := r.Usage(); err == nil {
			smp.cpu, smp.Memory = u.CPU, u.Memory
		}
	}
	if d, ok := b.Sandbox().Workspace().(sandbox.DiskUser); ok {
		if used, err := d.DiskUsed(); err == nil {
			smp.Disk = used
		}
	}
	since, cpu0 := b.createdAt, time.Duration(0)
	if !prev.Time.IsZero() {
		since, cpu0 = prev.Time, prev.cpu
	}
	if wall := now.Sub(since); wall > 0 && smp.cpu > cpu0 {
		smp.CPUPercent = min(100, 100*float64(smp.cpu-cpu0)/float64(wall)/float64(smp.CPUCount))
	}
	return smp
}

// sampling tells whether b may be sampled, l.mu held: it is not closing.
// remove takes b out of the live sandboxes before it marks its log
// closing (waiting for l.mu), so a sandbox still live here is not closed
// before l.mu is let go, even if its log was made after remove looked.
func (s *Service) sampling(b *Box, l *usageLog) bool {
	if l.closing {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.boxes[b.id] == b
}

// sampleAll takes one sample of every live sandbox.
func (s *Service) sampleAll() {
	for _, b := range s.boxesOf("") {
		l := s.usage.get(b.id, true)
		l.mu.Lock()
		if s.sampling(b, l) {
			prev, _ := l.last()
			l.add(s.sample(b, prev))
		}
		l.mu.Unlock()
	}
	// A sandbox removed between the listing and get left a log behind.
	s.mu.Lock()
	live := make(map[string]bool, len(s.boxes))
	for id := range s.boxes {
		live[id] = true
	}
	s.mu.Unlock()
	s.usage.mu.Lock()
	for id := range s.usage.logs {
		if !live[id] {
			delete(s.usage.logs, id)
		}
	}
	s.usage.mu.Unlock()
}

func (s *Service) sampleUsage() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.UsageInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.sampleAll()
	}
}

// Usage returns a sandbox's samples from start to end (zero: unbounded),
// oldest first, and one taken now when end is zero or later: the figures
// of a sandbox that has just started are there at once.
func (s *Service) Usage(owner, id string, start, end time.Time) ([]Sample, error) {
	b, err := s.lookup(owner, id)
	if err != nil {
		return nil, err
	}
	l := s.usage.get(id, true)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !s.sampling(b, l) {
		return nil, ErrNotFound
	}
	all := l.ordered()
	prev, _ := l.last()
	now := s.sample(b, prev)
	all = append(all, now)
	out := make([]Sample, 0, len(all))
	for _, smp := range all {
		if (start.IsZero() || !smp.Time.Before(start)) && (end.IsZero() || !smp.Time.After(end)) {
			out = append(out, smp)
		}
	}
	return out, nil
}

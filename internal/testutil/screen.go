package testutil

import (
	"io"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Screen collects what a terminal shows (a command's output read
// through Watch), for tests to wait on.
type Screen struct {
	mu   sync.Mutex
	buf  []byte
	from int // where the next Expect looks from
	eof  chan struct{}
}

// Watch reads r until its end into a Screen.
func Watch(r io.Reader) *Screen {
	s := &Screen{eof: make(chan struct{})}
	go func() {
		defer close(s.eof)
		p := make([]byte, 32<<10)
		for {
			n, err := r.Read(p)
			s.mu.Lock()
			s.buf = append(s.buf, p[:n]...)
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return s
}

// EOF is closed once the output has ended.
func (s *Screen) EOF() <-chan struct{} { return s.eof }

// Shown is everything the terminal has shown.
func (s *Screen) Shown() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.buf)
}

// Expect waits until the terminal shows a match of re past what earlier
// expects consumed, and returns it. The bound is for a failing test only.
func (s *Screen) Expect(t *testing.T, re string) []string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.mu.Lock()
		loc := rx.FindSubmatchIndex(s.buf[s.from:])
		var m []string
		if loc != nil {
			for i := 0; i < len(loc); i += 2 {
				if loc[i] >= 0 {
					m = append(m, string(s.buf[s.from+loc[i]:s.from+loc[i+1]]))
				} else {
					m = append(m, "")
				}
			}
			s.from += loc[1]
		}
		shown := string(s.buf)
		s.mu.Unlock()
		if m != nil {
			return m
		}
		select {
		case <-s.eof:
			s.mu.Lock()
			shown = string(s.buf)
			s.mu.Unlock()
			if rx.MatchString(shown[min(s.from, len(shown)):]) {
				continue
			}
			t.Fatalf("the terminal ended without showing %q; it showed %q", re, shown)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the terminal did not show %q; it showed %q", re, shown)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TypeIn writes s to p's input (its terminal's).
func TypeIn(t *testing.T, p sandbox.Process, s string) {
	t.Helper()
	if _, err := io.WriteString(p.Stdin(), s); err != nil {
		t.Fatal(err)
	}
}

package sandbox

import (
	"errors"
	"strings"
	"testing"
)

func TestAllOrNone(t *testing.T) {
	closed := map[int]bool{}
	closeCopy := func(i int) { closed[i] = true }
	if err := AllOrNone([]error{nil, nil}, closeCopy); err != nil || len(closed) != 0 {
		t.Fatalf("all made: %v, closed %v", err, closed)
	}
	boom := errors.New("boom")
	err := AllOrNone([]error{nil, boom, errors.New("other")}, closeCopy)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "2 of 3 copies failed") || len(closed) != 3 {
		t.Fatalf("two failed: %v, closed %v", err, closed)
	}
	if err := AllOrNone([]error{boom}, func(int) {}); err == nil || err.Error() != "fork: boom" {
		t.Fatalf("one failed: %v", err)
	}
}

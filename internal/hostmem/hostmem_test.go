package hostmem

import (
	"errors"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

func TestReadAndFits(t *testing.T) {
	available, total, err := Read()
	if err != nil || total <= 0 || available <= 0 || available > total {
		t.Fatalf("Read: %d of %d, %v", available, total, err)
	}
	if Reserve(1<<30) != 256<<20 || Reserve(100<<30) != 5<<30 {
		t.Fatalf("reserve: %d, %d", Reserve(1<<30), Reserve(100<<30))
	}
	if all, key := DefaultCeilings(24588536 << 10); all != 22811<<20 || key != 12006<<20 {
		t.Fatalf("ceilings of a 23.4 GiB host: %d MiB, %d MiB per tenant", all>>20, key>>20)
	}
	if all, key := DefaultCeilings(384 << 20); all != 192<<20 || key != 192<<20 {
		t.Fatalf("ceilings of a host smaller than its reserve: %d, %d", all, key)
	}
	if err := Fits(1<<30, 8<<30, 16<<30, "the copies"); err != nil {
		t.Fatal(err)
	}
	if err := Fits(7900<<20, 8<<30, 16<<30, "the copies"); !errors.Is(err, sandbox.ErrNoRoom) {
		t.Fatalf("over the reserve: %v", err)
	}
}

// TestRoom refuses what would leave the host less than its reserve, as
// the host reads now, and refuses nothing where it cannot be read.
func TestRoom(t *testing.T) {
	host := func() (int64, int64, error) { return 1 << 30, 4 << 30, nil }
	if err := Room(host, 512<<20, "the copies"); err != nil {
		t.Fatalf("512 MiB of 1 GiB available: %v", err)
	}
	if err := Room(host, 900<<20, "the copies"); !errors.Is(err, sandbox.ErrNoRoom) {
		t.Fatalf("900 MiB of 1 GiB available, 256 MiB kept: %v", err)
	}
	unknown := func() (int64, int64, error) { return 0, 0, errors.New("no /proc") }
	if err := Room(unknown, 1<<40, "the copies"); err != nil {
		t.Fatalf("a host whose memory cannot be read: %v", err)
	}
}

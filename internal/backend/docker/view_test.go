package docker

import (
	"os"
	"slices"
	"testing"
)

// The cost of a container's view: its directories, passwd and group, and
// its overlays mounted, then unmounted and removed.
func BenchmarkView(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	if err := os.Mkdir(dir+"/"+viewsDir, 0o700); err != nil {
		b.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	root, _, err := newRoot(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer root.close()
	r := &Runtime{cfg: Config{StateDir: dir, Exe: exe}, root: root}
	b.ResetTimer()
	for b.Loop() {
		v, err := r.newView("bench", 2_000_001_000, 2_000_001_000, 128<<20)
		if err != nil {
			b.Fatal(err)
		}
		if err := v.close(); err != nil {
			b.Fatal(err)
		}
	}
}

// A container's MaskedPaths keep Docker's defaults, which they replace,
// and name each path once; under gVisor they are Docker's.
func TestMaskedPaths(t *testing.T) {
	v := &view{procMasked: []string{"kcore", "locks", "sys/kernel/random/boot_id", "keys"}}
	got := v.maskedPaths()
	want := append(slices.Clone(dockerMasked), "/proc/locks", "/proc/sys/kernel/random/boot_id")
	if !slices.Equal(got, want) {
		t.Errorf("masked paths %v, want %v", got, want)
	}
	if got := (&view{}).maskedPaths(); got != nil {
		t.Errorf("masked paths under gVisor %v, want nil (Docker's)", got)
	}
}

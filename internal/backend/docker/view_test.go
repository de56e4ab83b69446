package docker

import (
	"os"
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
		v, err := r.newView("bench", 2_000_001_000, 2_000_001_000)
		if err != nil {
			b.Fatal(err)
		}
		if err := v.close(); err != nil {
			b.Fatal(err)
		}
	}
}

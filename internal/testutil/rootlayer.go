package testutil

import (
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/hostroot"
)

// RootLayer makes, in dir, an image layer of the host's python3, a shell
// and a few programs (hostroot.Layer): a small root a template's sandbox
// can run code and commands in.
func RootLayer(t testing.TB, dir string) {
	t.Helper()
	RequirePython(t)
	if err := hostroot.Layer(dir, ""); err != nil {
		t.Fatal(err)
	}
}

// TarDir writes the tree at dir as an uncompressed tar (hostroot.Tar).
func TarDir(t testing.TB, dir string) []byte {
	t.Helper()
	b, err := hostroot.Tar(dir)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

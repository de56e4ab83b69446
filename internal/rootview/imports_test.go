package rootview

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// No backend imports another: what several share lives below them (this
// package; container, which only the container backends use). A backend
// that imported native for its helpers would carry all of native with it.
// Runs without root.
func TestBackendsImportNoOther(t *testing.T) {
	const prefix = "github.com/vivarium-sandbox/vivarium/internal/backend/"
	shared := map[string]bool{"container": true}
	backends, err := os.ReadDir(filepath.Join("..", "backend"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range backends {
		if !b.IsDir() || shared[b.Name()] {
			continue
		}
		files, err := filepath.Glob(filepath.Join("..", "backend", b.Name(), "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			ast, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range ast.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				other, ok := strings.CutPrefix(path, prefix)
				if ok && other != b.Name() && !shared[other] {
					t.Errorf("%s imports backend %s", f, other)
				}
			}
		}
	}
}

package native_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A sandbox's init is this package's init function: the packages it
// imports are initialised in every sandbox, before it runs. The image
// store's registry and archive code is not among them (internal/layers
// has what a sandbox's root needs of the store).
func TestInitImportsNoRegistryCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/vivarium-sandbox/vivarium/internal/backend/native").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.Contains(p, "go-containerregistry") || strings.HasSuffix(p, "/internal/image") || strings.HasSuffix(p, "/internal/template") {
			t.Errorf("the native backend imports %s", p)
		}
	}
}

package native

import (
	"strings"
	"testing"
)

// Layer paths that the overlay's option string would split are refused.
func TestOverlayLayerNames(t *testing.T) {
	for _, p := range []string{"/a:b", "/a,upperdir=/x", `/a\b`} {
		if err := mountOverlay(p, "/empty", t.TempDir()); err == nil || !strings.Contains(err.Error(), "overlay layer") {
			t.Errorf("layer %q: %v, want it refused", p, err)
		}
	}
}

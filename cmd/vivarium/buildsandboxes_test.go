package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/image"
)

// A key's build makes the server pull a base only from a registry the
// operator named: another registry (the host's network, a cloud's
// metadata) is refused before any connection, saying how to allow it.
func TestServeBuilderPullsOnlyFromNamedRegistries(t *testing.T) {
	store, err := openImages(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sb := &serveBuilder{store: store, registries: map[string]bool{"index.docker.io": true}}
	for _, ref := range []string{"10.0.0.1:5000/tools:1", "169.254.169.254/x:1", "localhost:5000/y:1", "ghcr.io/a/b:1"} {
		err := sb.pullBase(context.Background(), ref, io.Discard)
		if !errors.Is(err, image.ErrNotFound) || !strings.Contains(err.Error(), "--pull-registry") {
			t.Errorf("%s: %v", ref, err)
		}
	}
}

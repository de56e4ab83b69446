package sandbox

import (
	"strings"
	"testing"
)

// Whatever headers arrive, accepted metadata is within the bounds.
func FuzzMetadataFromHeader(f *testing.F) {
	f.Add("X-Metadata-Author", "mish", "X-Metadata-", "v")
	f.Add("X-Metadata-A b", strings.Repeat("v", MaxMetadataValueLen+1), "Other", "x")
	f.Add("X-Metadata-\x00", "a\x00b", "X-Metadata-é", "v")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		md, err := MetadataFromHeader(map[string][]string{k1: {v1}, k2: {v2}})
		if err != nil {
			return
		}
		if len(md) > MaxMetadataEntries {
			t.Fatalf("%d entries", len(md))
		}
		for k, v := range md {
			if k == "" || len(k) > MaxMetadataKeyLen || len(v) > MaxMetadataValueLen || strings.IndexByte(v, 0) >= 0 {
				t.Fatalf("accepted %q: %q", k, v)
			}
			for _, r := range k {
				if r <= ' ' || r > '~' {
					t.Fatalf("accepted key %q", k)
				}
			}
		}
	})
}

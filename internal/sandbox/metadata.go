package sandbox

import (
	"fmt"
	"strings"
)

// WorkspaceLinker is a Workspace that reads symbolic links (E2B's file
// info names a link's target).
type WorkspaceLinker interface {
	// Readlink returns the target of the link name as it is written,
	// never following it.
	Readlink(name string) (string, error)
}

// WorkspaceMetadata is a Workspace that keeps metadata on files: string
// keys and values, stored with the file (as extended attributes), so
// that programs in the sandbox see them too. Only regular files and
// directories carry metadata.
type WorkspaceMetadata interface {
	// FileMetadata returns name's metadata (none: an empty map). What
	// is over the bounds below is left out.
	FileMetadata(name string) (map[string]string, error)
	// SetFileMetadata adds md to name's metadata; over the bounds, it
	// fails with ErrInvalidSpec and changes nothing.
	SetFileMetadata(name string, md map[string]string) error
}

// Bounds on a file's metadata.
const (
	MaxMetadataEntries  = 32
	MaxMetadataKeyLen   = 128
	MaxMetadataValueLen = 1024
)

// CheckMetadata checks metadata against the bounds: at most
// MaxMetadataEntries keys of 1 to MaxMetadataKeyLen bytes, printable ASCII
// without NUL, and values of at most MaxMetadataValueLen bytes.
func CheckMetadata(md map[string]string) error {
	if len(md) > MaxMetadataEntries {
		return fmt.Errorf("%w: at most %d metadata entries per file", ErrInvalidSpec, MaxMetadataEntries)
	}
	for k, v := range md {
		if k == "" || len(k) > MaxMetadataKeyLen || strings.IndexFunc(k, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
			return fmt.Errorf("%w: metadata key %q: 1 to %d printable ASCII characters without spaces",
				ErrInvalidSpec, k, MaxMetadataKeyLen)
		}
		if len(v) > MaxMetadataValueLen || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("%w: metadata %q: a value of at most %d bytes, without NUL",
				ErrInvalidSpec, k, MaxMetadataValueLen)
		}
	}
	return nil
}

// MetadataHeader starts the HTTP headers that carry a file's metadata,
// one per key (X-Metadata-KEY: VALUE), as E2B's SDKs send it on upload;
// Vivarium's own API takes and gives it the same way.
const MetadataHeader = "X-Metadata-"

// MetadataFromHeader reads metadata from a request's headers (canonical
// keys, as net/http gives them), within the bounds of CheckMetadata.
// Header names are case-insensitive, so keys are lower-cased.
func MetadataFromHeader(h map[string][]string) (map[string]string, error) {
	var md map[string]string
	for k, vs := range h {
		key, ok := strings.CutPrefix(k, MetadataHeader)
		if !ok || len(vs) == 0 {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[strings.ToLower(key)] = vs[0]
		if len(md) > MaxMetadataEntries {
			break // CheckMetadata says so
		}
	}
	return md, CheckMetadata(md)
}

package httpapi

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// File metadata over Vivarium's API, as E2B's SDKs send it: a PUT sets
// the X-Metadata-KEY headers it carries on the file; a GET answers the
// file's metadata in the same headers (keys lower-cased).

// fileMetadata reads an upload's metadata, refused where the backend's
// workspace keeps none.
func (s *Server) fileMetadata(ws sandbox.Workspace, h http.Header) (map[string]string, error) {
	md, err := sandbox.MetadataFromHeader(h)
	if err != nil {
		return nil, err
	}
	if _, ok := ws.(sandbox.WorkspaceMetadata); len(md) > 0 && !ok {
		return nil, fmt.Errorf("%w: file metadata on this backend's files", sandbox.ErrUnsupported)
	}
	return md, nil
}

// setMetadataHeaders answers a file's metadata as X-Metadata-KEY headers.
func setMetadataHeaders(h http.Header, ws sandbox.Workspace, name string) {
	m, ok := ws.(sandbox.WorkspaceMetadata)
	if !ok {
		return
	}
	md, err := m.FileMetadata(name)
	if err != nil {
		return
	}
	for k, v := range md {
		// Keys and values are the sandbox's: only what a header may
		// carry is answered.
		if validHeaderName(k) && validHeaderValue(v) {
			h[sandbox.MetadataHeader+k] = []string{v}
		}
	}
}

func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validHeaderName: an HTTP token (RFC 9110), which is what E2B's SDKs
// accept as a metadata key too.
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// Package sandboxid makes and reads the ids of sandboxes. A sandbox of a
// cluster's node names the node in its id (sb_<node>_<24 hex digits>), so
// that a gateway sends every request for it to that node without asking
// anyone (issue 16, docs/kubernetes.md); a sandbox of a server on its own
// has none (sb_<24 hex digits>).
package sandboxid

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
)

var (
	node    = regexp.MustCompile(`^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$`)
	id      = regexp.MustCompile(`^sb_(?:([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)_)?[0-9a-f]{24}$`)
	session = regexp.MustCompile(`^([a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)\.[0-9a-f]{32}$`)
)

// ValidNode reports whether name can be a node's name in ids: a DNS label
// (what Kubernetes names its nodes and pods with), lower case.
func ValidNode(name string) bool { return node.MatchString(name) }

// New returns a new random id of a sandbox of node ("": none).
func New(node string) string {
	b := make([]byte, 12)
	rand.Read(b)
	if node == "" {
		return "sb_" + hex.EncodeToString(b)
	}
	return "sb_" + node + "_" + hex.EncodeToString(b)
}

// Valid reports whether s is a sandbox id, of a node or not.
func Valid(s string) bool { return id.MatchString(s) }

// Node returns the node a sandbox id names; ok is false for an id that
// names none, or is no id.
func Node(s string) (name string, ok bool) {
	m := id.FindStringSubmatch(s)
	if m == nil || m[1] == "" {
		return "", false
	}
	return m[1], true
}

// NewSession returns a new random id of an MCP session of node
// (<node>.<32 hex digits>): a gateway sends the session's requests to
// its node, as it does a sandbox's.
func NewSession(node string) string {
	b := make([]byte, 16)
	rand.Read(b)
	return node + "." + hex.EncodeToString(b)
}

// SessionNode returns the node an MCP session's id names.
func SessionNode(s string) (name string, ok bool) {
	m := session.FindStringSubmatch(s)
	if m == nil {
		return "", false
	}
	return m[1], true
}

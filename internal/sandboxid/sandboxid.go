// Package sandboxid makes and reads the ids of what a server keeps:
// sandboxes (sb_), snapshots (snap_), volumes (vol_) and a cluster's
// templates (tpl_). What a cluster's
// node keeps names the node in its id (sb_<node>_<24 hex digits>), so that
// a gateway sends every request for it to that node without asking anyone
// (issue 16, docs/kubernetes.md); what a server on its own keeps has none
// (sb_<24 hex digits>).
package sandboxid

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"strings"
	"sync"
)

// A Kind of id: its prefix.
type Kind string

// The kinds of ids.
const (
	Sandbox  Kind = "sb"
	Snapshot Kind = "snap"
	Volume   Kind = "vol"
	// Template: a template a cluster's node builds (E2B's build API),
	// whose builds and uploads are that node's.
	Template Kind = "tpl"
)

const nodeRE = `[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?`

// The patterns, compiled on first use: every process of the binary (a
// sandbox's init too) would compile them at its start.
var (
	node = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^` + nodeRE + `$`) })
	ids  = sync.OnceValue(func() map[Kind]*regexp.Regexp {
		m := map[Kind]*regexp.Regexp{}
		for _, k := range []Kind{Sandbox, Snapshot, Volume, Template} {
			m[k] = regexp.MustCompile(`^` + string(k) + `_(?:(` + nodeRE + `)_)?[0-9a-f]{24}$`)
		}
		return m
	})
	session = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^(` + nodeRE + `)\.[0-9a-f]{32}$`) })
)

// MaxName is the length of the longest name a snapshot may have.
const MaxName = 63

// ValidName reports whether s can be a snapshot's name, which finds it as
// its id does: 1 to 63 lowercase letters, digits, '.', '_' and '-', a
// letter or digit first, and never an id's shape.
func ValidName(s string) bool {
	if s == "" || len(s) > MaxName || Snapshot.Valid(s) || strings.HasPrefix(s, string(Snapshot)+"_") {
		return false
	}
	for i, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '.' || c == '_' || c == '-')) {
			return false
		}
	}
	return true
}

// ValidNode reports whether name can be a node's name in ids: a DNS label
// (what Kubernetes names its nodes and pods with), lower case.
func ValidNode(name string) bool { return node().MatchString(name) }

// New returns a new random id of a sandbox of node ("": none).
func New(node string) string { return Sandbox.New(node) }

// Valid reports whether s is a sandbox id, of a node or not.
func Valid(s string) bool { return Sandbox.Valid(s) }

// Node returns the node a sandbox id names; ok is false for an id that
// names none, or is no id.
func Node(s string) (name string, ok bool) { return Sandbox.Node(s) }

// New returns a new random id of this kind, of node ("": none).
func (k Kind) New(node string) string {
	b := make([]byte, 12)
	rand.Read(b)
	if node == "" {
		return string(k) + "_" + hex.EncodeToString(b)
	}
	return string(k) + "_" + node + "_" + hex.EncodeToString(b)
}

// Valid reports whether s is an id of this kind, of a node or not.
func (k Kind) Valid(s string) bool { return ids()[k].MatchString(s) }

// Node returns the node an id of this kind names; ok is false for an id
// that names none, or is no id of this kind.
func (k Kind) Node(s string) (name string, ok bool) {
	m := ids()[k].FindStringSubmatch(s)
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
	m := session().FindStringSubmatch(s)
	if m == nil {
		return "", false
	}
	return m[1], true
}

package sandboxid

import (
	"strings"
	"testing"
)

func TestIDs(t *testing.T) {
	plain, ofNode := New(""), New("node-1")
	for _, c := range []struct {
		id    string
		valid bool
		node  string
	}{
		{plain, true, ""},
		{ofNode, true, "node-1"},
		{"sb_0123456789abcdef01234567", true, ""},
		{"sb_a_0123456789abcdef01234567", true, "a"},
		{"sb_Node_0123456789abcdef01234567", false, ""},
		{"sb_-x_0123456789abcdef01234567", false, ""},
		{"sb_x__0123456789abcdef01234567", false, ""},
		{"sb_0123456789abcdef0123456", false, ""},
		{"sb_n/../x_0123456789abcdef01234567", false, ""},
		{"xx_0123456789abcdef01234567", false, ""},
	} {
		if Valid(c.id) != c.valid {
			t.Errorf("Valid(%q) = %v", c.id, !c.valid)
		}
		n, ok := Node(c.id)
		if n != c.node || ok != (c.node != "") {
			t.Errorf("Node(%q) = %q, %v", c.id, n, ok)
		}
	}
	if New("") == plain {
		t.Fatal("ids repeat")
	}
	if n, ok := SessionNode(NewSession("node-1")); !ok || n != "node-1" {
		t.Fatalf("a session's node: %q %v", n, ok)
	}
	for _, bad := range []string{"node-1", "node-1.abc", "Node.0123456789abcdef0123456789abcdef", ".0123456789abcdef0123456789abcdef"} {
		if _, ok := SessionNode(bad); ok {
			t.Errorf("SessionNode(%q) ok", bad)
		}
	}
	for name, want := range map[string]bool{"node-1": true, "a": true, "-a": false, "a-": false, "A": false, "a_b": false, "": false} {
		if ValidNode(name) != want {
			t.Errorf("ValidNode(%q) = %v", name, !want)
		}
	}
}

func TestKinds(t *testing.T) {
	for _, k := range []Kind{Snapshot, Volume} {
		id := k.New("node-2")
		if n, ok := k.Node(id); !ok || n != "node-2" || !k.Valid(id) {
			t.Errorf("%s: %q: Node = %q, %v", k, id, n, ok)
		}
		if plain := k.New(""); !k.Valid(plain) {
			t.Errorf("%s: %q not valid", k, plain)
		} else if _, ok := k.Node(plain); ok {
			t.Errorf("%s: %q names a node", k, plain)
		}
		if Sandbox.Valid(id) || Valid(id) {
			t.Errorf("%q is taken for a sandbox id", id)
		}
	}
	if Snapshot.Valid(Volume.New("a")) || Volume.Valid("vol_a_0123") {
		t.Error("a volume id is taken for a snapshot id, or a short one is valid")
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "model-1.b_2", "0", strings.Repeat("a", MaxName)} {
		if !ValidName(ok) {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "A", "-a", ".a", "_a", "a/b", "a b", "a:latest", "é", strings.Repeat("a", MaxName+1),
		Snapshot.New(""), Snapshot.New("node-1"), "snap_mine"} {
		if ValidName(bad) {
			t.Errorf("%q taken", bad)
		}
	}
}

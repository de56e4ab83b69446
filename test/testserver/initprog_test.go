package testserver

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// A vivarium built as make build builds it starts the init program it
// carries inside each sandbox, not itself: every process of a sandbox
// that is no Python is that program.
func TestSandboxesStartTheInitProgram(t *testing.T) {
	testutil.RequireRoot(t)
	const parent = "vivarium-test-initprog"
	srv := Start(t, Build(t), Options{CgroupParent: parent, UIDBase: native.DefaultUIDBase + 36<<24, Keys: []string{"k"}})
	req, _ := http.NewRequest("POST", srv.URL+"/v1/sandboxes", bytes.NewBufferString(`{}`))
	req.Header.Set("Authorization", "Bearer "+srv.Keys[0])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb struct{ ID string }
	if err := json.NewDecoder(resp.Body).Decode(&sb); err != nil || sb.ID == "" {
		t.Fatalf("create: %d %v", resp.StatusCode, err)
	}
	var inits []string
	for _, g := range testutil.CgroupsUnder(parent) { // a key's group holds its sandboxes'
		filepath.WalkDir(g, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			procs, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			for _, pid := range strings.Fields(string(procs)) {
				exe, err := os.Readlink("/proc/" + pid + "/exe")
				if err == nil && !strings.Contains(filepath.Base(exe), "python") {
					inits = append(inits, exe)
				}
			}
			return nil
		})
	}
	if len(inits) == 0 {
		t.Fatal("no sandbox init found")
	}
	for _, exe := range inits {
		if !strings.HasPrefix(filepath.Base(exe), "vivarium-init-") {
			t.Errorf("a sandbox's init is %s, not the init program", exe)
		}
	}
}

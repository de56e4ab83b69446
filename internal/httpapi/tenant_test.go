package httpapi_test

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/gvisor"
	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// tenantGroups maps each tenant's group under parent, in the pids
// hierarchy (or the unified one), to the sandbox groups in it that hold
// processes.
func tenantGroups(t *testing.T, tenantParent string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, root := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		entries, err := os.ReadDir(filepath.Join(root, tenantParent))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if !e.IsDir() || strings.HasPrefix(e.Name(), "zygote-") {
				continue
			}
			out[e.Name()] = nil
			subs, _ := os.ReadDir(filepath.Join(root, tenantParent, e.Name()))
			for _, s := range subs {
				b, _ := os.ReadFile(filepath.Join(root, tenantParent, e.Name(), s.Name(), "cgroup.procs"))
				if s.IsDir() && len(strings.Fields(string(b))) > 0 {
					out[e.Name()] = append(out[e.Name()], s.Name())
				}
			}
		}
		return out
	}
	return out
}

// With tenant grouping, two keys' sandboxes (stateful and one-shot) land in
// two groups, one per key; a key's group goes with its last sandbox, and
// nothing is left once the server closes.
func TestTenantGroups(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	const parent = "vivarium-httpapi-tenant-test"
	b, err := native.New(native.Config{CgroupParent: parent, UIDBase: native.DefaultUIDBase + 9<<24})
	if err != nil {
		t.Fatal(err)
	}
	testTenantGroups(t, b, parent)
}

// The same with the gvisor backend, whose runsc is given the sandbox's
// group's path in its key's group, and makes it in hierarchies Vivarium
// makes no groups in (cpuset, devices ...): the key's group goes there too.
func TestTenantGroupsGvisor(t *testing.T) {
	testutil.RequireRoot(t)
	if err := gvisor.Check(); err != nil {
		t.Skip(err)
	}
	const parent = "vivarium-httpapi-tenant-gvisor"
	// ptrace: the platform that works everywhere, kvm included.
	b, err := gvisor.New(gvisor.Config{Platform: "ptrace", CgroupParent: parent, StateDir: "/run/vivarium/httpapi-tenant-gvisor"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	testTenantGroups(t, b, parent)
}

func testTenantGroups(t *testing.T, b sandbox.Backend, parent string) {
	testutil.RemoveStaleCgroups(parent)
	svc := service.New(service.Config{Backend: b, MaxPerOwner: 3, Tenants: true})
	srv := httptest.NewServer(httpapi.New(svc, keys{"alice-key": "key_alice", "bob-key": "key_bob"}, nil))
	defer func() {
		srv.Close()
		svc.Close()
		if left := testutil.CgroupsUnder(parent); len(left) > 0 {
			t.Errorf("cgroups left: %v", left)
		}
	}()
	alice := client{t, srv.URL, "alice-key"}
	bob := client{t, srv.URL, "bob-key"}

	a1 := alice.json("POST", "/v1/sandboxes", nil, 201)
	a2 := alice.json("POST", "/v1/sandboxes", nil, 201)
	bob.json("POST", "/v1/sandboxes", nil, 201)
	if got := a1["limits"].(map[string]any)["io_read_bps"]; got != float64(sandbox.DefaultIOReadBPS) {
		t.Errorf("limits.io_read_bps = %v, want the default %d", got, sandbox.DefaultIOReadBPS)
	}
	groups := tenantGroups(t, parent)
	if len(groups) != 2 || len(groups["key_alice"]) != 2 || len(groups["key_bob"]) != 1 {
		t.Fatalf("want key_alice with 2 sandboxes and key_bob with 1, got %v", groups)
	}

	// A one-shot run goes to its key's group too.
	done := make(chan map[string]any)
	go func() {
		done <- bob.json("POST", "/v1/execute", map[string]any{"code": "import time; time.sleep(2); print('done')"}, 200)
	}()
	testutil.WaitFor(t, 60*time.Second, "bob's one-shot in bob's group", func() bool {
		return len(tenantGroups(t, parent)["key_bob"]) == 2
	})
	if res := <-done; res["stdout"] != "done\n" {
		t.Errorf("one-shot: %v", res)
	}

	alice.json("DELETE", "/v1/sandboxes/"+a1["id"].(string), nil, 204)
	if _, ok := tenantGroups(t, parent)["key_alice"]; !ok {
		t.Error("alice's group went with her first sandbox")
	}
	alice.json("DELETE", "/v1/sandboxes/"+a2["id"].(string), nil, 204)
	groups = tenantGroups(t, parent)
	if _, ok := groups["key_alice"]; ok {
		t.Errorf("alice's group outlived her last sandbox: %v", groups)
	}
	if len(groups["key_bob"]) < 1 {
		t.Errorf("bob's sandbox went with alice's: %v", groups)
	}
}

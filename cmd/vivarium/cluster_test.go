package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/gateway"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/kubetest"
)

// clusterNS is the namespace of the cluster tests' Leases.
const clusterNS = "vivarium-test"

// clusterRBAC gives each node its own Lease (get, update, delete by name;
// create, which RBAC cannot restrict by name), the reading of the other
// Leases and of the keys' Secrets, and the gateways the reading of Leases.
func clusterRBAC(t testing.TB, kc *kubetest.Cluster, nodes []string) {
	t.Helper()
	admin := func(method, path string, body any) {
		t.Helper()
		if code, out := kc.Do(t, kc.AdminToken, method, path, body); code/100 != 2 {
			t.Fatalf("%s %s: %d %s", method, path, code, out)
		}
	}
	admin("POST", "/api/v1/namespaces", map[string]any{"metadata": map[string]any{"name": clusterNS}})
	rbac := "/apis/rbac.authorization.k8s.io/v1/namespaces/" + clusterNS
	role := func(name string, rules ...map[string]any) {
		admin("POST", rbac+"/roles", map[string]any{"metadata": map[string]any{"name": name}, "rules": rules})
	}
	bind := func(role, user string) {
		admin("POST", rbac+"/rolebindings", map[string]any{
			"metadata": map[string]any{"name": role + "-" + user},
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
			"subjects": []map[string]any{{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}},
		})
	}
	leases := func(verbs []string, names ...string) map[string]any {
		r := map[string]any{"apiGroups": []string{"coordination.k8s.io"}, "resources": []string{"leases"}, "verbs": verbs}
		if len(names) > 0 {
			r["resourceNames"] = names
		}
		return r
	}
	role("vivarium-gateway", leases([]string{"get", "list", "watch"}),
		map[string]any{"apiGroups": []string{""}, "resources": []string{"pods"}, "verbs": []string{"get", "list", "watch"}})
	bind("vivarium-gateway", "gateway")
	// Every node: create a Lease, read the others' (a key's sandboxes on
	// them count against its quota), read the keys' Secrets.
	role("vivarium-node", leases([]string{"create", "list", "watch"}),
		map[string]any{"apiGroups": []string{""}, "resources": []string{"secrets"}, "verbs": []string{"get", "list", "watch"}})
	for _, n := range nodes {
		role("vivarium-node-"+n, leases([]string{"get", "update", "delete"}, "vivarium-node-"+n))
		bind("vivarium-node-"+n, "node-"+n)
		bind("vivarium-node", "node-"+n)
	}
}

// startGateway starts `vivarium gateway` on a free port.
func startGateway(t testing.TB, kc *kubetest.Cluster, tokenFile string, extra ...string) *server {
	t.Helper()
	addr := freePort(t)
	return startVivarium(t, "gateway", "http://"+addr, append([]string{"gateway", "--listen", addr, "--kubeconfig", kc.Kubeconfig("gateway"),
		"--namespace", clusterNS, "--cluster-token-file", tokenFile}, extra...)...)
}

// setPodIP gives node's pod (made if missing, as the chart labels it;
// no kubelet runs it) the IP ip, as a kubelet reports it.
func setPodIP(t *testing.T, kc *kubetest.Cluster, node, ip string) {
	t.Helper()
	pods := "/api/v1/namespaces/" + clusterNS + "/pods"
	code, body := kc.Do(t, kc.AdminToken, "GET", pods+"/"+node, nil)
	if code == 404 {
		kc.Do(t, kc.AdminToken, "POST", "/api/v1/namespaces/"+clusterNS+"/serviceaccounts",
			map[string]any{"metadata": map[string]any{"name": "default"}}) // 409 once made
		code, body = kc.Do(t, kc.AdminToken, "POST", pods, map[string]any{
			"metadata": map[string]any{"name": node,
				"labels": map[string]string{"app.kubernetes.io/name": "vivarium", "app.kubernetes.io/component": "node"}},
			"spec": map[string]any{"automountServiceAccountToken": false,
				"containers": []map[string]any{{"name": "vivarium", "image": "vivarium:test"}}}})
	}
	var pod map[string]any
	if code/100 != 2 || json.Unmarshal(body, &pod) != nil {
		t.Fatalf("node %s's pod: %d %s", node, code, body)
	}
	pod["status"] = map[string]any{"phase": "Running", "podIP": ip, "podIPs": []map[string]string{{"ip": ip}}}
	if code, body := kc.Do(t, kc.AdminToken, "PUT", pods+"/"+node+"/status", pod); code != 200 {
		t.Fatalf("node %s's pod's IP: %d %s", node, code, body)
	}
}

// call sends a JSON request with key (none: "") and decodes a JSON answer.
func call(t testing.TB, key, method, url string, body any, out any) int {
	t.Helper()
	hdr := map[string]string{"Content-Type": "application/json"}
	if key != "" {
		hdr["Authorization"] = "Bearer " + key
	}
	code, b := req(t, method, url, hdr, body)
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, url, code, b, err)
		}
	}
	return code
}

// clusterSandboxes is how many sandboxes TestCluster spreads.
const clusterSandboxes = 300

// TestCluster runs three nodes and two gateways as local processes against
// a real API server and etcd, each with the identity its pod would have,
// and the API keys of the cluster (Secrets): sandboxes made through
// either gateway spread over the nodes by load; every request for one
// reaches its node through either gateway; a key's sandbox quota holds
// across the nodes; another key reaches none of them; a node refuses
// requests without the cluster's token; a node killed with SIGKILL leaves
// routing once its Lease's 3 s are out (how long it took is logged, not
// asserted) and its sandboxes answer state_lost while the others' go on; a restarted gateway loses nothing; a revoked key is
// refused by every node.
func TestCluster(t *testing.T) {
	needSandbox(t)
	nodes := []string{"n1", "n2", "n3"}
	users := []kubetest.User{{Name: "gateway"}}
	for _, n := range nodes {
		users = append(users, kubetest.User{Name: "node-" + n})
	}
	kc := kubetest.Start(t, users...)
	clusterRBAC(t, kc, nodes)
	tok := make([]byte, 24)
	rand.Read(tok)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(hex.EncodeToString(tok)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The cluster's keys, made as an operator makes them.
	newKey := func(name string, max int, more ...string) (token, id string) {
		r := vivarium(t, "", append([]string{"keys", "create", "--cluster", "--kubeconfig", kc.Kubeconfig(kubetest.AdminUser),
			"--namespace", clusterNS, "--json", "--max-sandboxes", fmt.Sprint(max)}, append(more, name)...)...)
		var out struct {
			Token string
			Key   struct{ ID string }
		}
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
			t.Fatalf("keys create --cluster: %d %s %s", r.code, r.stdout, r.stderr)
		}
		return out.Token, out.Key.ID
	}
	key, keyID := newKey("agents", clusterSandboxes)
	other, _ := newKey("other", 0)
	runner, _ := newKey("runner", 0, "--max-executions", "2")

	servers := map[string]*server{}
	for i, n := range nodes {
		// A node killed leaves its sandboxes' groups, emptied as their
		// processes die, which its next start would remove.
		t.Cleanup(func() {
			testutil.WaitFor(t, 10*time.Second, "the killed nodes' groups to empty", func() bool {
				return removeCgroupTree("vivarium-cluster-test-" + n)
			})
		})
		servers[n] = startServer(t, t.TempDir(), "--pool", "0", "--cluster", "--node-name", n,
			"--kubeconfig", kc.Kubeconfig("node-"+n), "--namespace", clusterNS, "--cluster-token-file", tokenFile,
			"--lease-duration", "3s", "--cgroup-parent", "vivarium-cluster-test-"+n,
			"--uid-base", fmt.Sprint(native.DefaultUIDBase+uint32(40+i)<<24), "--uid-ranges", "200",
			"--max-sandboxes", "400", "--max-sandboxes-per-key", "400")
	}
	gws := []*server{startGateway(t, kc, tokenFile), startGateway(t, kc, tokenFile)}
	for _, g := range gws {
		testutil.WaitFor(t, 10*time.Second, "the gateways to see the three nodes", func() bool {
			return healthz(g) == "ok: 3 nodes"
		})
	}

	// A node's API is its gateways': without the token, refused.
	var e struct{ Error struct{ Code string } }
	if code := call(t, key, "POST", servers["n1"].url+"/v1/sandboxes", map[string]any{}, &e); code != 403 || e.Error.Code != "forbidden" {
		t.Fatalf("a node reached without the token: %d %+v", code, e)
	}

	// Sandboxes through either gateway, spread by load.
	ids := make([]string, clusterSandboxes)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, clusterSandboxes)
	for i := range ids {
		wg.Go(func() {
			var info struct{ ID string }
			if code := call(t, key, "POST", gws[i%2].url+"/v1/sandboxes", map[string]any{}, &info); code/100 != 2 {
				errs <- fmt.Errorf("create %d: %d", i, code)
				return
			}
			ids[i] = info.ID
		})
		if i%4 == 3 {
			wg.Wait() // four at a time: two cores
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d sandboxes made through two gateways in %v", clusterSandboxes, time.Since(start).Round(time.Millisecond))
	per := map[string]int{}
	for _, id := range ids {
		n, ok := sandboxid.Node(id)
		if !ok {
			t.Fatalf("a cluster sandbox's id names no node: %s", id)
		}
		per[n]++
	}
	t.Logf("per node: %v", per)
	for _, n := range nodes {
		if per[n] < clusterSandboxes/6 {
			t.Fatalf("node %s got %d of %d sandboxes: %v", n, per[n], clusterSandboxes, per)
		}
	}
	// The key's quota (as many as it has now) holds across the nodes,
	// once their Leases have said what they hold.
	testutil.WaitFor(t, 5*time.Second, "the key's quota to hold across the nodes", func() bool {
		var info struct{ ID string }
		code := call(t, key, "POST", gws[0].url+"/v1/sandboxes", map[string]any{}, &info)
		if code/100 == 2 { // a Lease not renewed yet: not counted
			call(t, key, "DELETE", gws[0].url+"/v1/sandboxes/"+info.ID, nil, nil)
		}
		return code == 429
	})
	// Every sandbox reached through either gateway; another key, none.
	type result struct {
		Results []struct {
			Text         string
			IsMainResult bool `json:"is_main_result"`
		}
	}
	exec := func(gw *server, id, code string) (int, string) {
		var res result
		st := call(t, key, "POST", gw.url+"/v1/sandboxes/"+id+"/execute", map[string]any{"code": code}, &res)
		for _, r := range res.Results {
			if r.IsMainResult {
				return st, r.Text
			}
		}
		return st, ""
	}
	for i, id := range ids {
		if st, _ := exec(gws[i%2], id, fmt.Sprintf("x = %d", i)); st != 200 {
			t.Fatalf("execute in %s through gateway %d: %d", id, i%2, st)
		}
		if st, got := exec(gws[(i+1)%2], id, "x"); st != 200 || got != fmt.Sprint(i) {
			t.Fatalf("%s through the other gateway: %d %q, want %d", id, st, got, i)
		}
	}
	// The executions' audit records are in their nodes' logs too, for
	// the cluster to collect.
	n0, _ := sandboxid.Node(ids[0])
	if l := servers[n0].log.String(); !strings.Contains(l, "msg=audit node="+n0+" kind=execute key_id="+keyID+" sandbox_id="+ids[0]) {
		t.Fatalf("no audit record of %s in node %s's log", ids[0], n0)
	}
	if st := call(t, other, "POST", gws[0].url+"/v1/sandboxes/"+ids[0]+"/execute", map[string]any{"code": "x"}, nil); st != 404 {
		t.Fatalf("another key's execution in the sandbox: %d, want 404", st)
	}
	if st := call(t, "e2b_0000000000000000000000000000000000000000", "GET", gws[0].url+"/v1/sandboxes", nil, nil); st != 401 {
		t.Fatalf("a list with an unknown key: %d, want 401", st)
	}
	var list struct{ Sandboxes []json.RawMessage }
	if call(t, key, "GET", gws[1].url+"/v1/sandboxes", nil, &list); len(list.Sandboxes) != clusterSandboxes {
		t.Fatalf("the gateway lists %d sandboxes, want %d", len(list.Sandboxes), clusterSandboxes)
	}
	if call(t, other, "GET", gws[1].url+"/v1/sandboxes", nil, &list); len(list.Sandboxes) != 0 {
		t.Fatalf("another key lists %d sandboxes", len(list.Sandboxes))
	}

	// MCP over HTTP: a session started through one gateway goes on
	// through the other, on the node its id names.
	mcp := func(gw *server, sid string, body string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", gw.url+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, _ := mcp(gws[0], "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",`+
		`"capabilities":{},"clientInfo":{"name":"test","version":"1"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	if n, ok := sandboxid.SessionNode(sid); resp.StatusCode != 200 || !ok || per[n] == 0 {
		t.Fatalf("an MCP session through the gateway: %d, session %q", resp.StatusCode, sid)
	}
	mcp(gws[1], sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if resp, body := mcp(gws[1], sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != 200 ||
		!strings.Contains(body, "run_python") {
		t.Fatalf("the session through the other gateway: %d %.300s", resp.StatusCode, body)
	}

	clusterKept(t, gws[0].url, gws[1].url, other)
	clusterExecutions(t, gws[0].url, runner)
	clusterHostile(t, gws[1].url, []string{servers["n1"].url, servers["n2"].url, servers["n3"].url, gws[0].url},
		other, runner, hex.EncodeToString(tok))

	// E2B's SDK through a gateway.
	if _, err := os.Stat("../../test/e2b/node_modules/@e2b/code-interpreter"); err == nil {
		cmd := osexec.Command("node", "--test", "--test-reporter=tap", "cluster.e2e.mjs")
		cmd.Dir = "../../test/e2b"
		cmd.Env = append(os.Environ(), "E2B_API_URL="+gws[1].url+"/e2b", "E2B_SANDBOX_URL="+gws[1].url+"/e2b/sandbox",
			"E2B_API_KEY="+other)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("E2B's SDK through the gateway: %v\n%s", err, out)
		}
	} else {
		t.Log("E2B's SDK through the gateway not run: test/e2b's node_modules are not installed (scripts/test.sh installs them)")
	}

	// --verify-pods: a gateway routes to a node only at its pod's IP; a
	// Lease that points elsewhere (written by whoever may write Leases)
	// is ignored.
	for _, n := range nodes {
		setPodIP(t, kc, n, "127.0.0.1")
	}
	vg := startGateway(t, kc, tokenFile, "--verify-pods")
	testutil.WaitFor(t, 10*time.Second, "the verifying gateway to see the three nodes", func() bool {
		return healthz(vg) == "ok: 3 nodes"
	})
	var onN3 string
	for _, id := range ids {
		if n, _ := sandboxid.Node(id); n == "n3" {
			onN3 = id
		}
	}
	setPodIP(t, kc, "n3", "10.255.0.3")
	testutil.WaitFor(t, 10*time.Second, "n3, whose Lease is not at its pod's IP, to leave the verifying gateway's routing", func() bool {
		return healthz(vg) == "ok: 2 nodes"
	})
	if st := call(t, key, "GET", vg.url+"/v1/sandboxes/"+onN3, nil, nil); st != 410 {
		t.Fatalf("a sandbox of a node whose Lease is not at its pod, through a verifying gateway: %d, want 410", st)
	}
	if st := call(t, key, "GET", gws[0].url+"/v1/sandboxes/"+onN3, nil, nil); st != 200 {
		t.Fatalf("the same through a gateway that does not verify: %d, want 200", st)
	}
	setPodIP(t, kc, "n3", "127.0.0.1")
	testutil.WaitFor(t, 10*time.Second, "n3 back in the verifying gateway's routing", func() bool {
		return call(t, key, "GET", vg.url+"/v1/sandboxes/"+onN3, nil, nil) == 200
	})

	// n2 killed: gone from routing once its Lease is out, its sandboxes lost,
	// the others' untouched, new ones on the two left (the key's quota
	// freed of n2's).
	var lost, kept string
	for _, id := range ids {
		if n, _ := sandboxid.Node(id); n == "n2" {
			lost = id
		} else {
			kept = id
		}
	}
	servers["n2"].cmd.Process.Kill()
	killed := time.Now()
	testutil.WaitFor(t, 30*time.Second, "n2's sandbox to answer state_lost", func() bool {
		var e struct{ Error struct{ Code string } }
		return call(t, key, "GET", gws[0].url+"/v1/sandboxes/"+lost, nil, &e) == 410 && e.Error.Code == "state_lost"
	})
	t.Logf("a node killed: out of routing after %v", time.Since(killed).Round(time.Millisecond))
	if st, got := exec(gws[1], kept, "x"); st != 200 || got == "" {
		t.Fatalf("a sandbox of a live node after n2 died: %d %q", st, got)
	}
	for i := range 4 {
		var info struct{ ID string }
		if code := call(t, key, "POST", gws[i%2].url+"/v1/sandboxes", map[string]any{}, &info); code/100 != 2 {
			t.Fatalf("create after n2 died: %d", code)
		}
		if n, _ := sandboxid.Node(info.ID); n == "n2" {
			t.Fatalf("a sandbox made on the dead node: %s", info.ID)
		}
	}

	// A gateway restarted: nothing was its own.
	gws[0].cmd.Process.Kill()
	<-gws[0].exited
	g := startGateway(t, kc, tokenFile)
	testutil.WaitFor(t, 10*time.Second, "the new gateway to route", func() bool {
		st, got := exec(g, kept, "x")
		return st == 200 && got != ""
	})

	// The key revoked: every node refuses it.
	if r := vivarium(t, "", "keys", "revoke", "--cluster", "--kubeconfig", kc.Kubeconfig(kubetest.AdminUser),
		"--namespace", clusterNS, keyID); r.code != 0 {
		t.Fatalf("keys revoke --cluster: %d %s", r.code, r.stderr)
	}
	testutil.WaitFor(t, 5*time.Second, "the revoked key to be refused", func() bool {
		return call(t, key, "GET", g.url+"/v1/sandboxes/"+kept, nil, nil) == 401
	})
}

// clusterKept drives volumes and snapshots through two gateways (where
// this host keeps them: loop devices, CRIU): each is
// kept on the node that made it, which its id names; a sandbox that mounts
// a volume, or is made from a snapshot, is made on its node whichever
// gateway it comes through; names are the key's across the cluster.
func clusterKept(t *testing.T, gw0, gw1, key string) {
	clusterVolumes(t, gw0, gw1, key)
	clusterSnapshots(t, gw0, gw1, key)
}

func clusterVolumes(t *testing.T, gw0, gw1, key string) {
	var vol struct {
		ID, Name string
		Error    struct{ Code, Message string }
	}
	switch code := call(t, key, "POST", gw0+"/v1/volumes", map[string]any{"name": "work", "size": 16 << 20}, &vol); {
	case code == 501 && vol.Error.Code == "unsupported":
		t.Logf("volumes through the gateway not tested: this host keeps no volumes (%s)", vol.Error.Message)
		return
	case code != 201:
		t.Fatalf("a volume through the gateway: %d %+v", code, vol.Error)
	}
	volNode, ok := sandboxid.Volume.Node(vol.ID)
	if !ok {
		t.Fatalf("a cluster volume's id names no node: %s", vol.ID)
	}
	var e struct {
		Error struct{ Code, Message string }
	}
	if code := call(t, key, "POST", gw1+"/v1/volumes", map[string]any{"name": "work"}, &e); code != 409 {
		t.Fatalf("a second volume of the name through the other gateway: %d %+v, want 409", code, e)
	}
	var sb struct{ ID string }
	if code := call(t, key, "POST", gw1+"/v1/sandboxes",
		map[string]any{"volumes": []map[string]string{{"name": "work", "path": "/home/user/work"}}}, &sb); code != 201 {
		t.Fatalf("a sandbox with the volume: %d", code)
	}
	if n, _ := sandboxid.Node(sb.ID); n != volNode {
		t.Fatalf("a sandbox mounting a volume of node %s was made on %s", volNode, n)
	}
	runCell(t, key, gw0, sb.ID, "open('/home/user/work/f', 'w').write('kept')")
	resp, err := http.NewRequest("GET", gw0+"/v1/volumes/work/files/f", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Header.Set("Authorization", "Bearer "+key)
	r, err := http.DefaultClient.Do(resp)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode != 200 || string(b) != "kept" {
		t.Fatalf("the volume's file by its name through the gateway: %d %q", r.StatusCode, b)
	}
	var vols struct{ Volumes []struct{ ID string } }
	if call(t, key, "GET", gw1+"/v1/volumes", nil, &vols); len(vols.Volumes) != 1 || vols.Volumes[0].ID != vol.ID {
		t.Fatalf("the gateway lists %+v, want %s", vols.Volumes, vol.ID)
	}
	call(t, key, "DELETE", gw1+"/v1/sandboxes/"+sb.ID, nil, nil)
	if code := call(t, key, "DELETE", gw0+"/v1/volumes/"+vol.ID, nil, nil); code/100 != 2 {
		t.Fatalf("delete the volume through the gateway: %d", code)
	}
}

func clusterSnapshots(t *testing.T, gw0, gw1, key string) {
	if _, err := criu.Usable(); err != nil {
		t.Logf("snapshots through the gateway not tested: no CRIU (%v)", err)
		return
	}
	var sb struct{ ID string }
	if code := call(t, key, "POST", gw0+"/v1/sandboxes", map[string]any{"pausable": true}, &sb); code != 201 {
		t.Fatalf("a pausable sandbox: %d", code)
	}
	runCell(t, key, gw1, sb.ID, "import random; v = random.random()")
	var snap struct{ ID string }
	if code := call(t, key, "POST", gw1+"/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{}, &snap); code != 201 {
		t.Fatalf("a snapshot through the gateway: %d", code)
	}
	sbNode, _ := sandboxid.Node(sb.ID)
	if n, ok := sandboxid.Snapshot.Node(snap.ID); !ok || n != sbNode {
		t.Fatalf("a snapshot of a sandbox on %s: %s", sbNode, snap.ID)
	}
	want := runCell(t, key, gw0, sb.ID, "v")
	for _, gw := range []string{gw0, gw1} {
		var c struct{ ID string }
		if code := call(t, key, "POST", gw+"/v1/sandboxes", map[string]any{"from_snapshot": snap.ID}, &c); code != 201 {
			t.Fatalf("a sandbox from the snapshot: %d", code)
		}
		if n, _ := sandboxid.Node(c.ID); n != sbNode {
			t.Fatalf("a sandbox from a snapshot of %s was made on %s", sbNode, n)
		}
		if got := runCell(t, key, gw, c.ID, "v"); got != want {
			t.Fatalf("the snapshot's state: %q, want %q", got, want)
		}
		call(t, key, "DELETE", gw+"/v1/sandboxes/"+c.ID, nil, nil)
	}
	var snaps struct{ Snapshots []struct{ ID string } }
	if call(t, key, "GET", gw1+"/v1/snapshots", nil, &snaps); len(snaps.Snapshots) != 1 || snaps.Snapshots[0].ID != snap.ID {
		t.Fatalf("the gateway lists snapshots %+v, want %s", snaps.Snapshots, snap.ID)
	}
	if code := call(t, key, "DELETE", gw0+"/v1/snapshots/"+snap.ID, nil, nil); code/100 != 2 {
		t.Fatalf("delete the snapshot through the gateway: %d", code)
	}
	call(t, key, "DELETE", gw0+"/v1/sandboxes/"+sb.ID, nil, nil)
}

// runCell runs code in sandbox id through gateway gw and returns its
// result's text, failing the test on an error.
func runCell(t *testing.T, key, gw, id, code string) string {
	t.Helper()
	var res struct {
		Results []struct {
			Text         string
			IsMainResult bool `json:"is_main_result"`
		}
		Error *struct{ Value string }
	}
	if st := call(t, key, "POST", gw+"/v1/sandboxes/"+id+"/execute", map[string]any{"code": code}, &res); st != 200 || res.Error != nil {
		t.Fatalf("execute %q in %s: %d %+v", code, id, st, res.Error)
	}
	for _, r := range res.Results {
		if r.IsMainResult {
			return r.Text
		}
	}
	return ""
}

// clusterExecutions: a key that may run two executions at once runs two,
// on two nodes, and a third on a third node is refused once the nodes'
// Leases have said what runs (a quota of long executions: one shorter
// than a Lease's renewal may go unseen by the other nodes).
func clusterExecutions(t *testing.T, gw, key string) {
	// New sandboxes go to the least loaded node, which may take a few
	// dozen to catch up with the others: all are kept until there is one
	// on every node.
	byNode := map[string]string{}
	var extra []string
	defer func() {
		for _, id := range extra {
			call(t, key, "DELETE", gw+"/v1/sandboxes/"+id, nil, nil)
		}
	}()
	for i := 0; len(byNode) < 3; i++ {
		if i == 80 {
			t.Fatalf("80 sandboxes made on %d nodes only", len(byNode))
		}
		var sb struct{ ID string }
		if code := call(t, key, "POST", gw+"/v1/sandboxes", map[string]any{}, &sb); code != 201 {
			t.Fatalf("create: %d", code)
		}
		n, _ := sandboxid.Node(sb.ID)
		if _, ok := byNode[n]; ok {
			extra = append(extra, sb.ID)
		} else {
			byNode[n] = sb.ID
		}
	}
	ids := slices.Sorted(maps.Values(byNode))
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, id := range ids[:2] {
		wg.Go(func() {
			// Interrupted below, once the third has been refused.
			call(t, key, "POST", gw+"/v1/sandboxes/"+id+"/execute", map[string]any{"code": "import time; time.sleep(60)"}, nil)
		})
	}
	start := time.Now()
	testutil.WaitFor(t, 15*time.Second, "a third execution on a third node to be refused", func() bool {
		var e struct{ Error struct{ Code string } }
		code := call(t, key, "POST", gw+"/v1/sandboxes/"+ids[2]+"/execute", map[string]any{"code": "1"}, &e)
		return code == 429
	})
	t.Logf("a key's execution quota held across nodes after %v", time.Since(start).Round(time.Millisecond))
	for _, id := range ids[:2] {
		call(t, key, "POST", gw+"/v1/sandboxes/"+id+"/interrupt", nil, nil)
	}
	wg.Wait()
	for _, id := range ids {
		call(t, key, "DELETE", gw+"/v1/sandboxes/"+id, nil, nil)
	}
}

// clusterHostile: what a client or a sandbox's code may try against a
// gateway. A sandbox's port is reached through the gateway with its port
// token only, and the server it runs sees neither the cluster's token nor
// the client's key; another key reaches nothing of it; the gateway is not
// a proxy to anything but its nodes' API (no CONNECT, no other routes);
// and a sandbox's code reaches no node and no gateway (internal).
func clusterHostile(t *testing.T, gw string, internal []string, key, otherKey, clusterToken string) {
	var sb struct{ ID string }
	if code := call(t, key, "POST", gw+"/v1/sandboxes", map[string]any{}, &sb); code != 201 {
		t.Fatalf("create: %d", code)
	}
	defer call(t, key, "DELETE", gw+"/v1/sandboxes/"+sb.ID, nil, nil)
	var addrs []string
	for _, u := range internal {
		addrs = append(addrs, strings.TrimPrefix(u, "http://"))
	}
	addrList, _ := json.Marshal(addrs)
	code := `
import json, socket, subprocess, sys, time
reached = []
for a in json.loads(` + fmt.Sprintf("%q", addrList) + `):
    host, port = a.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
        reached.append(a)
    except OSError:
        pass
srv = """
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = json.dumps([[k, v] for k, v in self.headers.items()]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8000), H).serve_forever()
"""
subprocess.Popen([sys.executable, "-c", srv])
for _ in range(100):
    try:
        socket.create_connection(("127.0.0.1", 8000), timeout=1).close()
        break
    except OSError:
        time.sleep(0.05)
json.dumps(reached)`
	if got := runCell(t, key, gw, sb.ID, code); got != `'[]'` {
		t.Errorf("a sandbox's code reached the cluster's nodes or gateways, or said nothing: %q", got)
	}

	var port struct{ Token string }
	if st := call(t, otherKey, "POST", gw+"/v1/sandboxes/"+sb.ID+"/ports/8000", nil, &port); st != 404 {
		t.Errorf("another key's port token: %d, want 404", st)
	}
	if st := call(t, key, "POST", gw+"/v1/sandboxes/"+sb.ID+"/ports/8000", nil, &port); st != 200 || port.Token == "" {
		t.Fatalf("a port token through the gateway: %d", st)
	}
	get := func(header ...string) (int, string) {
		req, _ := http.NewRequest("GET", gw+"/v1/sandboxes/"+sb.ID+"/ports/8000/x", nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Add(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, _ := get("Authorization", "Bearer "+key); st/100 != 4 {
		t.Errorf("a port without its token, with the key: %d, want 4xx", st)
	}
	// The client's key with the token, and a Connection header naming
	// the cluster's token header (hop-by-hop: a proxy that honoured it
	// after setting the token would drop it on its way to the node).
	st, seen := get("Vivarium-Port-Token", port.Token, "Authorization", "Bearer "+key,
		"Connection", gateway.TokenHeader, gateway.TokenHeader, "forged-cluster-token")
	if st != 200 || !strings.Contains(seen, `"Host"`) {
		t.Fatalf("the port through the gateway: %d %.300s", st, seen)
	}
	for _, secret := range []string{clusterToken, key, port.Token, "forged-cluster-token"} {
		if strings.Contains(seen, secret) {
			t.Errorf("the sandbox's server was sent a secret (%.8s...): %s", secret, seen)
		}
	}

	// Nothing but the nodes' API: no CONNECT tunnel, no other route.
	conn, err := net.Dial("tcp", strings.TrimPrefix(gw, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addrs[0], addrs[0])
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, _ := bufio.NewReader(conn).ReadString('\n')
	conn.Close()
	if line == "" || strings.Contains(line, " 200") {
		t.Errorf("CONNECT through the gateway: %q, want a refusal", line)
	}
	for _, p := range []string{"/debug/pprof/", "/metrics", "/v1/keys", "/admin", "/v1/sandboxes/" + sb.ID + "%2f..%2f..%2fv1%2fkeys"} {
		if st := call(t, key, "GET", gw+p, nil, nil); st != 501 && st != 400 && st != 404 {
			t.Errorf("GET %s through the gateway: %d, want 501, 400 or 404", p, st)
		}
	}
}

// removeCgroupTree removes the groups under parent and parent itself in
// every hierarchy, the deepest first; it reports whether none is left
// (a group with members stays).
func removeCgroupTree(parent string) bool {
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	left := false
	for _, r := range append(roots, "/sys/fs/cgroup") {
		var dirs []string
		filepath.WalkDir(filepath.Join(r, parent), func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if os.Remove(dirs[i]) != nil {
				left = true
			}
		}
	}
	return !left
}

// healthz is a gateway's /healthz, trimmed.
func healthz(g *server) string {
	resp, err := http.Get(g.url + "/healthz")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// BenchmarkCluster measures what a gateway adds (issue 16's speed goals):
// a warm execution (x += 1) and a sandbox's creation, each directly on a
// node and through a gateway, in one run; then one-shots' throughput
// through the gateway with one, two and three nodes. Every node and the
// gateway share this machine's cores: the throughput says what two cores
// allow, not what three machines would.
//
//	go test ./cmd/vivarium -run '^$' -bench BenchmarkCluster -benchtime 200x
func BenchmarkCluster(b *testing.B) {
	needSandbox(b)
	nodes := []string{"n1", "n2", "n3"}
	users := []kubetest.User{{Name: "gateway"}}
	for _, n := range nodes {
		users = append(users, kubetest.User{Name: "node-" + n})
	}
	kc := kubetest.Start(b, users...)
	clusterRBAC(b, kc, nodes)
	tokenFile := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("bench-cluster-token-0123456789"), 0o600); err != nil {
		b.Fatal(err)
	}
	startNode := func(i int) *server {
		n := nodes[i]
		b.Cleanup(func() { removeCgroupTree("vivarium-cluster-bench-" + n) })
		return startServer(b, b.TempDir(), "--dev", "--cluster", "--node-name", n,
			"--kubeconfig", kc.Kubeconfig("node-"+n), "--namespace", clusterNS, "--cluster-token-file", tokenFile,
			"--cgroup-parent", "vivarium-cluster-bench-"+n,
			"--uid-base", fmt.Sprint(native.DefaultUIDBase+uint32(40+i)<<24), "--uid-ranges", "64")
	}
	first := startNode(0)
	gw := startGateway(b, kc, tokenFile)
	testutil.WaitFor(b, 10*time.Second, "the gateway to see the node", func() bool { return healthz(gw) == "ok: 1 nodes" })
	direct := func(method, url string, body, out any) int {
		b.Helper()
		bb, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, url, bytes.NewReader(bb))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(gateway.TokenHeader, "bench-cluster-token-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer resp.Body.Close()
		if out != nil {
			json.NewDecoder(resp.Body).Decode(out)
		} else {
			io.Copy(io.Discard, resp.Body)
		}
		return resp.StatusCode
	}
	via := map[string]func(method, path string, body, out any) int{
		"direct": func(method, path string, body, out any) int { return direct(method, first.url+path, body, out) },
		"gateway": func(method, path string, body, out any) int {
			return call(b, "", method, gw.url+path, body, out)
		},
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	// Each iteration times both routes, one after the other, so that the
	// machine's drift falls on both alike.
	var info struct{ ID string }
	if code := via["gateway"]("POST", "/v1/sandboxes", map[string]any{}, &info); code/100 != 2 {
		b.Fatalf("create: %d", code)
	}
	b.Run("warm-execute", func(b *testing.B) {
		times := map[string][]time.Duration{}
		for b.Loop() {
			for _, route := range []string{"direct", "gateway"} {
				start := time.Now()
				if code := via[route]("POST", "/v1/sandboxes/"+info.ID+"/execute", map[string]any{"code": "x = globals().get('x', 0) + 1"}, nil); code != 200 {
					b.Fatalf("execute %s: %d", route, code)
				}
				times[route] = append(times[route], time.Since(start))
			}
		}
		d, g := p50(times["direct"]), p50(times["gateway"])
		b.ReportMetric(d, "direct-p50-ms")
		b.ReportMetric(g, "gateway-p50-ms")
		b.ReportMetric(g-d, "added-p50-ms")
	})
	b.Run("create", func(b *testing.B) {
		times := map[string][]time.Duration{}
		for b.Loop() {
			for _, route := range []string{"direct", "gateway"} {
				var made struct{ ID string }
				start := time.Now()
				if code := via[route]("POST", "/v1/sandboxes", map[string]any{}, &made); code/100 != 2 {
					b.Fatalf("create %s: %d", route, code)
				}
				times[route] = append(times[route], time.Since(start))
				via[route]("DELETE", "/v1/sandboxes/"+made.ID, nil, nil)
			}
		}
		d, g := p50(times["direct"]), p50(times["gateway"])
		b.ReportMetric(d, "direct-p50-ms")
		b.ReportMetric(g, "gateway-p50-ms")
		b.ReportMetric(g/d, "gateway/direct")
	})
	via["gateway"]("DELETE", "/v1/sandboxes/"+info.ID, nil, nil)
	for n := 1; n <= len(nodes); n++ {
		if n > 1 {
			startNode(n - 1)
			testutil.WaitFor(b, 10*time.Second, "the gateway to see the nodes", func() bool {
				return healthz(gw) == fmt.Sprintf("ok: %d nodes", n)
			})
		}
		b.Run(fmt.Sprintf("one-shots/%d-nodes", n), func(b *testing.B) {
			const clients = 4
			var wg sync.WaitGroup
			var next atomic.Int64
			start := time.Now()
			for range clients {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						var res struct{ Status string }
						if code := call(b, "", "POST", gw.url+"/v1/execute", map[string]any{"code": "print(1)"}, &res); code != 200 || res.Status != "ok" {
							b.Errorf("one-shot: %d %s", code, res.Status)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "one-shots/s")
		})
	}
}

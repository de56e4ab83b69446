package kubetest

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// TestLeaseRBAC: an unprivileged user reads Leases in a namespace only
// once a Role and RoleBinding made by the admin let it, through the REST
// helper and through kubectl with the user's kubeconfig.
func TestLeaseRBAC(t *testing.T) {
	begin := time.Now()
	c := Start(t, User{Name: "node-a", Groups: []string{"vivarium:nodes"}})
	t.Logf("etcd and kube-apiserver started and ready in %v", time.Since(begin).Round(time.Millisecond))
	admin, user := c.AdminToken, c.Token("node-a")
	const ns = "vivarium-test"
	leases := "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases"

	want := func(what string, code int, got int, body []byte) {
		t.Helper()
		if got != code {
			t.Fatalf("%s: %d, want %d: %s", what, got, code, body)
		}
	}

	code, body := c.Do(t, admin, http.MethodPost, "/api/v1/namespaces", map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
	})
	want("create namespace", http.StatusCreated, code, body)
	code, body = c.Do(t, admin, http.MethodPost, leases, map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": "node-a"},
		"spec":     map[string]any{"holderIdentity": "node-a", "leaseDurationSeconds": 10},
	})
	want("create lease", http.StatusCreated, code, body)

	// No token at all is anonymous, which RBAC gives nothing here either.
	code, body = c.Do(t, "", http.MethodGet, leases, nil)
	want("anonymous list", http.StatusForbidden, code, body)
	code, body = c.Do(t, user, http.MethodGet, leases+"/node-a", nil)
	want("get before the RoleBinding", http.StatusForbidden, code, body)
	code, body = c.Do(t, user, http.MethodGet, leases, nil)
	want("list before the RoleBinding", http.StatusForbidden, code, body)

	code, body = c.Do(t, admin, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+ns+"/roles", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
		"metadata": map[string]any{"name": "lease-reader"},
		"rules": []map[string]any{{
			"apiGroups": []string{"coordination.k8s.io"},
			"resources": []string{"leases"},
			"verbs":     []string{"get", "list", "watch"},
		}},
	})
	want("create role", http.StatusCreated, code, body)
	code, body = c.Do(t, admin, http.MethodPost, "/apis/rbac.authorization.k8s.io/v1/namespaces/"+ns+"/rolebindings", map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
		"metadata": map[string]any{"name": "lease-reader"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease-reader"},
		"subjects": []map[string]any{{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "node-a"}},
	})
	want("create rolebinding", http.StatusCreated, code, body)

	// The RBAC authorizer reads roles from the API server's informer
	// cache, so the binding takes effect a moment after it is stored.
	bound := time.Now()
	testutil.WaitFor(t, 10*time.Second, "the RoleBinding to take effect", func() bool {
		code, _ := c.Do(t, user, http.MethodGet, leases+"/node-a", nil)
		return code == http.StatusOK
	})
	t.Logf("RoleBinding effective after %v", time.Since(bound).Round(time.Millisecond))
	code, body = c.Do(t, user, http.MethodGet, leases, nil)
	want("list after the RoleBinding", http.StatusOK, code, body)
	var list struct {
		Items []struct {
			Metadata struct{ Name string }
			Spec     struct{ HolderIdentity string }
		}
	}
	if err := json.Unmarshal(body, &list); err != nil || len(list.Items) != 1 || list.Items[0].Spec.HolderIdentity != "node-a" {
		t.Fatalf("lease list: %v: %s", err, body)
	}

	// Only what the Role grants: no writes, no other namespace.
	code, body = c.Do(t, user, http.MethodDelete, leases+"/node-a", nil)
	want("delete with a read-only role", http.StatusForbidden, code, body)
	code, body = c.Do(t, user, http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases", nil)
	want("list in another namespace", http.StatusForbidden, code, body)

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("no kubectl on $PATH: the kubeconfig is not checked with it")
		return
	}
	cfg := c.Kubeconfig("node-a")
	cmd := exec.Command(kubectl, "--kubeconfig", cfg, "get", "leases", "-n", ns, "-o", "name")
	// kubectl caches discovery under $HOME/.kube; keep it in the test's directory.
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("kubectl get leases: %v: %s%s", err, out, stderr)
	}
	if got := strings.TrimSpace(string(out)); got != "lease.coordination.k8s.io/node-a" {
		t.Fatalf("kubectl get leases: %q", got)
	}
	cmd = exec.Command(kubectl, "--kubeconfig", cfg, "get", "leases", "-n", "kube-system")
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "forbidden") {
		t.Fatalf("kubectl get leases -n kube-system as node-a: %v: %s", err, out)
	}
}

// TestFindOverride: $VIVARIUM_KUBE_APISERVER names the binary to use.
func TestFindOverride(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "kube-apiserver")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIVARIUM_KUBE_APISERVER", bin)
	t.Setenv("VIVARIUM_ETCD", bin)
	api, etcd, err := Find()
	if err != nil || api != bin || etcd != bin {
		t.Fatalf("Find: %q %q %v", api, etcd, err)
	}

	// Nothing anywhere: ErrNotFound.
	t.Setenv("VIVARIUM_KUBE_APISERVER", "")
	t.Setenv("VIVARIUM_KUBE_DIR", "")
	t.Setenv("XDG_CACHE_HOME", filepath.Join(dir, "empty"))
	if _, _, err := Find(); err == nil {
		t.Fatal("Find with nothing built: no error")
	}
}

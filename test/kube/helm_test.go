package kube

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil/kubetest"
)

// The second rendering: every option the defaults leave off.
const stsValues = `
backend: gvisor
domain: sb.example.com
templateRegistry:
  repository: registry.lan:5000/vivarium
  insecure: true
  authSecret: registry-credentials
clusterToken:
  value: a-token-of-the-test
node:
  kind: StatefulSet
  replicas: 2
  storage:
    type: pvc
    size: 5Gi
  network:
    allow: [pypi.org, "*.pythonhosted.org:443"]
    deny: [10.0.0.0/8]
  limits:
    max-sandboxes: 200
    max-sandboxes-per-key: 20
    max-executions: 10000000
    cpus: 1.5
keys:
  - id: key_0123456789ab
    name: ci
    sha256: 0db7a8fc526094f5d508321516334d9498b0831799c3387dbc96c4b57c3a9047
    maxSandboxes: 5
`

// TestHelmChart renders deploy/helm/vivarium with helm (the defaults: a
// DaemonSet of native nodes; and a StatefulSet of gvisor nodes on PVCs
// with keys, network and a domain), checks what it asks for, creates
// every object of both through the REST API of a real kube-apiserver
// (one rendering in JSON, as helm install sends it, the other in YAML, as
// helm wrote it; strict field validation), checks with
// SubjectAccessReviews and the service accounts' own tokens that each
// component may do what it needs and nothing more, and finally installs
// and upgrades the chart with helm itself, the cluster token kept.
func TestHelmChart(t *testing.T) {
	helm := requireHelm(t)
	begin := time.Now()
	const ns, nsSTS = "vivarium", "vivarium-sts"
	def := render(t, helm, "vivarium", ns)
	valuesFile := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(valuesFile, []byte(stsValues), 0o600); err != nil {
		t.Fatal(err)
	}
	sts := render(t, helm, "v", nsSTS, "--values", valuesFile)
	t.Logf("helm template (%s): defaults: %s; statefulset/gvisor: %s, in %v",
		helm, kinds(def), kinds(sts), time.Since(begin).Round(time.Millisecond))

	checkDefaults(t, def, ns)
	checkStatefulSet(t, sts, nsSTS)
	checkRefused(t, helm)

	kc := kubetest.Start(t)
	a := newAPI(t, kc)
	for _, n := range []string{ns, nsSTS} {
		if code, body := kc.Do(t, kc.AdminToken, http.MethodPost, "/api/v1/namespaces", map[string]any{
			"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": n}}); code != http.StatusCreated {
			t.Fatalf("namespace %s: %d %s", n, code, body)
		}
	}
	for _, r := range []struct {
		objs   []object
		asYAML bool
	}{{def, false}, {sts, true}} {
		for _, o := range r.objs {
			if code, body := a.create(t, o, r.asYAML); code != http.StatusCreated {
				t.Fatalf("create %s (yaml %v): %d %s", o, r.asYAML, code, body)
			}
		}
	}
	t.Logf("created %d objects as admin (the defaults' %d in JSON, the StatefulSet's %d in YAML: application/yaml is accepted)",
		len(def)+len(sts), len(def), len(sts))

	checkRBAC(t, a, ns, nsSTS)
	checkTokens(t, a, ns, nsSTS)
	checkInstall(t, helm, kc)
}

// container returns the first container of a workload's pod template.
func container(o object) map[string]any {
	c, _ := dig(o.Map, "spec", "template", "spec", "containers", 0).(map[string]any)
	return c
}

func strs(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, s := range l {
		out = append(out, s.(string))
	}
	return out
}

func wantArgs(t *testing.T, what string, args []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(args, w) {
			t.Errorf("%s: no %q in %q", what, w, args)
		}
	}
}

func wantValue(t *testing.T, what string, got, want any) {
	t.Helper()
	if got != want {
		t.Errorf("%s: %v, want %v", what, got, want)
	}
}

func checkDefaults(t *testing.T, objs []object, ns string) {
	var got []string
	for _, o := range objs {
		got = append(got, o.Kind)
		if o.Namespace != ns {
			t.Errorf("%s: not in the release's namespace %s", o, ns)
		}
	}
	slices.Sort(got)
	want := []string{"DaemonSet", "Deployment", "NetworkPolicy", "Role", "Role", "RoleBinding", "RoleBinding",
		"Secret", "Service", "Service", "ServiceAccount", "ServiceAccount"}
	if !slices.Equal(got, want) {
		t.Errorf("the defaults render %q, want %q (no ClusterRole, no key)", got, want)
	}

	ds := find(t, objs, "DaemonSet", "vivarium-node")
	pod := dig(ds.Map, "spec", "template", "spec")
	c := container(ds)
	args := strs(c["args"])
	wantArgs(t, "node", args, "serve", "--cluster", "--node-name=$(POD_NAME)", "--namespace=$(POD_NAMESPACE)",
		"--listen=0.0.0.0:8080", "--advertise-url=http://$(POD_IP):8080", "--cluster-token-file=/etc/vivarium/cluster/token",
		"--lease-duration=5s", "--backend=native", "--data-dir=/var/lib/vivarium", "--io-disk-of=/var/lib/vivarium", "--max-sandboxes=1000",
		"--max-sandboxes-per-key=50")
	for _, a := range args {
		// A DaemonSet's pod does not come back under its name: nothing
		// to keep paused sandboxes for.
		if strings.HasPrefix(a, "--allow-net") || strings.HasPrefix(a, "--domain") || a == "--dev" || a == "--pause-on-shutdown" {
			t.Errorf("node: %q by default", a)
		}
	}
	env := map[string]any{}
	for _, e := range dig(c, "env").([]any) {
		env[dig(e, "name").(string)] = dig(e, "valueFrom", "fieldRef", "fieldPath")
	}
	for name, path := range map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"} {
		wantValue(t, "node env "+name, env[name], path)
	}
	// The privileges README.md gives the reasons for, and no more of the
	// host than its data directory.
	wantValue(t, "node privileged", dig(c, "securityContext", "privileged"), true)
	for _, f := range []string{"hostPID", "hostNetwork", "hostIPC"} {
		wantValue(t, "node "+f, dig(pod, f), false)
	}
	wantValue(t, "node hostUsers", dig(pod, "hostUsers"), true)
	wantValue(t, "node service account", dig(pod, "serviceAccountName"), "vivarium-node")
	var hostPaths []string
	for _, v := range dig(pod, "volumes").([]any) {
		if p, ok := dig(v, "hostPath", "path").(string); ok {
			hostPaths = append(hostPaths, p)
		}
		if s, ok := dig(v, "secret", "secretName").(string); ok {
			wantValue(t, "node token Secret", s, "vivarium-cluster-token")
		}
	}
	if !slices.Equal(hostPaths, []string{"/var/lib/vivarium/vivarium-vivarium"}) {
		t.Errorf("node host paths %q, want its data directory only", hostPaths)
	}

	gw := find(t, objs, "Deployment", "vivarium-gateway")
	wantValue(t, "gateway replicas", dig(gw.Map, "spec", "replicas"), float64(2))
	gpod := dig(gw.Map, "spec", "template", "spec")
	wantValue(t, "gateway runAsNonRoot", dig(gpod, "securityContext", "runAsNonRoot"), true)
	wantValue(t, "gateway hostNetwork", dig(gpod, "hostNetwork"), nil)
	gc := container(gw)
	wantArgs(t, "gateway", strs(gc["args"]), "gateway", "--listen=0.0.0.0:8080", "--namespace=$(POD_NAMESPACE)",
		"--cluster-token-file=/etc/vivarium/cluster/token", "--verify-pods")
	wantValue(t, "gateway readOnlyRootFilesystem", dig(gc, "securityContext", "readOnlyRootFilesystem"), true)
	wantValue(t, "gateway allowPrivilegeEscalation", dig(gc, "securityContext", "allowPrivilegeEscalation"), false)
	if d := strs(dig(gc, "securityContext", "capabilities", "drop")); !slices.Equal(d, []string{"ALL"}) {
		t.Errorf("gateway drops capabilities %q, want ALL", d)
	}
	if add := dig(gc, "securityContext", "capabilities", "add"); add != nil {
		t.Errorf("gateway adds capabilities %v", add)
	}

	svc := find(t, objs, "Service", "vivarium")
	wantValue(t, "service type", dig(svc.Map, "spec", "type"), "ClusterIP")
	wantValue(t, "service port", dig(svc.Map, "spec", "ports", 0, "port"), float64(80))
	wantValue(t, "service targetPort", dig(svc.Map, "spec", "ports", 0, "targetPort"), "http")
	wantValue(t, "service selects the gateways", dig(svc.Map, "spec", "selector", "app.kubernetes.io/component"), "gateway")

	tok := find(t, objs, "Secret", "vivarium-cluster-token")
	raw, err := base64.StdEncoding.DecodeString(dig(tok.Map, "data", "token").(string))
	if err != nil || !regexp.MustCompile(`^[A-Za-z0-9]{48}$`).Match(raw) {
		t.Errorf("the cluster token is not 48 random letters and digits: %q %v", raw, err)
	}
}

func checkStatefulSet(t *testing.T, objs []object, ns string) {
	s := find(t, objs, "StatefulSet", "v-vivarium-node")
	wantValue(t, "statefulset replicas", dig(s.Map, "spec", "replicas"), float64(2))
	wantValue(t, "statefulset claim", dig(s.Map, "spec", "volumeClaimTemplates", 0, "spec", "resources", "requests", "storage"), "5Gi")
	wantValue(t, "statefulset one per host", dig(s.Map, "spec", "template", "spec", "affinity", "podAntiAffinity",
		"requiredDuringSchedulingIgnoredDuringExecution", 0, "topologyKey"), "kubernetes.io/hostname")
	args := strs(container(s)["args"])
	wantArgs(t, "statefulset node", args, "--backend=gvisor", "--allow-net=pypi.org", "--allow-net=*.pythonhosted.org:443",
		"--deny-net=10.0.0.0/8", "--domain=sb.example.com", "--max-sandboxes=200", "--max-sandboxes-per-key=20",
		"--max-executions=10000000", "--cpus=1.5", "--pause-on-shutdown",
		"--template-registry=registry.lan:5000/vivarium", "--insecure-registry=registry.lan:5000")
	if slices.Contains(args, "--backend=native") {
		t.Errorf("statefulset node: both backends in %q", args)
	}
	// The template registry's credentials: the Secret's Docker
	// config.json, where DOCKER_CONFIG says.
	var dockerConfig any
	for _, e := range container(s)["env"].([]any) {
		if dig(e, "name") == "DOCKER_CONFIG" {
			dockerConfig = dig(e, "value")
		}
	}
	wantValue(t, "statefulset DOCKER_CONFIG", dockerConfig, "/etc/vivarium/registry")
	auth := false
	for _, v := range dig(s.Map, "spec", "template", "spec", "volumes").([]any) {
		if dig(v, "name") == "registry-auth" {
			auth = true
			wantValue(t, "registry secret", dig(v, "secret", "secretName"), "registry-credentials")
			wantValue(t, "registry secret's config.json", dig(v, "secret", "items", 0, "path"), "config.json")
			wantValue(t, "registry secret's key", dig(v, "secret", "items", 0, "key"), ".dockerconfigjson")
		}
	}
	mounted := false
	for _, m := range container(s)["volumeMounts"].([]any) {
		mounted = mounted || dig(m, "name") == "registry-auth" && dig(m, "mountPath") == "/etc/vivarium/registry"
	}
	if !auth || !mounted {
		t.Errorf("statefulset node: the registry's Secret volume %v, mounted %v", auth, mounted)
	}
	wantArgs(t, "statefulset gateway", strs(container(find(t, objs, "Deployment", "v-vivarium-gateway"))["args"]),
		"--domain=sb.example.com")
	for _, v := range dig(s.Map, "spec", "template", "spec", "volumes").([]any) {
		if dig(v, "hostPath") != nil {
			t.Errorf("statefulset on PVCs mounts a host path: %v", v)
		}
	}

	// The node's own Leases by name, one per replica.
	role := find(t, objs, "Role", "v-vivarium-node")
	named := dig(role.Map, "rules", 1)
	if got := strs(dig(named, "resourceNames")); !slices.Equal(got, []string{"vivarium-node-v-vivarium-node-0", "vivarium-node-v-vivarium-node-1"}) {
		t.Errorf("statefulset node Role's Leases by name: %q", got)
	}

	tok := find(t, objs, "Secret", "v-vivarium-cluster-token")
	wantValue(t, "given cluster token", dig(tok.Map, "data", "token"), base64.StdEncoding.EncodeToString([]byte("a-token-of-the-test")))
	// The key as `vivarium keys create --cluster` makes one, so that the
	// nodes' watch (internal/cluster) takes it.
	key := find(t, objs, "Secret", "vivarium-key-0123456789ab")
	sum := sha256.Sum256([]byte("e2b_00112233445566778899aabbccddeeff00112233"))
	wantValue(t, "key hash", dig(key.Map, "stringData", "hash"), hex.EncodeToString(sum[:]))
	wantValue(t, "key name", dig(key.Map, "stringData", "name"), "ci")
	wantValue(t, "key quota", dig(key.Map, "stringData", "max-sandboxes"), "5")
	wantValue(t, "key label kind", dig(key.Map, "metadata", "labels", "vivarium.dev/kind"), "api-key")
	wantValue(t, "key label name", dig(key.Map, "metadata", "labels", "app.kubernetes.io/name"), "vivarium")
	for _, o := range objs {
		if o.Namespace != ns {
			t.Errorf("%s: not in the release's namespace %s", o, ns)
		}
	}
}

// checkRefused: values that could not work are refused at rendering, with
// what to change.
func checkRefused(t *testing.T, helm string) {
	for _, c := range []struct {
		set  []string
		says string
	}{
		{[]string{"node.storage.type=pvc"}, "needs node.kind StatefulSet"},
		{[]string{"backend=docker"}, "backend must be native or gvisor"},
		{[]string{"node.kind=Deployment"}, "node.kind must be DaemonSet or StatefulSet"},
		{[]string{"keys[0].id=key_x,keys[0].name=a,keys[0].sha256=00"}, "must be key_ and 12 hex digits"},
	} {
		var args []string
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		_, stderr, err := helmTemplate(t, helm, "vivarium", "vivarium", args...)
		if err == nil || !strings.Contains(stderr, c.says) {
			t.Errorf("helm template --set %s: %v, %q; want a failure that says %q", strings.Join(c.set, " "), err, stderr, c.says)
		}
	}
}

// checkRBAC asks the API server what each service account may do.
func checkRBAC(t *testing.T, a *api, ns, nsSTS string) {
	const coord, core, rbac = "coordination.k8s.io", "", "rbac.authorization.k8s.io"
	type access struct {
		ns, sa, verb, group, resource, in, name string
		want                                    bool
	}
	gw, node, stsNode := "vivarium-gateway", "vivarium-node", "v-vivarium-node"
	cases := []access{
		// The gateway reads the nodes' Leases and pods (--verify-pods),
		// and nothing else.
		{ns, gw, "get", coord, "leases", ns, "vivarium-node-x", true},
		{ns, gw, "list", coord, "leases", ns, "", true},
		{ns, gw, "watch", coord, "leases", ns, "", true},
		{ns, gw, "create", coord, "leases", ns, "", false},
		{ns, gw, "update", coord, "leases", ns, "vivarium-node-x", false},
		{ns, gw, "patch", coord, "leases", ns, "vivarium-node-x", false},
		{ns, gw, "delete", coord, "leases", ns, "vivarium-node-x", false},
		{ns, gw, "get", core, "secrets", ns, "vivarium-cluster-token", false},
		{ns, gw, "list", core, "secrets", ns, "", false},
		{ns, gw, "list", core, "pods", ns, "", true},
		{ns, gw, "watch", core, "pods", ns, "", true},
		{ns, gw, "delete", core, "pods", ns, "vivarium-node-abcde", false},
		{ns, gw, "list", core, "pods", "kube-system", "", false},
		{ns, gw, "list", core, "endpoints", ns, "", false},
		{ns, gw, "list", coord, "leases", "kube-system", "", false},
		// A node: Leases (its own; RBAC cannot tell a DaemonSet's pods'
		// names in advance, so any by name) and the keys' Secrets.
		{ns, node, "create", coord, "leases", ns, "", true},
		{ns, node, "list", coord, "leases", ns, "", true},
		{ns, node, "watch", coord, "leases", ns, "", true},
		{ns, node, "get", coord, "leases", ns, "vivarium-node-vivarium-node-abcde", true},
		{ns, node, "update", coord, "leases", ns, "vivarium-node-vivarium-node-abcde", true},
		{ns, node, "delete", coord, "leases", ns, "vivarium-node-vivarium-node-abcde", true},
		{ns, node, "patch", coord, "leases", ns, "vivarium-node-vivarium-node-abcde", false},
		{ns, node, "deletecollection", coord, "leases", ns, "", false},
		{ns, node, "get", core, "secrets", ns, "vivarium-key-0123456789ab", true},
		{ns, node, "list", core, "secrets", ns, "", true},
		{ns, node, "watch", core, "secrets", ns, "", true},
		{ns, node, "create", core, "secrets", ns, "", false},
		{ns, node, "update", core, "secrets", ns, "vivarium-cluster-token", false},
		{ns, node, "delete", core, "secrets", ns, "vivarium-key-0123456789ab", false},
		{ns, node, "delete", core, "pods", ns, "vivarium-node-abcde", false},
		{ns, node, "list", core, "pods", ns, "", false},
		{ns, node, "create", core, "pods", ns, "", false},
		{ns, node, "create", core, "serviceaccounts/token", ns, "vivarium-gateway", false},
		{ns, node, "create", rbac, "roles", ns, "", false},
		{ns, node, "create", rbac, "rolebindings", ns, "", false},
		{ns, node, "bind", rbac, "roles", ns, "vivarium-node", false},
		{ns, node, "escalate", rbac, "roles", ns, "vivarium-node", false},
		{ns, node, "update", "apps", "daemonsets", ns, "vivarium-node", false},
		// Other namespaces, the other release's included, and the
		// cluster's own objects.
		{ns, node, "list", coord, "leases", nsSTS, "", false},
		{ns, node, "create", coord, "leases", "kube-system", "", false},
		{ns, node, "update", coord, "leases", "kube-node-lease", "some-node", false},
		{ns, node, "list", core, "secrets", "kube-system", "", false},
		{ns, node, "get", core, "secrets", nsSTS, "v-vivarium-cluster-token", false},
		{ns, node, "list", core, "namespaces", "", "", false},
		{ns, node, "list", core, "nodes", "", "", false},
		// A StatefulSet's nodes: their own Leases only, by name.
		{nsSTS, stsNode, "create", coord, "leases", nsSTS, "", true},
		{nsSTS, stsNode, "update", coord, "leases", nsSTS, "vivarium-node-v-vivarium-node-0", true},
		{nsSTS, stsNode, "delete", coord, "leases", nsSTS, "vivarium-node-v-vivarium-node-1", true},
		{nsSTS, stsNode, "update", coord, "leases", nsSTS, "vivarium-node-v-vivarium-node-2", false},
		{nsSTS, stsNode, "update", coord, "leases", nsSTS, "vivarium-node-intruder", false},
		{nsSTS, stsNode, "get", coord, "leases", nsSTS, "", false},
		{nsSTS, stsNode, "list", core, "secrets", nsSTS, "", true},
		{nsSTS, stsNode, "list", coord, "leases", ns, "", false},
	}
	for _, c := range cases {
		if got := a.can(t, c.ns, c.sa, c.verb, c.group, c.resource, c.in, c.name); got != c.want {
			t.Errorf("%s/%s may %s %s %q in %q: %v, want %v", c.ns, c.sa, c.verb, c.resource, c.name, c.in, got, c.want)
		}
	}
	t.Logf("%d SubjectAccessReviews answered as expected", len(cases))
}

// checkTokens uses the service accounts' own tokens, as their pods would.
func checkTokens(t *testing.T, a *api, ns, nsSTS string) {
	kc := a.kc
	gw, node := a.token(t, ns, "vivarium-gateway"), a.token(t, ns, "vivarium-node")
	leases := "/apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases"
	lease := map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": "vivarium-node-vivarium-node-abcde"},
		"spec":     map[string]any{"holderIdentity": "vivarium-node-abcde", "leaseDurationSeconds": 5}}
	for _, c := range []struct {
		who, token, method, path string
		body                     any
		want                     int
	}{
		{"node", node, http.MethodPost, leases, lease, http.StatusCreated},
		{"gateway", gw, http.MethodGet, leases, nil, http.StatusOK},
		{"gateway", gw, http.MethodGet, leases + "/vivarium-node-vivarium-node-abcde", nil, http.StatusOK},
		{"gateway", gw, http.MethodDelete, leases + "/vivarium-node-vivarium-node-abcde", nil, http.StatusForbidden},
		{"gateway", gw, http.MethodGet, "/api/v1/namespaces/" + ns + "/secrets", nil, http.StatusForbidden},
		{"gateway", gw, http.MethodGet, "/api/v1/namespaces/" + ns + "/pods?labelSelector=app.kubernetes.io%2Fcomponent%3Dnode", nil, http.StatusOK},
		{"node", node, http.MethodGet, "/api/v1/namespaces/" + ns + "/secrets?labelSelector=vivarium.dev%2Fkind%3Dapi-key", nil, http.StatusOK},
		{"node", node, http.MethodGet, "/api/v1/namespaces/" + nsSTS + "/secrets", nil, http.StatusForbidden},
		{"node", node, http.MethodGet, "/api/v1/namespaces/" + ns + "/pods", nil, http.StatusForbidden},
		{"node", node, http.MethodDelete, leases + "/vivarium-node-vivarium-node-abcde", nil, http.StatusOK},
	} {
		if code, body := kc.Do(t, c.token, c.method, c.path, c.body); code != c.want {
			t.Errorf("%s's token: %s %s: %d, want %d: %s", c.who, c.method, c.path, code, c.want, body)
		}
	}
}

// checkInstall installs the chart with helm itself (its own order, its
// lookup of the cluster token against the API server) and upgrades it:
// the token a node and gateway share must not change under them.
func checkInstall(t *testing.T, helm string, kc *kubetest.Cluster) {
	const ns, release = "vivarium-live", "live"
	home := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(helm, append(args, "--kubeconfig", kc.Kubeconfig(kubetest.AdminUser), "--namespace", ns)...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("helm %s: %v", args[0], time.Since(start).Round(time.Millisecond))
	}
	token := func() string {
		t.Helper()
		code, body := kc.Do(t, kc.AdminToken, http.MethodGet, "/api/v1/namespaces/"+ns+"/secrets/live-vivarium-cluster-token", nil)
		if code != http.StatusOK {
			t.Fatalf("the installed cluster token: %d %s", code, body)
		}
		return string(body)
	}
	run("install", release, chartDir(t), "--create-namespace")
	before := token()
	run("upgrade", release, chartDir(t), "--set", "gateway.replicas=3")
	if after := token(); !strings.Contains(after, tokenData(t, before)) {
		t.Errorf("helm upgrade changed the cluster token: %s, then %s", before, after)
	}
	code, body := kc.Do(t, kc.AdminToken, http.MethodGet, "/apis/apps/v1/namespaces/"+ns+"/deployments/live-vivarium-gateway", nil)
	if code != http.StatusOK || !strings.Contains(string(body), `"replicas":3`) {
		t.Errorf("the upgraded gateway Deployment: %d %s", code, body)
	}
}

// tokenData returns the "token":"..." of a Secret's JSON.
func tokenData(t *testing.T, secret string) string {
	t.Helper()
	m := regexp.MustCompile(`"token":"[^"]+"`).FindString(secret)
	if m == "" {
		t.Fatalf("no token in %s", secret)
	}
	return m
}

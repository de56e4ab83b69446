// Package kube tests what Vivarium ships for Kubernetes against a real API
// server: the Helm chart (deploy/helm/vivarium) rendered by a real helm
// (scripts/kube/helm.sh builds it), every object it makes created through
// the API server's REST API, and its RBAC checked with SubjectAccessReviews
// and the service accounts' own tokens. No kubelet runs in those: the
// chart's pods are accepted, never started. TestSingleNodeCluster
// (node_test.go, opt-in: VIVARIUM_KUBE_NODE=1) starts them for real on a
// kubelet and containerd of its own.
package kube

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/kubetest"
)

// kubeVersion is the version helm renders for: the kube-apiserver that
// scripts/kube/build.sh builds (the chart asks for 1.30 or later).
const kubeVersion = "v1.33.4"

// errNoHelm: no helm binary was found.
var errNoHelm = errors.New("no helm: build it with scripts/kube/helm.sh")

// findHelm returns $VIVARIUM_HELM, else the newest helm-*/helm that
// scripts/kube/helm.sh left under ${XDG_CACHE_HOME:-$HOME/.cache}/vivarium.
func findHelm() (string, error) {
	if p := os.Getenv("VIVARIUM_HELM"); p != "" {
		if executable(p) {
			return p, nil
		}
		return "", fmt.Errorf("%w ($VIVARIUM_HELM=%s is not an executable)", errNoHelm, p)
	}
	paths, glob := fileutil.CachedBuilds("helm", "helm")
	var best string
	for _, p := range paths { // the newest first
		if executable(p) {
			best = p
			break
		}
	}
	if best == "" {
		return "", fmt.Errorf("%w (looked in %s)", errNoHelm, glob)
	}
	return best, nil
}

func executable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// requireHelm skips the test without helm, or fails it where
// VIVARIUM_REQUIRE_HELM=1 says scripts/kube/helm.sh built it.
func requireHelm(t *testing.T) string {
	t.Helper()
	testutil.SkipShort(t, "needs helm")
	helm, err := findHelm()
	if err != nil {
		if os.Getenv("VIVARIUM_REQUIRE_HELM") == "1" {
			t.Fatalf("%v (VIVARIUM_REQUIRE_HELM=1)", err)
		}
		t.Skip(err)
	}
	return helm
}

// chartDir is deploy/helm/vivarium of this checkout.
func chartDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "helm", "vivarium")
	if _, err := os.Stat(filepath.Join(dir, "Chart.yaml")); err != nil {
		t.Fatalf("the chart: %v", err)
	}
	return dir
}

// object is one document helm rendered.
type object struct {
	APIVersion, Kind, Name, Namespace string
	YAML                              []byte // as helm wrote it
	JSON                              []byte
	Map                               map[string]any
}

func (o object) String() string { return o.Kind + " " + o.Namespace + "/" + o.Name }

// helmTemplate runs `helm template` with args and returns its error output
// too, for the cases that must fail.
func helmTemplate(t *testing.T, helm, release, ns string, args ...string) ([]byte, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := append([]string{"template", release, chartDir(t), "--namespace", ns, "--kube-version", kubeVersion}, args...)
	cmd := exec.CommandContext(ctx, helm, argv...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	// helm keeps nothing of ours: its caches and config in a directory
	// of the test's.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	out, err := cmd.Output()
	return out, stderr.String(), err
}

// render runs `helm template` and splits what it prints into objects, in
// its order (Helm's install order: accounts and Secrets before the
// workloads that use them).
func render(t *testing.T, helm, release, ns string, args ...string) []object {
	t.Helper()
	out, stderr, err := helmTemplate(t, helm, release, ns, args...)
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	var objs []object
	for {
		doc, err := r.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading helm's output: %v", err)
		}
		js, err := utilyaml.ToJSON(doc)
		if err != nil {
			t.Fatalf("helm's output is not YAML: %v\n%s", err, doc)
		}
		var m map[string]any
		if err := json.Unmarshal(js, &m); err != nil {
			t.Fatalf("helm's output: %v\n%s", err, js)
		}
		if m == nil { // comments only
			continue
		}
		o := object{YAML: doc, JSON: js, Map: m}
		o.APIVersion, _ = m["apiVersion"].(string)
		o.Kind, _ = m["kind"].(string)
		o.Name, _ = dig(m, "metadata", "name").(string)
		o.Namespace, _ = dig(m, "metadata", "namespace").(string)
		if o.APIVersion == "" || o.Kind == "" || o.Name == "" {
			t.Fatalf("an object without apiVersion, kind or name:\n%s", doc)
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Fatalf("helm template %s rendered nothing", strings.Join(args, " "))
	}
	return objs
}

// dig walks maps and lists (an int step indexes a list); nil where the
// path is not there.
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// find returns the one rendered object of kind and name.
func find(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return object{}
}

// api is an admin's view of the API server, with what the tests need
// besides kubetest's helper: bodies in YAML, and the resources' names.
type api struct {
	kc     *kubetest.Cluster
	client *http.Client
	// plural maps "group/version kind" to the resource's name, from the
	// API server's discovery.
	plural map[string]string
}

func newAPI(t *testing.T, kc *kubetest.Cluster) *api {
	t.Helper()
	ca, err := os.ReadFile(kc.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("no certificate in %s", kc.CAFile)
	}
	return &api{kc: kc, plural: map[string]string{},
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}
}

// groupPath is where a group version's resources are: /api/v1 or
// /apis/GROUP/VERSION.
func groupPath(apiVersion string) string {
	if apiVersion == "v1" {
		return "/api/v1"
	}
	return "/apis/" + apiVersion
}

// path is the URL path objects of o's kind are created at, the
// resource's name found by discovery.
func (a *api) path(t *testing.T, o object) string {
	t.Helper()
	key := o.APIVersion + " " + o.Kind
	if _, ok := a.plural[key]; !ok {
		code, body := a.kc.Do(t, a.kc.AdminToken, http.MethodGet, groupPath(o.APIVersion), nil)
		if code != http.StatusOK {
			t.Fatalf("discovery of %s: %d %s", o.APIVersion, code, body)
		}
		var list struct {
			Resources []struct {
				Name, Kind string
				Namespaced bool
			}
		}
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatalf("discovery of %s: %v", o.APIVersion, err)
		}
		for _, r := range list.Resources {
			if !strings.Contains(r.Name, "/") { // not a subresource
				p := r.Name
				if r.Namespaced {
					p = "namespaces/{ns}/" + p
				}
				a.plural[o.APIVersion+" "+r.Kind] = p
			}
		}
		if _, ok := a.plural[key]; !ok {
			t.Fatalf("the API server serves no %s in %s", o.Kind, o.APIVersion)
		}
	}
	return groupPath(o.APIVersion) + "/" + strings.ReplaceAll(a.plural[key], "{ns}", o.Namespace)
}

// create posts o as the admin, in YAML as helm wrote it or in JSON as
// client-go (and so helm install) sends it, with strict field
// validation: a field the API does not know (a typo, a field at the
// wrong level) is refused rather than dropped in silence.
func (a *api) create(t *testing.T, o object, asYAML bool) (int, []byte) {
	t.Helper()
	body, ctype := o.JSON, "application/json"
	if asYAML {
		body, ctype = o.YAML, "application/yaml"
	}
	req, err := http.NewRequest(http.MethodPost, a.kc.URL+a.path(t, o)+"?fieldValidation=Strict", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+a.kc.AdminToken)
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Accept", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		t.Fatalf("create %s: %v", o, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// can asks the API server, by a SubjectAccessReview, whether the service
// account ns/sa may do verb on resource (of group) in namespace resNS,
// the object name when given: what RBAC decides for its token.
func (a *api) can(t *testing.T, ns, sa, verb, group, resource, resNS, name string) bool {
	t.Helper()
	code, body := a.kc.Do(t, a.kc.AdminToken, http.MethodPost, "/apis/authorization.k8s.io/v1/subjectaccessreviews", map[string]any{
		"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
		"spec": map[string]any{
			"user":   "system:serviceaccount:" + ns + ":" + sa,
			"groups": []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			"resourceAttributes": map[string]any{
				"namespace": resNS, "verb": verb, "group": group, "resource": resource, "name": name,
			},
		},
	})
	if code != http.StatusCreated {
		t.Fatalf("SubjectAccessReview: %d %s", code, body)
	}
	var r struct {
		Status struct {
			Allowed bool
			Reason  string
		}
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return r.Status.Allowed
}

// token asks the API server for a token of the service account ns/sa
// (TokenRequest), as the kubelet does for its pods.
func (a *api) token(t *testing.T, ns, sa string) string {
	t.Helper()
	code, body := a.kc.Do(t, a.kc.AdminToken, http.MethodPost, "/api/v1/namespaces/"+ns+"/serviceaccounts/"+sa+"/token", map[string]any{
		"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"spec": map[string]any{"audiences": []string{kubetest.Issuer}, "expirationSeconds": 600},
	})
	if code != http.StatusCreated {
		t.Fatalf("a token of %s/%s: %d %s", ns, sa, code, body)
	}
	var r struct{ Status struct{ Token string } }
	if err := json.Unmarshal(body, &r); err != nil || r.Status.Token == "" {
		t.Fatalf("a token of %s/%s: %v %s", ns, sa, err, body)
	}
	return r.Status.Token
}

// kinds lists what objs hold, for the log: "2 ServiceAccount, 1 Secret".
func kinds(objs []object) string {
	n := map[string]int{}
	for _, o := range objs {
		n[o.Kind]++
	}
	var out []string
	for k, c := range n {
		out = append(out, fmt.Sprintf("%d %s", c, k))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

//go:build linux

package kube

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/testutil/kubetest"
)

// The single-node cluster's addresses: a bridge of the test's own, which
// the API server binds (pods reach it there) and the CNI bridge plugin
// puts the pods on; and the name the kubelet registers.
const (
	bridgeName = "vivkube0"
	bridgeCIDR = "10.217.0.1/24"
	hostIP     = "10.217.0.1"
	podSubnet  = "10.217.0.0/24"
	nodeName   = "vivarium-test-node"
	nodeNS     = "vivarium"
	release    = "vivarium"
)

// TestSingleNodeCluster runs the chart for real on one Kubernetes node
// made of this machine: etcd and kube-apiserver (kubetest), the
// controller manager and the scheduler, containerd with runc and the CNI
// bridge plugin, and a kubelet, every one with its own directories, and
// the images (a pause image and Vivarium's) imported from files
// scripts/kube/node.sh built: no registry. It installs the chart with
// helm, waits for the node pod and the gateway pods to be ready, makes an
// API key, creates a sandbox through a gateway pod and runs print(1+1) in
// it, then takes everything down and checks that nothing is left:
// processes, mounts, network namespaces, the bridge, cgroups.
//
// Opt-in (VIVARIUM_KUBE_NODE=1): it needs root, scripts/kube/node.sh's
// builds (minutes, once) and some minutes of two cores, more than CI's
// budget. Every step is logged with its time; a failure says which step
// failed, and how far the cluster had got.
func TestSingleNodeCluster(t *testing.T) {
	if os.Getenv("VIVARIUM_KUBE_NODE") != "1" {
		t.Skip("opt-in: VIVARIUM_KUBE_NODE=1, after scripts/kube/build.sh, scripts/kube/helm.sh and scripts/kube/node.sh")
	}
	testutil.RequireRoot(t)
	helm := requireHelm(t)
	build, err := findNodeBuild()
	if err != nil {
		t.Fatal(err)
	}
	s := newSteps(t)
	dir := shortTempDir(t)
	n := &node{t: t, dir: dir, build: build, s: s, noIOLimit: os.Getenv("VIVARIUM_KUBE_NODE_NO_IO_LIMIT") == "1"}
	if n.noIOLimit {
		t.Log("VIVARIUM_KUBE_NODE_NO_IO_LIMIT=1: the nodes run with --insecure-no-io-limit (sandboxes without a disk I/O limit)")
	}
	n.checkLeftovers() // registered first: runs after every other cleanup

	s.do("bridge "+bridgeName+" "+bridgeCIDR, n.bridge)
	s.do("cgroup root", n.cgroupRoot)
	var kc *kubetest.Cluster
	s.do("etcd and kube-apiserver at "+hostIP, func() error {
		kc = kubetest.StartWith(t, kubetest.Options{Address: hostIP},
			kubetest.User{Name: "system:node:" + nodeName, Groups: []string{"system:nodes"}})
		n.kc = kc
		return nil
	})
	s.do("containerd", n.containerd)
	s.do("images", n.images)
	s.do("kube-controller-manager and kube-scheduler", n.controlPlane)
	s.do("kubelet, node Ready", n.kubelet)
	s.do("helm install", func() error { return n.helmInstall(helm) })
	s.do("pods Ready", n.podsReady)
	s.do("vivarium doctor in the node pod", n.doctor)
	var gwURL, key string
	s.do("an API key (vivarium keys create --cluster)", func() (err error) {
		key, err = n.apiKey()
		return err
	})
	s.do("a sandbox through a gateway pod, print(1+1)", func() (err error) {
		gwURL, err = n.gatewayURL()
		if err != nil {
			return err
		}
		return n.execute(gwURL, key)
	})
	s.do("helm uninstall, pods gone", func() error { return n.uninstall(helm) })
}

// node is the cluster being made, and what its steps share.
type node struct {
	t        *testing.T
	dir      string // the test's directory (short: unix socket paths)
	build    string // scripts/kube/node.sh's output
	s        *steps
	kc       *kubetest.Cluster
	sock     string // containerd's socket
	cgroup   string // the kubelet's --cgroup-root
	image    string // Vivarium's image, as the chart names it
	vivarium string // the vivarium binary in the image
	kubeletD *daemon
	// VIVARIUM_KUBE_NODE_NO_IO_LIMIT=1: the nodes run with
	// --insecure-no-io-limit. In a pod the native backend finds no disk
	// behind its / (an overlay whose layers are paths of the host's,
	// not visible in the pod); the chart names the data directory's
	// (node.ioDiskOf, --io-disk-of), and this takes the limit away.
	noIOLimit bool
	// Whether /var/lib/cni was there before containerd started.
	cniCacheExisted bool
}

// helmInstall installs the chart as an operator would, with the local
// image (never pulled), the nodes' data in an emptyDir (nothing of the
// host's), and the API server's address for pods: there is no kube-proxy,
// so the "kubernetes" Service's address (10.0.0.1) leads nowhere, and
// in-cluster clients are told where the API server is instead.
func (n *node) helmInstall(helm string) error {
	code, body := n.kc.Do(n.t, n.kc.AdminToken, http.MethodPost, "/api/v1/namespaces", map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": nodeNS, "labels": map[string]any{"pod-security.kubernetes.io/enforce": "privileged"}}})
	if code != http.StatusCreated {
		return fmt.Errorf("namespace %s: %d %s", nodeNS, code, body)
	}
	repo, tag, _ := strings.Cut(n.image, ":")
	port := n.kc.URL[strings.LastIndex(n.kc.URL, ":")+1:]
	env := func(prefix string) []string {
		return []string{
			prefix + ".extraEnv[0].name=KUBERNETES_SERVICE_HOST", prefix + ".extraEnv[0].value=" + hostIP,
			prefix + ".extraEnv[1].name=KUBERNETES_SERVICE_PORT", prefix + ".extraEnv[1].value=" + port,
		}
	}
	sets := append([]string{
		"image.repository=" + repo, "image.tag=" + tag, "image.pullPolicy=Never",
		"node.storage.type=emptyDir", "node.terminationGracePeriodSeconds=10",
	}, append(env("node"), env("gateway")...)...)
	if n.noIOLimit {
		sets = append(sets, "node.extraArgs[0]=--insecure-no-io-limit")
	}
	args := []string{"install", release, chartDir(n.t), "--namespace", nodeNS, "--kubeconfig", n.kc.Kubeconfig(kubetest.AdminUser)}
	for _, s := range sets {
		args = append(args, "--set-string", s)
	}
	out, err := n.helm(helm, args...)
	if err != nil {
		return fmt.Errorf("helm install: %v\n%s", err, out)
	}
	return nil
}

func (n *node) helm(helm string, args ...string) ([]byte, error) {
	cmd := exec.Command(helm, args...)
	home := filepath.Join(n.dir, "helm")
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	return cmd.CombinedOutput()
}

// pod is what the test reads of a Pod.
type pod struct {
	Metadata struct {
		Name   string
		Labels map[string]string
	}
	Spec   struct{ NodeName string }
	Status struct {
		Phase, PodIP, Reason, Message string
		Conditions                    []struct{ Type, Status, Reason, Message string }
		ContainerStatuses             []struct {
			Name         string
			ContainerID  string
			Ready        bool
			RestartCount int
			State        map[string]struct {
				Reason, Message string
				ExitCode        int
			}
			LastState map[string]struct {
				Reason, Message string
				ExitCode        int
			} `json:"lastState"`
		}
	}
}

func (p pod) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

func (p pod) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s) phase %s", p.Metadata.Name, p.Metadata.Labels["app.kubernetes.io/component"], p.Status.Phase)
	if p.Status.PodIP != "" {
		fmt.Fprintf(&b, " ip %s", p.Status.PodIP)
	}
	if p.Status.Reason != "" || p.Status.Message != "" {
		fmt.Fprintf(&b, " (%s: %s)", p.Status.Reason, p.Status.Message)
	}
	for _, c := range p.Status.Conditions {
		if c.Status != "True" {
			fmt.Fprintf(&b, "; %s=%s %s %s", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	for _, c := range p.Status.ContainerStatuses {
		fmt.Fprintf(&b, "; container %s ready=%v restarts=%d", c.Name, c.Ready, c.RestartCount)
		for k, v := range c.State {
			fmt.Fprintf(&b, " %s %s %s (exit %d)", k, v.Reason, v.Message, v.ExitCode)
		}
		for k, v := range c.LastState {
			fmt.Fprintf(&b, " last %s %s %s (exit %d)", k, v.Reason, v.Message, v.ExitCode)
		}
	}
	return b.String()
}

func (n *node) pods() ([]pod, error) {
	code, body := n.kc.Do(n.t, n.kc.AdminToken, http.MethodGet, "/api/v1/namespaces/"+nodeNS+"/pods", nil)
	if code != http.StatusOK {
		return nil, fmt.Errorf("list pods: %d %s", code, body)
	}
	var l struct{ Items []pod }
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, err
	}
	return l.Items, nil
}

// events returns the namespace's events, oldest first, one a line.
func (n *node) events(ns string) string {
	code, body := n.kc.Do(n.t, n.kc.AdminToken, http.MethodGet, "/api/v1/namespaces/"+ns+"/events", nil)
	if code != http.StatusOK {
		return fmt.Sprintf("(events: %d)", code)
	}
	var l struct {
		Items []struct {
			InvolvedObject        struct{ Kind, Name string }
			Type, Reason, Message string
			Count                 int
		}
	}
	json.Unmarshal(body, &l)
	var b strings.Builder
	for _, e := range l.Items {
		fmt.Fprintf(&b, "  %s %s/%s %s: %s (x%d)\n", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message, e.Count)
	}
	return b.String()
}

// podsReady waits for the node pod (one, the DaemonSet's) and the
// gateway pods (the Deployment's two) to be Ready. On a timeout it says
// what each pod's status, the namespace's events and the containers'
// logs were.
func (n *node) podsReady() error {
	deadline := time.Now().Add(5 * time.Minute)
	start := time.Now()
	seen := map[string]bool{}
	var last []pod
	for time.Now().Before(deadline) {
		ps, err := n.pods()
		if err != nil {
			return err
		}
		last = ps
		nodes, gws := 0, 0
		for _, p := range ps {
			if p.Status.Phase == "Running" && !seen[p.Metadata.Name+" running"] {
				seen[p.Metadata.Name+" running"] = true
				n.t.Logf("  %s Running after %v", p.Metadata.Name, time.Since(start).Round(100*time.Millisecond))
			}
			if !p.ready() {
				continue
			}
			if !seen[p.Metadata.Name+" ready"] {
				seen[p.Metadata.Name+" ready"] = true
				n.t.Logf("  %s Ready after %v (ip %s)", p.Metadata.Name, time.Since(start).Round(100*time.Millisecond), p.Status.PodIP)
			}
			switch p.Metadata.Labels["app.kubernetes.io/component"] {
			case "node":
				nodes++
			case "gateway":
				gws++
			}
		}
		if nodes == 1 && gws == 2 {
			return nil
		}
		time.Sleep(time.Second)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "not every pod Ready after 5 minutes:\n")
	for _, p := range last {
		fmt.Fprintf(&b, "  %s\n", p)
	}
	fmt.Fprintf(&b, "events in %s:\n%s", nodeNS, n.events(nodeNS))
	fmt.Fprintf(&b, "containers' logs:\n%s", n.podLogs(30))
	return fmt.Errorf("%s", b.String())
}

// doctor runs `vivarium doctor` in the node pod's container (through
// containerd: the API server has no credentials for the kubelet's exec)
// and logs what it says works there. Informational: it fails only if
// it cannot be run.
func (n *node) doctor() error {
	ps, err := n.pods()
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.Metadata.Labels["app.kubernetes.io/component"] != "node" || len(p.Status.ContainerStatuses) == 0 {
			continue
		}
		id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
		cmd := exec.Command("ctr", "--address", n.sock, "--namespace", "k8s.io", "tasks", "exec", "--exec-id", "doctor-"+randHex(4), id, "vivarium", "doctor",
			"--io-disk-of=/var/lib/vivarium") // as the chart's node serves
		out, err := cmd.CombinedOutput()
		if len(out) == 0 {
			return fmt.Errorf("vivarium doctor in %s: %v (no output)", p.Metadata.Name, err)
		}
		n.t.Logf("  vivarium doctor in %s (exit: %v):\n%s", p.Metadata.Name, err, out)
		return nil
	}
	return fmt.Errorf("no node pod with a container")
}

// apiKey makes a key as an operator does, with the binary that is in the
// image, and returns its token.
func (n *node) apiKey() (string, error) {
	cmd := exec.Command(n.vivarium, "keys", "create", "--cluster", "--kubeconfig", n.kc.Kubeconfig(kubetest.AdminUser),
		"--namespace", nodeNS, "--json", "kube-node-test")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		return "", fmt.Errorf("vivarium keys create: %v: %s%s", err, out, stderr)
	}
	var k struct{ Token string }
	if err := json.Unmarshal(out, &k); err != nil || k.Token == "" {
		return "", fmt.Errorf("vivarium keys create printed %q: %v", out, err)
	}
	return k.Token, nil
}

// gatewayURL returns a Ready gateway pod's address, which the host
// reaches on the bridge (no kube-proxy: the Service's ClusterIP is not
// routed; the Service's own EndpointSlice names the same pods).
func (n *node) gatewayURL() (string, error) {
	ps, err := n.pods()
	if err != nil {
		return "", err
	}
	for _, p := range ps {
		if p.Metadata.Labels["app.kubernetes.io/component"] == "gateway" && p.ready() && p.Status.PodIP != "" {
			return "http://" + p.Status.PodIP + ":8080", nil
		}
	}
	return "", fmt.Errorf("no Ready gateway pod")
}

// execute creates a sandbox through the gateway, runs print(1+1) in it
// and deletes it. The first creation may wait for the node's Lease to
// reach the gateway's watch: the gateway answers 503 no_node until then.
func (n *node) execute(gw, key string) error {
	client := &http.Client{Timeout: 2 * time.Minute}
	call := func(method, path string, body any, out any) (int, string, error) {
		var b []byte
		if body != nil {
			b, _ = json.Marshal(body)
		}
		r := bytes.NewReader(b)
		req, err := http.NewRequest(method, gw+path, r)
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			return 0, "", err
		}
		if out != nil {
			json.Unmarshal(raw, out)
		}
		return resp.StatusCode, string(raw), nil
	}
	var info struct{ ID string }
	start := time.Now()
	var code int
	var body string
	var err error
	for time.Since(start) < time.Minute {
		code, body, err = call(http.MethodPost, "/v1/sandboxes", map[string]any{}, &info)
		if err == nil && !(code == http.StatusServiceUnavailable && strings.Contains(body, `"no_node"`)) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil || code/100 != 2 {
		return fmt.Errorf("POST %s/v1/sandboxes: %d %s %v\ngateway and node logs:\n%s", gw, code, body, err, n.podLogs(20))
	}
	n.t.Logf("  sandbox %s created through %s in %v", info.ID, gw, time.Since(start).Round(time.Millisecond))
	execStart := time.Now()
	var res struct {
		Status, Stdout string
	}
	code, body, err = call(http.MethodPost, "/v1/sandboxes/"+info.ID+"/execute", map[string]any{"code": "print(1+1)"}, &res)
	if err != nil || code != http.StatusOK || res.Status != "ok" || res.Stdout != "2\n" {
		return fmt.Errorf("execute print(1+1) in %s: %d %s %v\nlogs:\n%s", info.ID, code, body, err, n.podLogs(20))
	}
	n.t.Logf("  print(1+1) printed %q in %v (first execution)", res.Stdout, time.Since(execStart).Round(time.Millisecond))
	if code, body, err := call(http.MethodDelete, "/v1/sandboxes/"+info.ID, nil, nil); err != nil || code/100 != 2 {
		return fmt.Errorf("DELETE %s: %d %s %v", info.ID, code, body, err)
	}
	return nil
}

// uninstall removes the release and waits until its pods are gone: the
// kubelet has stopped their containers and torn down their sandboxes
// (their network namespaces and veths with them).
func (n *node) uninstall(helm string) error {
	if out, err := n.helm(helm, "uninstall", release, "--namespace", nodeNS, "--kubeconfig", n.kc.Kubeconfig(kubetest.AdminUser)); err != nil {
		return fmt.Errorf("helm uninstall: %v\n%s", err, out)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		ps, err := n.pods()
		if err != nil {
			return err
		}
		if len(ps) == 0 {
			return nil
		}
		time.Sleep(time.Second)
	}
	ps, _ := n.pods()
	return fmt.Errorf("pods still there 2 minutes after helm uninstall: %v", ps)
}

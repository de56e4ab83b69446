// Package cluster is how Vivarium's nodes and gateways find each other in
// a Kubernetes cluster (issue 16, docs/kubernetes.md): each node keeps a
// Lease of its own in the cluster's namespace, renewed every second or
// so, carrying the address gateways reach it at and its load; gateways
// watch those Leases and route to the nodes whose Lease is alive. Nothing
// else is shared on the request path: a sandbox's id names its node
// (internal/sandboxid).
//
// It is the only user of Kubernetes' client library (k8s.io/client-go),
// kept behind this package's small API.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
)

// Labels and annotations of a node's Lease.
const (
	labelName      = "app.kubernetes.io/name"
	labelComponent = "app.kubernetes.io/component"
	appName        = "vivarium"
	componentNode  = "node"

	annoAddr      = "vivarium.dev/addr"
	annoSandboxes = "vivarium.dev/sandboxes"
	annoMemory    = "vivarium.dev/memory-available"
	annoCPUs      = "vivarium.dev/cpus"
)

// DefaultLeaseDuration is how long a node's Lease holds without renewal:
// a node that stops renewing (killed, cut off) leaves routing within it.
const DefaultLeaseDuration = 5 * time.Second

// Node is a node as its Lease describes it.
type Node struct {
	Name string
	// Addr is where gateways reach its API: a base URL
	// (http://10.0.0.7:8080).
	Addr string
	// Load, as the node last said.
	Sandboxes       int
	MemoryAvailable int64 // bytes
	CPUs            int
	// Owners counts its sandboxes per key, Running its executions (and
	// commands) running now per key (keys.go).
	Owners, Running map[string]int
	// Renewed is when the node last renewed its Lease; it holds until
	// Renewed + Duration.
	Renewed  time.Time
	Duration time.Duration
}

// Alive reports whether the node's Lease holds at now.
func (n Node) Alive(now time.Time) bool { return now.Before(n.Renewed.Add(n.Duration)) }

// Config says which cluster and namespace.
type Config struct {
	// Kubeconfig is a kubeconfig file's path; "": the pod's own
	// service account (in-cluster).
	Kubeconfig string
	Namespace  string
	// LeaseDuration: DefaultLeaseDuration when zero.
	LeaseDuration time.Duration
	Logger        *slog.Logger
}

// Client talks to the cluster's API server.
type Client struct {
	cfg  Config
	rest *rest.RESTClient // of coordination.k8s.io/v1: Leases
	core *rest.RESTClient // of v1: Secrets (keys.go)
}

// scheme knows Leases and the core group's types alone: the client links
// no other API group. Made on first use: every process of the binary (a
// sandbox's init too) would pay for it at its start.
var scheme = sync.OnceValue(func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := coordinationv1.AddToScheme(s); err != nil {
		panic(err)
	}
	if err := corev1.AddToScheme(s); err != nil {
		panic(err)
	}
	metav1.AddToGroupVersion(s, coordinationv1.SchemeGroupVersion)
	metav1.AddToGroupVersion(s, corev1.SchemeGroupVersion)
	return s
})

// New connects to the API server of cfg (nothing is asked of it yet).
func New(cfg Config) (*Client, error) {
	if cfg.Namespace == "" {
		return nil, errors.New("cluster: no namespace")
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	var rc *rest.Config
	var err error
	if cfg.Kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("cluster: the API server's address and credentials: %w", err)
	}
	rc.UserAgent = "vivarium"
	client := func(gv schema.GroupVersion, path string) (*rest.RESTClient, error) {
		c := rest.CopyConfig(rc)
		c.GroupVersion, c.APIPath = &gv, path
		c.ContentType = runtime.ContentTypeJSON
		c.NegotiatedSerializer = serializer.NewCodecFactory(scheme()).WithoutConversion()
		return rest.RESTClientFor(c)
	}
	leases, err := client(coordinationv1.SchemeGroupVersion, "/apis")
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	core, err := client(corev1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	return &Client{cfg: cfg, rest: leases, core: core}, nil
}

func leaseName(node string) string { return "vivarium-node-" + node }

// Announce keeps node's Lease, renewed every third of the lease's
// duration with what status says, until ctx ends; then it deletes it, so
// that a node that stops cleanly leaves routing at once. It returns once
// the Lease is first written (or that failed): the renewals go on in the
// background, logged when they fail. A Lease renewed from another address
// (the node's last run, or a second node of the same name) is taken once
// it expires: two live nodes of one name would not both hold it.
func (c *Client) Announce(ctx context.Context, name string, status func() Node) error {
	if !sandboxid.ValidNode(name) {
		return fmt.Errorf("cluster: node name %q is not a DNS label (lower-case letters, digits, '-'; at most 63)", name)
	}
	err := c.renew(ctx, name, status())
	var held *heldError
	if errors.As(err, &held) {
		// The node's last run, at another address (a pod started
		// again): its Lease holds a few seconds more, then is ours.
		c.cfg.Logger.Info("cluster: the node's Lease is held by its last run; waiting for it to expire", "node", name, "wait", held.wait)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(held.wait):
		}
		err = c.renew(ctx, name, status())
	}
	if err != nil {
		return err
	}
	go func() {
		t := time.NewTicker(c.cfg.LeaseDuration / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				err := c.leaseReq(c.rest.Delete(), name).Do(dctx).Error()
				cancel()
				if err != nil && !apierrors.IsNotFound(err) {
					c.cfg.Logger.Warn("cluster: the node's lease was not removed", "err", err)
				}
				return
			case <-t.C:
				if err := c.renew(ctx, name, status()); err != nil && ctx.Err() == nil {
					c.cfg.Logger.Warn("cluster: lease not renewed", "node", name, "err", err)
				}
			}
		}
	}()
	return nil
}

// heldError: a node's Lease holds, renewed from another address.
type heldError struct {
	node, addr string
	wait       time.Duration // until it expires
}

func (e *heldError) Error() string {
	return fmt.Sprintf("cluster: node %q is alive at %s: two nodes of one name?", e.node, e.addr)
}

// renew writes node's Lease once, within a lease duration (a renewal
// that takes longer is of no use: the Lease has lapsed). A Lease that
// holds, renewed from another address, is another process's of the same
// name: left to it (heldError).
func (c *Client) renew(ctx context.Context, name string, n Node) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.LeaseDuration)
	defer cancel()
	now := metav1.NewMicroTime(time.Now())
	secs := int32((c.cfg.LeaseDuration + time.Second - 1) / time.Second)
	spec := coordinationv1.LeaseSpec{HolderIdentity: &name, LeaseDurationSeconds: &secs, RenewTime: &now}
	annotations := map[string]string{
		annoAddr: n.Addr, annoSandboxes: strconv.Itoa(n.Sandboxes),
		annoMemory: strconv.FormatInt(n.MemoryAvailable, 10), annoCPUs: strconv.Itoa(n.CPUs),
		annoKeys: encodeOwners(n.Owners), annoRunning: encodeOwners(n.Running),
	}
	l := &coordinationv1.Lease{}
	err := c.leaseReq(c.rest.Get(), name).Do(ctx).Into(l)
	if apierrors.IsNotFound(err) {
		spec.AcquireTime = &now
		return c.rest.Post().Namespace(c.cfg.Namespace).Resource("leases").Body(&coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: leaseName(name), Namespace: c.cfg.Namespace,
				Labels:      map[string]string{labelName: appName, labelComponent: componentNode},
				Annotations: annotations},
			Spec: spec}).Do(ctx).Error()
	}
	if err != nil {
		return err
	}
	old := nodeOf(l)
	if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != name {
		return fmt.Errorf("cluster: lease %s is held by %q", l.Name, *l.Spec.HolderIdentity)
	}
	if now := time.Now(); old.Addr != n.Addr && old.Alive(now) {
		// Another process renews it: never taken from it while it does.
		return &heldError{node: name, addr: old.Addr, wait: old.Renewed.Add(old.Duration).Sub(now) + 100*time.Millisecond}
	}
	spec.AcquireTime = l.Spec.AcquireTime
	if spec.AcquireTime == nil || !old.Alive(time.Now()) {
		spec.AcquireTime = &now
	}
	l.Spec, l.Annotations = spec, annotations
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[labelName], l.Labels[labelComponent] = appName, componentNode
	return c.leaseReq(c.rest.Put(), name).Body(l).Do(ctx).Error()
}

// leaseReq is r on node name's Lease.
func (c *Client) leaseReq(r *rest.Request, name string) *rest.Request {
	return r.Namespace(c.cfg.Namespace).Resource("leases").Name(leaseName(name))
}

// nodeOf reads a node's Lease.
func nodeOf(l *coordinationv1.Lease) Node {
	n := Node{Name: l.Name[len("vivarium-node-"):], Addr: l.Annotations[annoAddr]}
	if l.Spec.HolderIdentity != nil {
		n.Name = *l.Spec.HolderIdentity
	}
	n.Sandboxes, _ = strconv.Atoi(l.Annotations[annoSandboxes])
	n.MemoryAvailable, _ = strconv.ParseInt(l.Annotations[annoMemory], 10, 64)
	n.CPUs, _ = strconv.Atoi(l.Annotations[annoCPUs])
	json.Unmarshal([]byte(l.Annotations[annoKeys]), &n.Owners)
	json.Unmarshal([]byte(l.Annotations[annoRunning]), &n.Running)
	if l.Spec.RenewTime != nil {
		n.Renewed = l.Spec.RenewTime.Time
	}
	if l.Spec.LeaseDurationSeconds != nil {
		n.Duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return n
}

// View is a gateway's view of the nodes: the Leases of the namespace,
// kept up to date by a watch.
type View struct {
	// pod, where set (WatchPods), is the node pod of a name: a node is
	// routed to only at its pod's IP.
	pod     func(name string) (*corev1.Pod, bool)
	mu      sync.Mutex
	lister  func() ([]*coordinationv1.Lease, error)
	get     func(name string) (*coordinationv1.Lease, error) // by the Lease's name
	pending map[string]int                                   // sandboxes being created, by node, not yet in a Lease

	parsedMu sync.Mutex
	parsed   map[string]parsedLease // by the Lease's name
}

// Watch starts watching the nodes' Leases until ctx ends and returns once
// the first list has arrived (within 30 s).
func (c *Client) Watch(ctx context.Context) (*View, error) {
	store, err := c.watch(ctx, c.rest, "leases", labels.Set{labelName: appName, labelComponent: componentNode},
		&coordinationv1.Lease{}, nil, "the nodes' leases")
	if err != nil {
		return nil, err
	}
	get := func(name string) (*coordinationv1.Lease, error) {
		l, _ := byName[*coordinationv1.Lease](store, c.cfg.Namespace, name)
		return l, nil
	}
	return &View{pending: map[string]int{}, get: get, lister: func() ([]*coordinationv1.Lease, error) {
		var out []*coordinationv1.Lease
		for _, o := range store.List() {
			if l, ok := o.(*coordinationv1.Lease); ok {
				out = append(out, l)
			}
		}
		return out, nil
	}}, nil
}

// watch keeps a store of the namespace's objects of a resource that carry
// the labels, until ctx ends; it returns once they are listed (within
// 30 s). what names them in the error.
func (c *Client) watch(ctx context.Context, client *rest.RESTClient, resource string, selector labels.Set,
	obj runtime.Object, indexers cache.Indexers, what string) (cache.Indexer, error) {
	lw := cache.NewFilteredListWatchFromClient(client, resource, c.cfg.Namespace,
		func(o *metav1.ListOptions) { o.LabelSelector = selector.String() })
	if indexers == nil {
		indexers = cache.Indexers{}
	}
	store, ctrl := cache.NewIndexerInformer(lw, obj, 0, cache.ResourceEventHandlerFuncs{}, indexers)
	go ctrl.RunWithContext(ctx)
	synced, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(synced.Done(), ctrl.HasSynced) {
		return nil, fmt.Errorf("cluster: %s in %s were not listed: %w", what, c.cfg.Namespace, context.Cause(synced))
	}
	return store, nil
}

// byName is the object of a store (watch) by its namespace and name.
func byName[T runtime.Object](store cache.Store, namespace, name string) (T, bool) {
	var zero T
	o, ok, err := store.GetByKey(namespace + "/" + name)
	if !ok || err != nil {
		return zero, false
	}
	t, ok := o.(T)
	return t, ok
}

// Nodes returns the nodes whose Lease holds now.
func (v *View) Nodes() []Node {
	ls, err := v.lister()
	if err != nil {
		return nil
	}
	now := time.Now()
	var out []Node
	for _, l := range ls {
		if n := v.nodeOf(l); n.Alive(now) && n.Addr != "" && v.atItsPod(n) {
			out = append(out, n)
		}
	}
	return out
}

// atItsPod reports whether n's address is its pod's IP, where the view
// checks pods (WatchPods): a Lease is written by whoever RBAC lets write
// Leases, and a node that could point another's Lease elsewhere would
// receive that node's requests; pods' IPs are the cluster's to give.
func (v *View) atItsPod(n Node) bool {
	if v.pod == nil {
		return true
	}
	p, ok := v.pod(n.Name)
	if !ok {
		return false
	}
	u, err := url.Parse(n.Addr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return false
	}
	for _, pip := range append([]corev1.PodIP{{IP: p.Status.PodIP}}, p.Status.PodIPs...) {
		if a, err := netip.ParseAddr(pip.IP); err == nil && a == ip {
			return true
		}
	}
	return false
}

// WatchPods makes v route to a node only at its pod's IP: the pod of the
// node's name in the namespace, labelled a node of Vivarium (the chart's
// pods), until ctx ends. It returns once the first list has arrived.
func (c *Client) WatchPods(ctx context.Context, v *View) error {
	store, err := c.watch(ctx, c.core, "pods", labels.Set{labelName: appName, labelComponent: componentNode},
		&corev1.Pod{}, nil, "the node pods")
	if err != nil {
		return err
	}
	v.pod = func(name string) (*corev1.Pod, bool) { return byName[*corev1.Pod](store, c.cfg.Namespace, name) }
	return nil
}

// Node returns the node called name if its Lease holds now.
func (v *View) Node(name string) (Node, bool) {
	l, err := v.get(leaseName(name))
	if err != nil || l == nil {
		return Node{}, false
	}
	n := v.nodeOf(l)
	return n, n.Name == name && n.Alive(time.Now()) && n.Addr != "" && v.atItsPod(n)
}

// nodeOf is nodeOf(l), read once per version of the Lease: every request
// a gateway routes asks for its node, and a Lease changes once per
// renewal. The Node's maps are shared: read only.
func (v *View) nodeOf(l *coordinationv1.Lease) Node {
	v.parsedMu.Lock()
	defer v.parsedMu.Unlock()
	if p, ok := v.parsed[l.Name]; ok && p.version == l.ResourceVersion && l.ResourceVersion != "" {
		return p.node
	}
	n := nodeOf(l)
	if v.parsed == nil {
		v.parsed = map[string]parsedLease{}
	}
	if len(v.parsed) > 4096 { // Leases gone: start again
		clear(v.parsed)
	}
	v.parsed[l.Name] = parsedLease{version: l.ResourceVersion, node: n}
	return n
}

// parsedLease is a Lease's node, as of one of its versions.
type parsedLease struct {
	version string
	node    Node
}

// Pick chooses the node for a new sandbox: the fewest sandboxes per CPU
// (counting those this view is creating there and the node has not said
// yet), then the most memory available; it counts one more pending for
// the node chosen until done is called. ok is false where no node is
// alive.
func (v *View) Pick() (n Node, done func(), ok bool) {
	nodes := v.Nodes()
	v.mu.Lock()
	defer v.mu.Unlock()
	best := -1
	load := func(n Node) float64 {
		return float64(n.Sandboxes+v.pending[n.Name]) / float64(max(n.CPUs, 1))
	}
	for i, n := range nodes {
		if best < 0 || load(n) < load(nodes[best]) ||
			load(n) == load(nodes[best]) && n.MemoryAvailable > nodes[best].MemoryAvailable {
			best = i
		}
	}
	if best < 0 {
		return Node{}, nil, false
	}
	n = nodes[best]
	v.pending[n.Name]++
	var once sync.Once
	return n, func() {
		once.Do(func() {
			// The node's next renewal counts it (a second or so):
			// until then it stays pending here.
			time.AfterFunc(2*time.Second, func() {
				v.mu.Lock()
				defer v.mu.Unlock()
				if v.pending[n.Name]--; v.pending[n.Name] <= 0 {
					delete(v.pending, n.Name)
				}
			})
		})
	}, true
}

// NodeName is the name this process has as a node: the pod's name
// (NODE_NAME or POD_NAME, as a chart sets them from the downward API), or
// the host's name.
func NodeName() string {
	for _, v := range []string{"VIVARIUM_NODE_NAME", "POD_NAME", "NODE_NAME"} {
		if s := os.Getenv(v); s != "" {
			return s
		}
	}
	h, _ := os.Hostname()
	return h
}

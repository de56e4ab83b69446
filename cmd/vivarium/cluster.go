package main

// A cluster of Vivarium nodes behind gateways (issue 16,
// docs/kubernetes.md): `vivarium serve --cluster` is a node, `vivarium
// gateway` the one endpoint in front of them. They find each other
// through Leases in the cluster's namespace (internal/cluster).

import (
	"cmp"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/cluster"
	"github.com/vivarium-sandbox/vivarium/internal/gateway"
	"github.com/vivarium-sandbox/vivarium/internal/hostmem"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// clusterConfig is what a node or a gateway needs of the cluster.
type clusterConfig struct {
	enabled    bool // serve --cluster
	node       string
	advertise  string
	kubeconfig string
	namespace  string
	tokenFile  string
	lease      time.Duration
}

// flags registers the cluster's flags on fs; node adds a node's own.
func (cc *clusterConfig) flags(fs *flag.FlagSet, node bool) {
	if node {
		fs.BoolVar(&cc.enabled, "cluster", false, "be a node of a cluster: announce this server in a Lease of --namespace, "+
			"serve only requests that carry the cluster's token (gateways'), and name the node in sandboxes' ids (docs/kubernetes.md)")
		fs.StringVar(&cc.node, "node-name", "", "`NAME` of this node in the cluster, a DNS label (default: $POD_NAME, else the host's name)")
		fs.StringVar(&cc.advertise, "advertise-url", "", "`URL` gateways reach this node at (default: http://<--listen's address>)")
		// A gateway reads each node's duration from its Lease.
		fs.DurationVar(&cc.lease, "lease-duration", cluster.DefaultLeaseDuration, "how long this node's Lease holds unrenewed: "+
			"a node that stops renewing it leaves routing after this")
	}
	fs.StringVar(&cc.kubeconfig, "kubeconfig", "", "`FILE` with the Kubernetes API server's address and credentials (default: the pod's service account)")
	fs.StringVar(&cc.namespace, "namespace", "", "Kubernetes `NAMESPACE` of the cluster's Leases (default: $POD_NAMESPACE, else vivarium)")
	fs.StringVar(&cc.tokenFile, "cluster-token-file", "", "`FILE` holding the token gateways send nodes (a Secret mounted as a file)")
}

// resolve fills the defaults and reads the token.
func (cc *clusterConfig) resolve(node bool) (token string, err error) {
	if cc.namespace == "" {
		cc.namespace = os.Getenv("POD_NAMESPACE")
	}
	if cc.namespace == "" {
		cc.namespace = "vivarium"
	}
	if node {
		if cc.node == "" {
			cc.node = strings.ToLower(cluster.NodeName())
		}
		if !sandboxid.ValidNode(cc.node) {
			return "", fmt.Errorf("--node-name %q is not a DNS label (lower-case letters, digits and '-', at most 63)", cc.node)
		}
	}
	if node && cc.lease < 2*time.Second {
		return "", errors.New("--lease-duration must be at least 2s")
	}
	if cc.tokenFile == "" {
		return "", errors.New("--cluster-token-file is needed: nodes serve only requests with the cluster's token")
	}
	b, err := os.ReadFile(cc.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--cluster-token-file: %w", err)
	}
	token = strings.TrimSpace(string(b))
	if len(token) < 16 {
		return "", errors.New("--cluster-token-file: the token must be at least 16 characters")
	}
	return token, nil
}

func (cc *clusterConfig) client(log *slog.Logger) (*cluster.Client, error) {
	return cluster.New(cluster.Config{Kubeconfig: cc.kubeconfig, Namespace: cc.namespace, LeaseDuration: cc.lease, Logger: log})
}

// requireToken serves next only requests that carry the cluster's token
// (a node's API is its gateways'); /healthz stays open for the kubelet's
// probes.
func requireToken(next http.Handler, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get(gateway.TokenHeader)
		if r.URL.Path != "/healthz" && subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintln(w, `{"error":{"code":"forbidden","message":"this is a node of a cluster: use the cluster's gateway"}}`)
			return
		}
		r.Header.Del(gateway.TokenHeader)
		next.ServeHTTP(w, r)
	})
}

// clusterNode is what a node of a cluster holds of it.
type clusterNode struct {
	cc     *clusterConfig
	client *cluster.Client
	view   *cluster.View
	keys   *cluster.Keys // nil with --dev
}

// join connects to the cluster and watches its nodes and, where withKeys,
// its API keys, until ctx ends.
func (cc *clusterConfig) join(ctx context.Context, log *slog.Logger, withKeys bool) (*clusterNode, error) {
	cl, err := cc.client(log)
	if err != nil {
		return nil, err
	}
	n := &clusterNode{cc: cc, client: cl}
	if n.view, err = cl.Watch(ctx); err != nil {
		return nil, err
	}
	if withKeys {
		if n.keys, err = cl.WatchKeys(ctx); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// elsewhere counts an owner's sandboxes on the other nodes.
func (n *clusterNode) elsewhere(owner string) int { return n.view.Elsewhere(n.cc.node, owner) }

// runningElsewhere counts an owner's executions running on the other nodes.
func (n *clusterNode) runningElsewhere(owner string) int {
	return n.view.RunningElsewhere(n.cc.node, owner)
}

// announce keeps this node's Lease until ctx ends.
func (n *clusterNode) announce(ctx context.Context, log *slog.Logger, ln net.Listener, svc *service.Service) error {
	cc := n.cc
	addr := cc.advertise
	if addr == "" {
		addr = "http://" + ln.Addr().String()
	}
	status := func() cluster.Node {
		return cluster.Node{Addr: addr, Sandboxes: svc.Live(), MemoryAvailable: memAvailable(), CPUs: runtime.NumCPU(),
			Owners: svc.Owners(), Running: svc.Running()}
	}
	if err := n.client.Announce(ctx, cc.node, status); err != nil {
		return fmt.Errorf("cluster: announcing node %s in namespace %s: %w", cc.node, cc.namespace, err)
	}
	log.Info("cluster node announced", "node", cc.node, "namespace", cc.namespace, "addr", addr)
	return nil
}

// clusterKeys is `vivarium keys --cluster`.
func clusterKeys(cc *clusterConfig, sub string, args []string, maxSandboxes, maxExecutions int, closeSandboxes, asJSON bool) int {
	if cc.namespace == "" {
		cc.namespace = cmp.Or(os.Getenv("POD_NAMESPACE"), "vivarium")
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "vivarium keys %s: %v\n", sub, err)
		return 1
	}
	cl, err := cluster.New(cluster.Config{Kubeconfig: cc.kubeconfig, Namespace: cc.namespace})
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch {
	case sub == "create" && len(args) == 1:
		token, k, err := cl.CreateKey(ctx, args[0], maxSandboxes, maxExecutions)
		if err != nil {
			return fail(err)
		}
		if asJSON {
			json.NewEncoder(os.Stdout).Encode(map[string]any{"token": token, "key": k})
			return 0
		}
		fmt.Fprintf(os.Stderr, "created key %s (%s) in namespace %s; the token is shown only this once:\n", k.ID, k.Name, cc.namespace)
		fmt.Println(token)
	case sub == "list" && len(args) == 0:
		keys, err := cl.WatchKeys(ctx)
		if err != nil {
			return fail(err)
		}
		list := keys.List()
		if asJSON {
			if list == nil {
				list = []cluster.Key{}
			}
			json.NewEncoder(os.Stdout).Encode(list)
			return 0
		}
		for _, k := range list {
			state := "live"
			if k.Revoked {
				state = "revoked with its sandboxes"
			}
			fmt.Printf("%s\t%s\t%s\t%s\tmax sandboxes %s\tmax executions %s\n", k.ID, k.Name, k.CreatedAt.Format(time.DateTime),
				state, quota(k.MaxSandboxes), quota(k.MaxExecutions))
		}
	case sub == "revoke" && len(args) == 1:
		if err := cl.RevokeKey(ctx, args[0], closeSandboxes); err != nil {
			return fail(err)
		}
		if closeSandboxes {
			fmt.Fprintf(os.Stderr, "revoked key %s with its sandboxes: every node refuses it and closes them within a moment "+
				"(its Secret is kept, marked; revoking it again deletes it)\n", args[0])
		} else {
			fmt.Fprintf(os.Stderr, "revoked key %s: every node refuses it within a moment; its sandboxes run on, unreachable, "+
				"until their timeout\n", args[0])
		}
	default:
		fmt.Fprint(os.Stderr, keysUsage)
		return 2
	}
	return 0
}

// auditToLog also writes every audit record to the log, for a node of a
// cluster: its database is the node's own, and a cluster collects its
// pods' logs (JSON lines with --log-format json), so that the audit log
// outlives the node and is read across the cluster. Connections the
// audit log counts (store.Counted) are logged as its rows are: one line
// per row, when its window ends, with the count.
func auditToLog(log *slog.Logger, node string, audit *store.AuditLog) func(store.Record) {
	audit.OnCounted(func(r store.Record) { logAudit(log, node, r) })
	return func(r store.Record) {
		audit.Record(r)
		if !store.Counted(r) {
			logAudit(log, node, r)
		}
	}
}

func logAudit(log *slog.Logger, node string, r store.Record) {
	attrs := []any{"node", node, "kind", r.Kind, "key_id", r.KeyID, "sandbox_id", r.SandboxID,
		"code_sha256", r.CodeSHA256, "status", r.Status, "exit_code", r.ExitCode, "duration_ms", r.DurationMS,
		"cpu_ms", r.CPUMS, "peak_memory_bytes", r.PeakMemoryBytes}
	if r.Detail != "" {
		attrs = append(attrs, "detail", r.Detail)
	}
	if r.Host != "" || r.Kind == "port" {
		attrs = append(attrs, "host", r.Host, "port", r.Port, "bytes_in", r.BytesIn, "bytes_out", r.BytesOut)
	}
	if store.Counted(r) {
		attrs = append(attrs, "count", r.Count)
	}
	log.Info("audit", attrs...)
}

// memAvailable is the host's available memory, in bytes (0 where unknown).
func memAvailable() int64 {
	available, _, _ := hostmem.Read()
	return available
}

const gatewayUsage = `Usage: vivarium gateway [flags]

The one endpoint of a cluster of Vivarium nodes (vivarium serve --cluster):
a new sandbox goes to the node with the least load, every later request
for it to its node. It finds the nodes through their Leases in the
Kubernetes namespace, and keeps no state: run as many as you like.
See docs/kubernetes.md.

Flags:
`

func cmdGateway(args []string) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), gatewayUsage); fs.PrintDefaults() }
	var cc clusterConfig
	cc.flags(fs, false)
	listen := fs.String("listen", "127.0.0.1:8080", "`HOST:PORT` to serve on")
	domain := fs.String("domain", "", "preview `DOMAIN` of sandboxes' ports (<port>-<id>.DOMAIN), as the nodes'")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	verifyPods := fs.Bool("verify-pods", false, "route to a node only at the IP of its pod (the pod of its name in --namespace, "+
		"labelled app.kubernetes.io/component=node): a Lease written to point elsewhere is ignored; needs get/list/watch of pods (the chart sets it)")
	if err := envDefaults(fs); err != nil {
		fmt.Fprintf(os.Stderr, "vivarium gateway: %v\n", err)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	level, err := parseLevel(*logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vivarium gateway: --log-level must be debug, info, warn or error")
		return 2
	}
	token, err := cc.resolve(false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vivarium gateway: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	cl, err := cc.client(log)
	if err != nil {
		log.Error("vivarium gateway", "err", err)
		return 1
	}
	view, err := cl.Watch(ctx)
	if err != nil {
		log.Error("vivarium gateway: the nodes cannot be watched", "err", err)
		return 1
	}
	if *verifyPods {
		if err := cl.WatchPods(ctx, view); err != nil {
			log.Error("vivarium gateway: --verify-pods: the node pods cannot be watched", "err", err)
			return 1
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("vivarium gateway", "err", err)
		return 1
	}
	gw := gateway.New(gateway.Config{Nodes: view, Token: token, Logger: log, Domain: *domain})
	srv := &http.Server{
		Handler:           httpapi.IdleBodies(httpapi.CheckHost(gw, nil, *domain), httpapi.BodyIdleTimeout),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	log.Info("vivarium gateway serving", "addr", ln.Addr().String(), "namespace", cc.namespace, "nodes", len(view.Nodes()))
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("vivarium gateway", "err", err)
		return 1
	}
	return 0
}

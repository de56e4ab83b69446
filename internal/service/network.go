package service

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/pkgindex"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// NetworkConfig is what a service needs to give sandboxes network access.
type NetworkConfig struct {
	// Policy bounds every sandbox's; nil: no sandbox gets any network.
	Policy *netpolicy.Server
	// Packages is the package index sandboxes may install from; nil:
	// none.
	Packages *pkgindex.Index
	// Resolver and Dial replace name resolution and connecting for every
	// proxy (tests point names at their own servers); nil: the system's.
	Resolver netpolicy.Resolver
	Dial     func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
}

// NetworkInfo is what owners see of a sandbox's network access.
type NetworkInfo struct {
	Allow    []string         `json:"allow" doc:"hosts and ranges the sandbox may reach through its proxy"`
	Deny     []string         `json:"deny,omitempty" doc:"hosts and ranges refused even where allow allows them"`
	Except   []string         `json:"except,omitempty" doc:"exceptions to deny"`
	Packages bool             `json:"packages" doc:"the sandbox may install the server's allowed packages"`
	Limits   netpolicy.Limits `json:"limits"`
	Proxy    string           `json:"proxy" doc:"the proxy's address inside the sandbox (HTTP_PROXY and HTTPS_PROXY point there)"`
}

func networkInfo(p *netpolicy.Policy) *NetworkInfo {
	if p.None() {
		return nil
	}
	return &NetworkInfo{Allow: p.Allow(), Deny: p.Denied(), Except: p.Excepted(), Packages: p.Packages, Limits: p.Limits,
		Proxy: sandbox.EgressAddr}
}

// startNetwork sets up what the service needs for network access: the
// package index, served in-process to the sandboxes' proxies.
func (s *Service) startNetwork() {
	n := &s.cfg.Network
	if n.Packages != nil {
		s.pkgService = netproxy.NewInProcess(n.Packages, s.cfg.Logger)
		// A copy: the caller's policy is left as it was.
		p := netpolicy.Server{}
		if n.Policy != nil {
			p = *n.Policy
		}
		p.Packages = true
		n.Policy = &p
	}
}

func (s *Service) stopNetwork() {
	if s.pkgService != nil {
		s.pkgService.Close()
	}
}

// grantNetwork turns an owner's request for a sandbox of a backend ("":
// the default) into the sandbox's policy: nil for no network. A backend
// that cannot carry the proxy is refused here, before anything starts,
// when the request names anything to reach; a request for "all" the
// server allows grants nothing there (the sandbox's info says so).
func (s *Service) grantNetwork(req netpolicy.Request, backend string) (*netpolicy.Policy, error) {
	if req.Empty() && req.Limits == (netpolicy.Limits{}) {
		return nil, nil
	}
	explicit := len(req.Allow) > 0 || req.Packages || len(req.Except) > 0
	if s.cfg.Network.Policy == nil && explicit {
		return nil, fmt.Errorf("%w: this server gives sandboxes no network access (an operator allows hosts with --allow-net)",
			netpolicy.ErrNotAllowed)
	}
	p, err := s.cfg.Network.Policy.Grant(req)
	if err != nil || p == nil {
		return p, err
	}
	if err := sandbox.EgressSupportedBy(s.cfg.Backend, backend); err != nil {
		if !explicit {
			return nil, nil
		}
		return nil, err
	}
	return p, nil
}

// newEgress makes the proxy of one sandbox, which records each of its
// connections in the audit log under the sandbox and its owner.
func (s *Service) newEgress(owner, id string, p *netpolicy.Policy) (*netproxy.Proxy, error) {
	if p.None() {
		return nil, nil
	}
	return s.proxyFor(owner, id, p)
}

// proxyFor makes the proxy of one sandbox with policy p, even one that
// allows nothing (a fork's copy of a sandbox whose access was taken
// away: UpdateNetwork).
func (s *Service) proxyFor(owner, id string, p *netpolicy.Policy) (*netproxy.Proxy, error) {
	cfg := netproxy.Config{
		Checker: s.cfg.Network.Policy.Checker(p, s.cfg.Network.Resolver),
		Dial:    s.cfg.Network.Dial,
		Logger:  s.cfg.Logger,
		Audit: func(e netproxy.Event) {
			s.cfg.Audit(netRecord(owner, id, e))
		},
	}
	if p.Packages && s.pkgService != nil {
		cfg.Services = map[string]func(context.Context) (net.Conn, error){pkgindex.Host: s.pkgService.Dial}
	}
	p2, err := netproxy.New(cfg)
	if err != nil {
		return nil, err
	}
	return p2, nil
}

// withNetwork gives spec the network access of policy: its proxy (nil
// for none; the caller closes it if the sandbox is not made), and the
// environment that lets its Python import what it installs.
func (s *Service) withNetwork(owner, id string, spec sandbox.Spec, policy *netpolicy.Policy) (sandbox.Spec, *netproxy.Proxy, error) {
	e, err := s.newEgress(owner, id, policy)
	if err != nil {
		return spec, nil, err
	}
	if e != nil {
		spec.Egress = e
	}
	if policy != nil && policy.Packages {
		env := maps.Clone(spec.Env)
		if env == nil {
			env = map[string]string{}
		}
		env["PYTHONPATH"] = strings.Trim(PackagesDir+":"+env["PYTHONPATH"], ":")
		spec.Env = env
	}
	return spec, e, nil
}

// makeSandbox creates a sandbox with the network access of policy, and
// returns its proxy too (nil without network), which the sandbox owns.
func (s *Service) makeSandbox(ctx context.Context, owner, id string, spec sandbox.Spec, policy *netpolicy.Policy) (sandbox.Sandbox, *netproxy.Proxy, error) {
	spec, e, err := s.withNetwork(owner, id, spec, policy)
	if err != nil {
		return nil, nil, err
	}
	sb, err := s.cfg.Backend.Create(ctx, spec)
	if err != nil {
		if e != nil {
			e.Close()
		}
		return nil, nil, err
	}
	return sb, e, nil
}

// netRecord is the audit log's record of one connection.
func netRecord(owner, id string, e netproxy.Event) store.Record {
	detail := strings.TrimSpace(strings.Join([]string{e.Method, via(e.Addr), e.Reason}, " "))
	return store.Record{
		Time: e.Time, Kind: "net", KeyID: owner, SandboxID: id, Status: e.Outcome, Detail: detail,
		Host: e.Host, Port: e.Port, BytesIn: e.BytesIn, BytesOut: e.BytesOut,
		DurationMS: float64(e.Duration.Microseconds()) / 1000,
	}
}

func via(addr string) string {
	if addr == "" {
		return ""
	}
	return "via " + addr
}

// PackageRequest names a package to install into a sandbox.
type PackageRequest struct {
	Name    string
	Version string // empty: the newest the index allows
}

// PackageResult is how an installation went.
type PackageResult struct {
	Name       string         `json:"name"`
	Version    string         `json:"version,omitempty"`
	Status     sandbox.Status `json:"status" doc:"ok when pip installed it; error otherwise (output says why)"`
	ExitCode   int            `json:"exit_code"`
	Output     string         `json:"output" doc:"pip's output"`
	DurationMS float64        `json:"duration_ms"`
	Error      string         `json:"error,omitempty"`
}

// PackagesDir is where a sandbox's installed packages go (pip --target):
// in the workspace, so they are the sandbox's own; it is on PYTHONPATH in
// every sandbox that may install packages.
const PackagesDir = "/workspace/.packages"

// installTimeout bounds one installation.
const installTimeout = 5 * time.Minute

// InstallPackage installs an allowed package into an owner's sandbox, with
// pip inside the sandbox, from the server's package index, through the
// sandbox's own proxy: it is the sandbox's alone.
func (s *Service) InstallPackage(ctx context.Context, owner, id string, req PackageRequest) (*PackageResult, error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return nil, err
	}
	ix := s.cfg.Network.Packages
	if ix == nil {
		return nil, fmt.Errorf("%w: this server offers no packages (an operator sets them with --package and --package-dir or --package-index)",
			netpolicy.ErrNotAllowed)
	}
	if p := b.networkPolicy(); p == nil || !p.Packages {
		return nil, fmt.Errorf("%w: this sandbox was created without package installs; create it with \"network\": {\"packages\": true}",
			netpolicy.ErrNotAllowed)
	}
	if err := ix.Allows(req.Name, req.Version); err != nil {
		return nil, err
	}
	spec := req.Name
	if req.Version != "" {
		spec += "==" + req.Version
	}
	argv := []string{"/usr/bin/python3", "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
		"--no-cache-dir", "--only-binary=:all:", "--upgrade", "--target", PackagesDir,
		"--index-url", pkgindex.IndexURL, "--trusted-host", pkgindex.Host, spec}
	res, err := s.run(ctx, owner, id, b, sandbox.Command{Argv: argv}, installTimeout, nil, "package", spec)
	if err != nil {
		return nil, err
	}
	out := &PackageResult{Name: req.Name, Version: req.Version, Status: res.Status, ExitCode: res.ExitCode,
		Output: res.Stdout + res.Stderr, DurationMS: res.DurationMS, Error: res.Error}
	if res.Status == sandbox.StatusError && out.Error == "" {
		out.Error = pipError(out.Output)
	}
	return out, nil
}

// pipError picks the line of pip's output that says why it failed.
func pipError(output string) string {
	lines := strings.Split(strings.TrimSpace(output), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); strings.HasPrefix(l, "ERROR:") {
			if strings.Contains(l, "No matching distribution") {
				return l + " (a package, or a dependency, that is not on the server's allowlist is not in its index)"
			}
			return l
		}
	}
	if strings.Contains(output, "No module named pip") {
		return "pip is not installed on the server (Debian: apt install python3-pip)"
	}
	return "pip failed; see output"
}

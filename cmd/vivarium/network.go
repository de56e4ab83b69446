package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/netproxy"
	"github.com/vivarium-sandbox/vivarium/internal/pkgindex"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// ruleList collects network rules: the flag repeats, and one value may
// hold several rules separated by spaces (commas separate ports within a
// rule).
type ruleList []string

func (l *ruleList) String() string { return strings.Join(*l, " ") }
func (l *ruleList) Set(v string) error {
	*l = append(*l, strings.Fields(v)...)
	return nil
}

// wordList collects names: repeatable, each value comma- or
// space-separated.
type wordList []string

func (l *wordList) String() string { return strings.Join(*l, ",") }
func (l *wordList) Set(v string) error {
	*l = append(*l, strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\n' })...)
	return nil
}

// netServeFlags are the operator's network policy: what sandboxes may be
// given, never more.
type netServeFlags struct {
	allow        ruleList
	deny         wordList
	maxBytes     sizeFlag
	rate         sizeFlag
	maxConns     int
	packages     wordList
	packageDir   string
	packageIndex string
}

func (n *netServeFlags) register(fs *flag.FlagSet) {
	fs.Var(&n.allow, "allow-net", "`RULE` sandboxes may be given network access to, through their proxy (repeatable, or several separated by spaces): "+
		"HOST, *.DOMAIN, CIDR or [IPV6-CIDR], each with :PORTS (80,443 when none). Clients ask for access within these per sandbox; default: no network")
	fs.Var(&n.deny, "deny-net", "`CIDR` always refused, like cloud metadata, loopback and the host's own addresses are (repeatable or comma-separated): say, the host's public address behind NAT")
	fs.Var(&n.maxBytes, "net-max-bytes", "most bytes a sandbox may move through its proxy, both ways, over its life (default 1GiB)")
	fs.Var(&n.rate, "net-rate", "most bytes a second a sandbox's proxy moves, both ways together (default: no limit)")
	fs.IntVar(&n.maxConns, "net-max-connections", 0, "most connections a sandbox may have open at once (0: 16)")
	fs.Var(&n.packages, "package", "`NAME[==VERSION]` sandboxes may install with POST /v1/sandboxes/{id}/packages (repeatable or comma-separated); needs --package-dir or --package-index")
	fs.StringVar(&n.packageDir, "package-dir", "", "`DIR` of wheels the allowed packages are installed from")
	fs.StringVar(&n.packageIndex, "package-index", "", "`URL` of a simple index (PEP 503) the server reaches itself, the allowed packages are relayed from: https://pypi.org/simple/")
}

// config builds the service's network configuration; apiAddr is the
// server's listen address, always refused to sandboxes.
func (n *netServeFlags) config(apiAddr string, log *slog.Logger) (service.NetworkConfig, error) {
	var cfg service.NetworkConfig
	var errs []error
	rules, err := netpolicy.ParseRules(n.allow)
	if err != nil {
		errs = append(errs, fmt.Errorf("--allow-net: %w", err))
	}
	srv := &netpolicy.Server{Rules: rules,
		Limits: netpolicy.Limits{MaxBytes: int64(n.maxBytes), Rate: int64(n.rate), MaxConns: n.maxConns}}
	for _, d := range n.deny {
		p, err := netip.ParsePrefix(d)
		if err != nil {
			if a, aerr := netip.ParseAddr(d); aerr == nil {
				p, err = netip.PrefixFrom(a, a.BitLen()), nil
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("--deny-net %q: want an address or CIDR", d))
			continue
		}
		srv.Deny = append(srv.Deny, p.Masked())
	}
	if ap, err := netip.ParseAddrPort(apiAddr); err == nil {
		srv.DenyAddrs = append(srv.DenyAddrs, ap)
	}
	if err := srv.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch {
	case len(n.packages) > 0 && n.packageDir == "" && n.packageIndex == "":
		errs = append(errs, errors.New("--package needs --package-dir or --package-index: where the wheels come from"))
	case len(n.packages) == 0 && (n.packageDir != "" || n.packageIndex != ""):
		errs = append(errs, errors.New("--package-dir and --package-index need --package: the packages sandboxes may install"))
	case len(n.packages) > 0:
		var allowed []pkgindex.Allowed
		for _, p := range n.packages {
			a, err := pkgindex.ParseAllowed(p)
			if err != nil {
				errs = append(errs, fmt.Errorf("--package: %w", err))
				continue
			}
			allowed = append(allowed, a)
		}
		ix, err := pkgindex.New(pkgindex.Config{Allowed: allowed, Dir: n.packageDir, Upstream: n.packageIndex, Logger: log})
		if err != nil {
			errs = append(errs, err)
		}
		cfg.Packages = ix
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, err
	}
	if len(rules) > 0 {
		cfg.Policy = srv
	} else if cfg.Packages != nil {
		// Packages only: the server's other settings still apply.
		srv.Rules = nil
		cfg.Policy = srv
	}
	return cfg, nil
}

// runEgress is the proxy of a `vivarium run --allow-net`: a policy of its
// own for one run, under the same refusals as a server's (metadata,
// loopback and the host's own addresses are never reached). Refused
// connections are reported on stderr, where the user sees what to allow.
func runEgress(allow []string) (sandbox.Egress, error) {
	if len(allow) == 0 {
		return nil, nil
	}
	rules, err := netpolicy.ParseRules(allow)
	if err != nil {
		return nil, fmt.Errorf("--allow-net: %w", err)
	}
	srv := &netpolicy.Server{Rules: rules}
	p, err := srv.Grant(netpolicy.Request{Allow: allow})
	if err != nil {
		return nil, fmt.Errorf("--allow-net: %w", err)
	}
	return netproxy.New(netproxy.Config{
		Checker: srv.Checker(p, net.DefaultResolver),
		Audit: func(e netproxy.Event) {
			if e.Outcome != netproxy.Allowed {
				fmt.Fprintf(os.Stderr, "vivarium: network: %s %s:%d %s: %s\n", e.Method, e.Host, e.Port, e.Outcome, e.Reason)
			}
		},
	})
}

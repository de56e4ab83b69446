package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// DefaultLimits apply where neither the operator nor the client set one.
var DefaultLimits = Limits{MaxBytes: 1 << 30, MaxConns: 16}

// Server is the operator's policy: the most any sandbox may be given.
type Server struct {
	// Rules bound every sandbox's rules: each rule a client asks for must
	// be within one of these.
	Rules []Rule
	// Packages: a package index is offered (see package pkgindex).
	Packages bool
	// Limits cap what a client may ask for, and are what it gets when it
	// asks for none. Zero fields take DefaultLimits.
	Limits Limits
	// Deny adds ranges refused like metadata addresses, whatever a rule
	// says: say, the host's public address where the host sits behind NAT
	// and does not see it on an interface.
	Deny []netip.Prefix
	// DenyAddrs adds single endpoints refused whatever a rule says: the
	// server's own API listener.
	DenyAddrs []netip.AddrPort
}

// Request is a client's ask for one sandbox, as the API and the CLI
// carry it.
type Request struct {
	// Allow lists rules in ParseRule's syntax.
	Allow []string `json:"allow,omitempty" doc:"hosts and address ranges the sandbox may reach through its proxy: \"api.example.com\", \"*.example.com:443\", \"10.0.0.0/8:5432\", \"[2001:db8::/32]:80,443\"; without ports, 80 and 443. Each must be within the server's allowlist"`
	// All asks for everything the server's allowlist allows, as it is
	// (Allow adds nothing to it then). On a server that allows nothing it
	// grants nothing, without an error: E2B's default, internet access,
	// is this.
	All bool `json:"all,omitempty" doc:"the sandbox may reach all the server's allowlist allows (nothing, on a server that allows nothing); deny narrows it"`
	// Deny and Except narrow what the sandbox may reach (Policy.Deny,
	// Policy.Except); a rule without ports means every port.
	Deny   []string `json:"deny,omitempty" doc:"hosts and address ranges refused even where allow allows them (without ports: every port); an address range applies to the addresses names resolve to too"`
	Except []string `json:"except,omitempty" doc:"exceptions to deny (E2B's allowOut); each must be within the server's allowlist, and it never adds to allow"`
	// Packages asks for the package index.
	Packages bool `json:"packages,omitempty" doc:"the sandbox may install the server's allowed packages (POST /v1/sandboxes/{id}/packages)"`
	Limits
}

// Empty reports whether the request asks for no network.
func (r Request) Empty() bool {
	return len(r.Allow) == 0 && !r.Packages && !r.All && len(r.Deny) == 0 && len(r.Except) == 0
}

// Validate checks the server's policy.
func (s *Server) Validate() error {
	var errs []error
	l := s.Limits
	if l.MaxBytes < 0 || l.Rate < 0 || l.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("%w: network limits cannot be negative", ErrInvalid))
	}
	if l.MaxConns > 4096 {
		errs = append(errs, fmt.Errorf("%w: at most 4096 connections at once per sandbox", ErrInvalid))
	}
	if len(s.Rules) > 4*MaxRules {
		errs = append(errs, fmt.Errorf("%w: at most %d server rules", ErrInvalid, 4*MaxRules))
	}
	return errors.Join(errs...)
}

// limits returns the server's caps with defaults filled in.
func (s *Server) limits() Limits {
	l := s.Limits
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.Rate == 0 {
		l.Rate = DefaultLimits.Rate
	}
	if l.MaxConns == 0 {
		l.MaxConns = DefaultLimits.MaxConns
	}
	return l
}

// Grant turns a client's request into a sandbox's policy, or says what
// in it the server does not allow. An empty request grants nil: no
// network.
func (s *Server) Grant(req Request) (*Policy, error) {
	if req.Empty() {
		if req.Limits != (Limits{}) {
			return nil, fmt.Errorf("%w: network limits without anything to reach; list hosts in \"allow\"", ErrInvalid)
		}
		return nil, nil
	}
	deny, err := ParseRulesAnyPort(req.Deny)
	if err != nil {
		return nil, err
	}
	except, err := ParseRulesAnyPort(req.Except)
	if err != nil {
		return nil, err
	}
	if s == nil || len(s.Rules) == 0 && !s.Packages {
		if len(req.Allow) == 0 && !req.Packages && len(except) == 0 {
			return nil, nil // all of nothing, less what deny refuses
		}
		return nil, fmt.Errorf("%w: this server gives sandboxes no network access", ErrNotAllowed)
	}
	rules, err := ParseRules(req.Allow)
	if err != nil {
		return nil, err
	}
	var refused []string
	for _, r := range rules {
		if !s.covers(r) {
			refused = append(refused, r.String())
		}
	}
	// An exception outside the server's allowlist would never be reached:
	// say so, rather than let the sandbox believe it may reach it.
	for _, r := range except {
		if !slices.ContainsFunc(s.Rules, func(sr Rule) bool { return overlaps(sr, r) }) {
			refused = append(refused, r.String())
		}
	}
	if len(refused) > 0 {
		allowed := "nothing"
		if len(s.Rules) > 0 {
			var list []string
			for _, r := range s.Rules {
				list = append(list, r.String())
			}
			allowed = strings.Join(list, " ")
		}
		return nil, fmt.Errorf("%w: %s not within the server's allowlist (it allows: %s)", ErrNotAllowed,
			strings.Join(refused, ", "), allowed)
	}
	if req.Packages && !s.Packages {
		return nil, fmt.Errorf("%w: this server offers no package index (an operator sets one with --package-dir or --package-index)", ErrNotAllowed)
	}
	caps := s.limits()
	l := req.Limits
	pick := func(name string, got, cap int64) (int64, error) {
		switch {
		case got < 0:
			return 0, fmt.Errorf("%w: %s cannot be negative", ErrInvalid, name)
		case got == 0:
			return cap, nil
		case cap > 0 && got > cap:
			return 0, fmt.Errorf("%w: %s %d is over the server's limit of %d", ErrNotAllowed, name, got, cap)
		}
		return got, nil
	}
	var errs [3]error
	l.MaxBytes, errs[0] = pick("max_bytes", l.MaxBytes, caps.MaxBytes)
	l.Rate, errs[1] = pick("rate", l.Rate, caps.Rate)
	conns, err := pick("max_connections", int64(l.MaxConns), int64(caps.MaxConns))
	errs[2] = err
	l.MaxConns = int(conns)
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	if req.All {
		rules = slices.Clone(s.Rules)
	}
	return &Policy{Rules: rules, Deny: deny, Except: except, Packages: req.Packages, Limits: l}, nil
}

// covers reports whether one server rule allows every host and port of r.
func (s *Server) covers(r Rule) bool {
	var ports []PortRange
	for _, sr := range s.Rules {
		if (r.Host != "" && sr.coversHost(r)) || (r.Prefix.IsValid() && sr.coversPrefix(r)) {
			ports = append(ports, sr.Ports...)
		}
	}
	return len(ports) > 0 && portsWithin(r.Ports, ports)
}

// Checker returns the checker of one sandbox's policy under this
// server's extra refusals.
func (s *Server) Checker(p *Policy, r Resolver) *Checker {
	c := &Checker{Policy: p, Resolver: r}
	if s != nil {
		c.Deny, c.DenyAddrs = s.Deny, s.DenyAddrs
	}
	return c
}

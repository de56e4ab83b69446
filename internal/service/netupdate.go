package service

import (
	"fmt"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
	"github.com/vivarium-sandbox/vivarium/internal/store"
)

// networkPolicy is the sandbox's network policy now; nil: none.
func (b *Box) networkPolicy() *netpolicy.Policy {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.network
}

// UpdateNetwork replaces what an owner's running sandbox may reach, within
// the server's allowlist as at creation: allow, all, deny and except are
// granted anew (replaced, not merged: an empty request takes everything
// away). It applies to every connection the sandbox asks for once it
// returns; connections already open carry on until they end (see
// netproxy.Proxy.SetPolicy). Packages and limits are the sandbox's own
// from its creation: a request may repeat them, not change them.
//
// Only a sandbox made with a proxy (with some network access, even if
// its deny list then refused everything) can be given access later: one
// made without has no way out to open.
func (s *Service) UpdateNetwork(owner, id string, req netpolicy.Request) (Info, error) {
	b, err := s.Get(owner, id)
	if err != nil {
		return Info{}, err
	}
	// Updates of one sandbox are serialised: the policy granted last is
	// the one the proxy holds.
	b.netMu.Lock()
	defer b.netMu.Unlock()
	old := b.networkPolicy()
	var was netpolicy.Policy
	if old != nil {
		was = *old
	}
	if req.Packages && !was.Packages {
		s.auditNetwork(owner, id, "refused", "packages asked for")
		return Info{}, fmt.Errorf("%w: package installs are given when a sandbox is created, not later", netpolicy.ErrNotAllowed)
	}
	req.Packages = was.Packages
	if req.Limits != (netpolicy.Limits{}) && req.Limits != was.Limits {
		s.auditNetwork(owner, id, "refused", "other limits asked for")
		return Info{}, fmt.Errorf("%w: network limits are set when a sandbox is created, not later", netpolicy.ErrInvalid)
	}
	req.Limits = was.Limits
	if req.Empty() {
		req.Limits = netpolicy.Limits{} // nothing to bound
	}
	policy, err := s.grantNetwork(req, b.backend)
	if err != nil {
		s.auditNetwork(owner, id, "refused", err.Error())
		return Info{}, err
	}
	if b.egress == nil {
		if !policy.None() {
			s.auditNetwork(owner, id, "refused", "created without network access")
			return Info{}, fmt.Errorf("%w: this sandbox was created without network access, and has no proxy to open; "+
				"create it with network access (\"network\": {\"all\": true, \"deny\": [\"0.0.0.0/0\"]} starts with none reachable)",
				netpolicy.ErrNotAllowed)
		}
		policy = nil
	} else {
		b.egress.SetPolicy(policy)
	}
	b.mu.Lock()
	b.network = policy
	b.mu.Unlock()
	s.auditNetwork(owner, id, "changed", fmt.Sprintf("allow=%s deny=%s except=%s",
		strings.Join(policy.Allow(), " "), strings.Join(policy.Denied(), " "), strings.Join(policy.Excepted(), " ")))
	s.cfg.Logger.Info("sandbox network changed", "id", id, "owner", owner, "allow", policy.Allow(), "deny", policy.Denied())
	return b.info(), nil
}

// auditNetwork records a request to change a sandbox's network (kind
// "net_policy"): "changed" with the policy granted, or "refused" with why.
func (s *Service) auditNetwork(owner, id, status, detail string) {
	if len(detail) > maxPolicyDetail {
		detail = detail[:maxPolicyDetail] + "..."
	}
	s.cfg.Audit(store.Record{Kind: "net_policy", KeyID: owner, SandboxID: id, Status: status, Detail: detail})
}

// maxPolicyDetail bounds an audit record's account of a policy.
const maxPolicyDetail = 4096

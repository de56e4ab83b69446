package netpolicy

import "errors"

var (
	// ErrInvalid: a rule, a request or a host name is malformed. The
	// text says which part and what is accepted.
	ErrInvalid = errors.New("invalid network policy")
	// ErrNotAllowed: a sandbox asked for more than the server allows.
	ErrNotAllowed = errors.New("network access not allowed")
	// ErrRefused: a connection was refused by the policy; see Refusal.
	ErrRefused = errors.New("connection refused by the network policy")
)

// Refusal is a refused connection. Reason is written for the person
// whose code tried to connect: it names the host and the rule at play,
// and is safe to show inside the sandbox.
type Refusal struct {
	Reason string
}

func (r *Refusal) Error() string { return r.Reason }

// Unwrap makes errors.Is(err, ErrRefused) hold.
func (r *Refusal) Unwrap() error { return ErrRefused }

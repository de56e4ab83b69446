package store

import (
	"context"
	"sync"
	"time"
)

// Keyring answers "whose key is this?" for every request without a
// database query each time: lookups are cached for TTL, so a revoked key
// stops working within TTL.
type Keyring struct {
	st  *Store
	ttl time.Duration

	mu      sync.Mutex
	byToken map[string]cached // by token hash
	byID    map[string]Key
	states  map[string]state // by key id
}

// state is a key's revocation, as last read.
type state struct {
	revoked, closeSandboxes bool
	expires                 time.Time
}

type cached struct {
	key     Key
	ok      bool
	expires time.Time
}

// NewKeyring caches st's keys for ttl.
func NewKeyring(st *Store, ttl time.Duration) *Keyring {
	return &Keyring{st: st, ttl: ttl, byToken: map[string]cached{}, byID: map[string]Key{}, states: map[string]state{}}
}

// Owner returns the id of the key a token belongs to.
func (k *Keyring) Owner(token string) (string, error) {
	h := hashToken(token)
	now := time.Now()
	k.mu.Lock()
	c, hit := k.byToken[h]
	k.mu.Unlock()
	if !hit || now.After(c.expires) {
		key, err := k.st.Lookup(context.Background(), token)
		switch {
		case err == nil:
			c = cached{key: key, ok: true}
		case err == ErrInvalidKey:
			c = cached{}
		default:
			return "", err
		}
		c.expires = now.Add(k.ttl)
		k.mu.Lock()
		if len(k.byToken) > 100_000 {
			// Bounded: random tokens must not grow the cache forever.
			clear(k.byToken)
		}
		k.byToken[h] = c
		if c.ok {
			k.byID[c.key.ID] = c.key
		}
		k.mu.Unlock()
	}
	if !c.ok {
		return "", ErrInvalidKey
	}
	return c.key.ID, nil
}

// Revoked reports whether the key id is revoked (or is no key, or cannot
// be read now), and whether its sandboxes are to be closed with it: what
// the service asks at every use of a token derived from the key. Answers
// are cached for TTL, as Owner's are; a failed read is not.
func (k *Keyring) Revoked(id string) (revoked, closeSandboxes bool) {
	now := time.Now()
	k.mu.Lock()
	st, hit := k.states[id]
	k.mu.Unlock()
	if hit && now.Before(st.expires) {
		return st.revoked, st.closeSandboxes
	}
	revoked, closeSandboxes, err := k.st.KeyState(context.Background(), id)
	if err != nil {
		return true, false // refused while unknown; never closed for it
	}
	k.mu.Lock()
	if len(k.states) > 100_000 {
		clear(k.states)
	}
	k.states[id] = state{revoked: revoked, closeSandboxes: closeSandboxes, expires: now.Add(k.ttl)}
	k.mu.Unlock()
	return revoked, closeSandboxes
}

// Revoke revokes the key id (its holder asks, through the API), with its
// sandboxes or not; this server stops taking it at once.
func (k *Keyring) Revoke(id string, closeSandboxes bool) error {
	if _, err := k.st.RevokeKey(context.Background(), id, closeSandboxes); err != nil {
		return err
	}
	k.mu.Lock()
	clear(k.byToken)
	delete(k.states, id)
	k.mu.Unlock()
	return nil
}

// Quota returns a key's own quotas (zero: the server's defaults).
func (k *Keyring) Quota(id string) (maxSandboxes, maxExecutions int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := k.byID[id]
	return key.MaxSandboxes, key.MaxExecutions
}

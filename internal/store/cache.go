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
}

type cached struct {
	key     Key
	ok      bool
	expires time.Time
}

// NewKeyring caches st's keys for ttl.
func NewKeyring(st *Store, ttl time.Duration) *Keyring {
	return &Keyring{st: st, ttl: ttl, byToken: map[string]cached{}, byID: map[string]Key{}}
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

// Quota returns a key's own quotas (zero: the server's defaults).
func (k *Keyring) Quota(id string) (maxSandboxes, maxExecutions int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key := k.byID[id]
	return key.MaxSandboxes, key.MaxExecutions
}

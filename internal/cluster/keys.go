package cluster

// The cluster's API keys: one Secret per key in the namespace, read by
// every node through a watch, so that a key made or revoked anywhere holds
// on every node within a moment, and a key's sandbox quota is counted over
// the nodes (each node's Lease says how many sandboxes each key has
// there). A Secret holds the key's hash only (sha256 of the token, as a
// server's own database does), its name and quotas.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

const (
	labelKind = "vivarium.dev/kind"
	kindKey   = "api-key"

	// Data of a key's Secret.
	dataHash          = "hash"
	dataName          = "name"
	dataMaxSandboxes  = "max-sandboxes"
	dataMaxExecutions = "max-executions"
	// dataRevoked marks a key revoked with its sandboxes: its Secret is
	// kept, so that every node sees that and closes them. A key revoked
	// alone has its Secret deleted.
	dataRevoked = "revoked"

	// TokenPrefix starts a key's token, as a server's own keys
	// (store.TokenPrefix: E2B's SDKs check it).
	TokenPrefix = "e2b_"

	annoKeys    = "vivarium.dev/keys"    // a node's sandboxes per key, JSON
	annoRunning = "vivarium.dev/running" // its executions running per key, JSON
)

// ErrInvalidKey: no live key of the cluster has this token.
var ErrInvalidKey = errors.New("invalid API key")

// Key is one of the cluster's keys.
type Key struct {
	ID                          string
	Name                        string
	MaxSandboxes, MaxExecutions int
	CreatedAt                   time.Time
	// Revoked: revoked with its sandboxes, its Secret kept marked.
	Revoked bool `json:",omitempty"`
}

func keySecretName(id string) string { return "vivarium-" + strings.ReplaceAll(id, "_", "-") }

func hashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// CreateKey makes a key of the cluster and returns its token, shown once.
func (c *Client) CreateKey(ctx context.Context, name string, maxSandboxes, maxExecutions int) (string, Key, error) {
	if name == "" || len(name) > 200 {
		return "", Key{}, errors.New("a key needs a name of 1 to 200 characters")
	}
	if maxSandboxes < 0 || maxExecutions < 0 {
		return "", Key{}, errors.New("quotas cannot be negative")
	}
	secret, id := make([]byte, 20), make([]byte, 6)
	rand.Read(secret)
	rand.Read(id)
	token := TokenPrefix + hex.EncodeToString(secret)
	k := Key{ID: "key_" + hex.EncodeToString(id), Name: name, MaxSandboxes: maxSandboxes, MaxExecutions: maxExecutions}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: keySecretName(k.ID), Namespace: c.cfg.Namespace,
			Labels: map[string]string{labelName: appName, labelKind: kindKey}},
		Type: corev1.SecretTypeOpaque,
		StringData: map[string]string{dataHash: hashToken(token), dataName: name,
			dataMaxSandboxes: strconv.Itoa(maxSandboxes), dataMaxExecutions: strconv.Itoa(maxExecutions)},
	}
	if err := c.core.Post().Namespace(c.cfg.Namespace).Resource("secrets").Body(s).Do(ctx).Error(); err != nil {
		return "", Key{}, fmt.Errorf("cluster: the key's Secret: %w", err)
	}
	return token, k, nil
}

// RevokeKey revokes a key: every node refuses it, and every token made
// from it, once its watch has seen that. Alone, its Secret is deleted;
// with closeSandboxes it is kept, marked revoked, and every node closes
// the key's sandboxes (revoking it alone later deletes it).
func (c *Client) RevokeKey(ctx context.Context, id string, closeSandboxes bool) error {
	req := c.core.Delete().Namespace(c.cfg.Namespace).Resource("secrets").Name(keySecretName(id))
	if closeSandboxes {
		patch := []byte(`{"stringData":{"` + dataRevoked + `":"close-sandboxes"}}`)
		req = c.core.Patch(types.MergePatchType).Namespace(c.cfg.Namespace).Resource("secrets").Name(keySecretName(id)).Body(patch)
	}
	return req.Do(ctx).Error()
}

// Keys is the cluster's keys as a node sees them (httpapi.Authenticator
// and the service's Quota).
type Keys struct {
	idx cache.Indexer
	ns  string
}

// WatchKeys watches the keys' Secrets until ctx ends; it returns once
// they are listed.
func (c *Client) WatchKeys(ctx context.Context) (*Keys, error) {
	idx, err := c.watch(ctx, c.core, "secrets", labels.Set{labelName: appName, labelKind: kindKey}, &corev1.Secret{},
		cache.Indexers{dataHash: func(obj any) ([]string, error) {
			s, ok := obj.(*corev1.Secret)
			if !ok {
				return nil, nil
			}
			return []string{string(s.Data[dataHash])}, nil
		}}, "the keys' Secrets")
	if err != nil {
		return nil, err
	}
	return &Keys{idx: idx, ns: c.cfg.Namespace}, nil
}

func keyOf(s *corev1.Secret) Key {
	k := Key{ID: strings.Replace(strings.TrimPrefix(s.Name, "vivarium-"), "-", "_", 1), Name: string(s.Data[dataName]),
		CreatedAt: s.CreationTimestamp.Time, Revoked: len(s.Data[dataRevoked]) > 0}
	k.MaxSandboxes, _ = strconv.Atoi(string(s.Data[dataMaxSandboxes]))
	k.MaxExecutions, _ = strconv.Atoi(string(s.Data[dataMaxExecutions]))
	return k
}

// Owner returns the id of the key a token belongs to.
func (k *Keys) Owner(token string) (string, error) {
	if !strings.HasPrefix(token, TokenPrefix) || len(token) > 200 {
		return "", ErrInvalidKey
	}
	want := hashToken(token)
	objs, err := k.idx.ByIndex(dataHash, want)
	if err != nil {
		return "", err
	}
	for _, o := range objs {
		s := o.(*corev1.Secret)
		if subtle.ConstantTimeCompare(s.Data[dataHash], []byte(want)) == 1 && len(s.Data[dataRevoked]) == 0 {
			return keyOf(s).ID, nil
		}
	}
	return "", ErrInvalidKey
}

// Revoked reports whether the key id is revoked (its Secret gone or
// marked), and whether with its sandboxes (marked).
func (k *Keys) Revoked(id string) (revoked, closeSandboxes bool) {
	s, ok := byName[*corev1.Secret](k.idx, k.ns, keySecretName(id))
	if !ok {
		return true, false
	}
	marked := len(s.Data[dataRevoked]) > 0
	return marked, marked
}

// Quota returns a key's own quotas (zero: the server's defaults).
func (k *Keys) Quota(id string) (maxSandboxes, maxExecutions int) {
	s, ok := byName[*corev1.Secret](k.idx, k.ns, keySecretName(id))
	if !ok {
		return 0, 0
	}
	key := keyOf(s)
	return key.MaxSandboxes, key.MaxExecutions
}

// List returns the keys, as the watch last saw them.
func (k *Keys) List() []Key {
	var out []Key
	for _, o := range k.idx.List() {
		out = append(out, keyOf(o.(*corev1.Secret)))
	}
	return out
}

// encodeOwners writes a node's sandboxes per key for its Lease.
func encodeOwners(m map[string]int) string {
	if len(m) == 0 {
		return ""
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// Elsewhere counts owner's sandboxes on the nodes other than self whose
// Lease holds: what a node adds to its own count against the key's quota.
func (v *View) Elsewhere(self, owner string) int {
	return v.elsewhere(self, func(n Node) int { return n.Owners[owner] })
}

// RunningElsewhere counts owner's executions running on the nodes other
// than self, as their Leases last said (renewed three times per lease
// duration: an execution shorter than that may go unseen): what a node
// adds to its own against the key's execution quota.
func (v *View) RunningElsewhere(self, owner string) int {
	return v.elsewhere(self, func(n Node) int { return n.Running[owner] })
}

// elsewhere sums count over the live nodes other than self.
func (v *View) elsewhere(self string, count func(Node) int) int {
	sum := 0
	for _, n := range v.Nodes() {
		if n.Name != self {
			sum += count(n)
		}
	}
	return sum
}

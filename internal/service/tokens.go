package service

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

// Tokens are what the server hands an owner so that a holder reaches one
// of its objects without the owner's key: a sandbox's access token (E2B's
// envd and traffic access tokens, and the signed file URLs made with it),
// a port token (one port of one sandbox), a volume token (one volume's
// files). Each is an HMAC, keyed by a secret of this process, of its
// kind, its object, the object's owner and, where it can be rotated, the
// object's token generation. It names neither the owner nor its key. A
// token opens its object only while
//
//   - the object lives, on this server (a restart draws a new secret);
//   - its owner's key is live (Config.KeyRevoked), asked at every use;
//   - it has not been rotated (RotateAccessToken, RotatePortToken).
//
// Tokens are handed to the object's owner only.

// Prefixes of the tokens, which no key has.
const (
	accessTokenPrefix = "va1."
	portTokenPrefix   = "vp1."
	volumeTokenPrefix = "vv1."
)

// maxToken bounds what is hashed to check a token.
const maxToken = 128

// maxRotatedPorts bounds the ports of one sandbox whose token has been
// rotated (each is remembered while the sandbox lives).
const maxRotatedPorts = 1024

// mac is the HMAC of parts under the process's token secret.
func (s *Service) mac(parts ...string) string {
	m := hmac.New(sha256.New, s.tokenKey)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// keyLive reports whether owner's key may still be used: a revoked key's
// tokens open nothing.
func (s *Service) keyLive(owner string) bool {
	revoked, _ := s.cfg.KeyRevoked(owner)
	return !revoked
}

// tokenBox is the live sandbox id if token, of prefix, may be one of its
// tokens: it is the caller's to check which.
func (s *Service) tokenBox(token, prefix, id string) (*Box, bool) {
	if !strings.HasPrefix(token, prefix) || len(token) > maxToken || id == "" {
		return nil, false
	}
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	return b, b != nil
}

func (s *Service) accessToken(b *Box) string {
	b.mu.Lock()
	gen := b.accessGen
	b.mu.Unlock()
	return accessTokenPrefix + s.mac("access", b.owner, b.id, strconv.FormatUint(gen, 10))
}

// AccessToken returns the token that opens an owner's sandbox without
// the key: E2B's envd and traffic access tokens.
func (s *Service) AccessToken(owner, id string) (string, error) {
	b, err := s.lookup(owner, id)
	if err != nil {
		return "", err
	}
	return s.accessToken(b), nil
}

// AccessTokenOwner returns the owner of sandbox id, a live sandbox
// (running or paused: it is not resumed), if token is its access token
// and the owner's key is live. gone says that there is no such sandbox,
// whatever the token (sandboxes' ids are not secrets).
func (s *Service) AccessTokenOwner(token, id string) (owner string, ok, gone bool) {
	if id == "" {
		return "", false, false
	}
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	if b == nil {
		return "", false, true
	}
	if !strings.HasPrefix(token, accessTokenPrefix) || len(token) > maxToken ||
		!hmac.Equal([]byte(token), []byte(s.accessToken(b))) || !s.keyLive(b.owner) {
		return "", false, false
	}
	return b.owner, true, false
}

// AccessTokens lists every live sandbox whose owner's key is live, with
// its access token, for what finds a sandbox by a credential made with
// its token (a signed file URL that names no sandbox). It tells callers
// nothing about other owners' sandboxes: they only check a credential
// against each.
func (s *Service) AccessTokens() []OwnedToken {
	boxes := s.boxesOf("")
	out := make([]OwnedToken, 0, len(boxes))
	live := map[string]bool{}
	for _, b := range boxes {
		ok, seen := live[b.owner]
		if !seen {
			ok = s.keyLive(b.owner)
			live[b.owner] = ok
		}
		if ok {
			out = append(out, OwnedToken{Owned: Owned{Owner: b.owner, ID: b.id}, Token: s.accessToken(b)})
		}
	}
	return out
}

// AccessTokenOf returns the live sandbox id with its owner and access
// token, if the owner's key is live, for what checks a credential made
// with that one sandbox's token (a signed file URL sent to its own host).
func (s *Service) AccessTokenOf(id string) (OwnedToken, bool) {
	s.mu.Lock()
	b := s.boxes[id]
	s.mu.Unlock()
	if b == nil || !s.keyLive(b.owner) {
		return OwnedToken{}, false
	}
	return OwnedToken{Owned: Owned{Owner: b.owner, ID: b.id}, Token: s.accessToken(b)}, true
}

// OwnedToken is a live sandbox and its access token.
type OwnedToken struct {
	Owned
	Token string
}

// RotateAccessToken gives an owner's sandbox a new access token and
// returns it: the old one, and every signed file URL made with it, open
// nothing from now on.
func (s *Service) RotateAccessToken(owner, id string) (string, error) {
	b, err := s.lookup(owner, id)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	b.accessGen++
	b.mu.Unlock()
	s.cfg.Logger.Info("access token rotated", "id", id)
	return s.accessToken(b), nil
}

func (s *Service) portToken(b *Box, port int) string {
	b.mu.Lock()
	gen := b.portGens[port]
	b.mu.Unlock()
	return portTokenPrefix + s.mac("port", b.owner, b.id, strconv.Itoa(port), strconv.FormatUint(gen, 10))
}

// PortToken returns the token that opens port of an owner's sandbox.
func (s *Service) PortToken(owner, id string, port int) (string, error) {
	b, _, err := s.portDialer(owner, id, port)
	if err != nil {
		return "", err
	}
	return s.portToken(b, port), nil
}

// RotatePortToken gives port of an owner's sandbox a new token and
// returns it: the old one (links and cookies made with it) opens nothing
// from now on. The sandbox's other ports keep theirs.
func (s *Service) RotatePortToken(owner, id string, port int) (string, error) {
	b, _, err := s.portDialer(owner, id, port)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	if b.portGens == nil {
		b.portGens = map[int]uint64{}
	}
	_, seen := b.portGens[port]
	if !seen && len(b.portGens) >= maxRotatedPorts {
		b.mu.Unlock()
		return "", fmt.Errorf("%w: the tokens of %d ports of this sandbox have been rotated, the most it keeps", ErrQuota, maxRotatedPorts)
	}
	b.portGens[port]++
	b.mu.Unlock()
	s.cfg.Logger.Info("port token rotated", "id", id, "port", port)
	return s.portToken(b, port), nil
}

// PortTokenOwner returns the owner of sandbox id, a live sandbox, if
// token opens its port and the owner's key is live.
func (s *Service) PortTokenOwner(token, id string, port int) (string, bool) {
	b, ok := s.tokenBox(token, portTokenPrefix, id)
	if !ok || checkPort(port) != nil || !hmac.Equal([]byte(token), []byte(s.portToken(b, port))) || !s.keyLive(b.owner) {
		return "", false
	}
	return b.owner, true
}

// VolumeToken returns the token that opens an owner's volume (its id)
// on the volumes' content API.
func (s *Service) VolumeToken(owner, id string) string {
	return volumeTokenPrefix + s.mac("volume", owner, id)
}

// VolumeTokenOwner returns the owner of volume id if token opens it and
// the owner's key is live.
func (s *Service) VolumeTokenOwner(token, id string) (string, bool) {
	if s.cfg.Volumes == nil || !strings.HasPrefix(token, volumeTokenPrefix) || len(token) > maxToken {
		return "", false
	}
	owner, ok := s.cfg.Volumes.OwnerOf(id)
	if !ok || !hmac.Equal([]byte(token), []byte(s.VolumeToken(owner, id))) || !s.keyLive(owner) {
		return "", false
	}
	return owner, true
}

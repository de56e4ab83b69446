package e2b

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"hash"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/fairgate"
)

// Signed file URLs (Sandbox.uploadUrl and downloadUrl in E2B's SDKs): a
// URL anyone may use, without a header, to read or write one file of one
// sandbox, until it expires if it says so. The SDK builds it from the
// sandbox URL, with no sandbox ID in it:
//
//	/files?path=P&username=U&signature=v1_S&signature_expiration=T
//
// where S is the unpadded standard base64 of
// SHA-256("P:OP:U:TOKEN[:T]"), OP is read (GET) or write (POST), U is
// empty when the SDK sent no user, and TOKEN is the sandbox's access
// token. The token is secret and names one sandbox of one owner: the URL
// opens the sandbox whose token its signature was made with, for that
// path and operation only.
//
// Where it arrives decides what is checked:
//
//   - at the sandbox's own host (49983-<id>.DOMAIN/files, where the SDKs
//     send it when E2B_DOMAIN is set): against that sandbox's token alone;
//   - at /files of the server's root (E2B_SANDBOX_URL): the URL names no
//     sandbox, so it is checked against each live sandbox's token, a scan
//     anyone may ask for without a key. Scans are shared out (signGate):
//     a few at once server-wide, one at a time per client address, and a
//     request that cannot have one within signScanWait is answered 429. A
//     flood of forged URLs from one address thus holds one scan, and
//     other clients' URLs are checked beside it.
const signatureVersion = "v1_"

// maxSignature bounds what is hashed for a signature check.
const maxSignature = 4096

// signatureLen is the length of a signature's base64 (SHA-256, unpadded).
var signatureLen = base64.RawStdEncoding.EncodedLen(sha256.Size)

// SignedProbeHeader asks, of a signed file URL, only whether this server
// holds its sandbox (204), doing nothing else: a cluster's gateway sends
// it to every node to find the one. It tells no one more than using the
// URL would.
const SignedProbeHeader = "Vivarium-Signed-Probe"

// SignedFiles serves signed file URLs: mount it at /files of the
// server's root.
func (s *Server) SignedFiles() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveSigned(w, r, "") })
}

// fileSignature is the signature of a URL as the SDKs make it.
func fileSignature(path, op, user, token, expiration string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return signatureVersion + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedRequest is a signed file URL's parts (parseSigned).
type signedRequest struct {
	path, op, user, exp string
	expires             int64 // exp's, when not ""
	sum                 []byte
	// head is SHA-256's state once "P:OP:U:" is hashed, the part of the
	// signed text that no token changes: a scan hashes it once, not once
	// for each sandbox.
	head hash.Hash
}

// parseSigned reads a signed file URL's method and query. What it
// refuses comes with the status and message to answer; a signature that
// is not one SHA-256 in base64 is invalid at once, as a forged one.
func parseSigned(method, rawQuery string) (*signedRequest, *apiError) {
	bad := func(code int, msg string) (*signedRequest, *apiError) {
		return nil, &apiError{Code: code, Message: msg}
	}
	p := &signedRequest{}
	switch method {
	case http.MethodGet:
		p.op = "read"
	case http.MethodPost:
		p.op = "write"
	default:
		return bad(http.StatusMethodNotAllowed, "a signed file URL is read with GET and written with POST")
	}
	q, _ := url.ParseQuery(rawQuery) // as Request.URL.Query: malformed pairs are left out
	sig := q.Get("signature")
	if !strings.HasPrefix(sig, signatureVersion) || len(rawQuery) > maxSignature {
		return bad(http.StatusUnauthorized, "a signature is required: make the URL with uploadUrl or downloadUrl")
	}
	p.path, p.user, p.exp = q.Get("path"), q.Get("username"), q.Get("signature_expiration")
	if p.exp != "" {
		var err error
		if p.expires, err = strconv.ParseInt(p.exp, 10, 64); err != nil {
			return bad(http.StatusUnauthorized, "invalid signature_expiration")
		}
	}
	if p.path == "" {
		// Unsigned, the parts' names would choose the files.
		return bad(http.StatusBadRequest, "a signed file URL names its file: make it with a path")
	}
	// Strict, and of the one length: the decoder skips line breaks and,
	// unstrict, ignores the last character's spare bits, so that other
	// strings than the SDK's would decode to the same sum.
	enc := sig[len(signatureVersion):]
	sum, err := base64.RawStdEncoding.Strict().DecodeString(enc)
	if len(enc) != signatureLen || err != nil || len(sum) != sha256.Size {
		return bad(http.StatusUnauthorized, "invalid signature")
	}
	p.sum = sum
	p.head = sha256.New()
	p.head.Write([]byte(p.path + ":" + p.op + ":" + p.user + ":"))
	return p, nil
}

// madeWith reports whether token made the URL's signature.
func (p *signedRequest) madeWith(token string) bool {
	var h hash.Hash
	if c, err := p.head.(hash.Cloner).Clone(); err == nil {
		h = c
	} else { // a hash that cannot be cloned: the whole text again
		h = sha256.New()
		h.Write([]byte(p.path + ":" + p.op + ":" + p.user + ":"))
	}
	h.Write([]byte(token))
	if p.exp != "" {
		h.Write([]byte(":" + p.exp))
	}
	var sum [sha256.Size]byte
	return subtle.ConstantTimeCompare(h.Sum(sum[:0]), p.sum) == 1
}

// serveSigned serves a signed file URL; id is the sandbox the request's
// host names ("": none, the server's root).
func (s *Server) serveSigned(w http.ResponseWriter, r *http.Request, id string) {
	p, bad := parseSigned(r.Method, r.URL.RawQuery)
	if bad != nil {
		writeEnvdError(w, bad.Code, bad.Message)
		return
	}
	var t target
	var ok bool
	if id != "" {
		t, ok = s.signedBy(p, id)
	} else {
		addr := s.clientAddr(r)
		leave, got := s.signGate.Enter(r.Context(), addr)
		if !got {
			w.Header().Set("Retry-After", "1")
			writeEnvdError(w, http.StatusTooManyRequests, "too many signed file URLs are being checked at once (from this "+
				"address, or on this server): retry in a moment, one at a time; a URL sent to its sandbox's own host "+
				"(with E2B_DOMAIN set) is checked at once")
			return
		}
		t, ok = s.signedTarget(r.Context(), p, addr)
		leave()
	}
	if !ok {
		writeEnvdError(w, http.StatusUnauthorized, "invalid signature")
		return
	}
	// Checked once the signature is known good, as envd does: what
	// expired says so.
	if p.exp != "" && time.Now().Unix() > p.expires {
		writeEnvdError(w, http.StatusUnauthorized, "signature is already expired")
		return
	}
	if r.Header.Get(SignedProbeHeader) != "" {
		// A cluster's gateway asks which node holds the sandbox: this
		// one, and nothing is read or written.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	r = r.WithContext(withTarget(r.Context(), t))
	if p.op == "read" {
		s.readFile(w, r)
	} else {
		s.writeFiles(w, r)
	}
}

// signedBy checks a URL against the one sandbox id.
func (s *Server) signedBy(p *signedRequest, id string) (target, bool) {
	sb, ok := s.svc.AccessTokenOf(id)
	if !ok || !p.madeWith(sb.Token) {
		return target{}, false
	}
	return target{owner: sb.Owner, id: id}, true
}

// signedTarget finds the live sandbox whose access token made the URL's
// signature, while the request lasts. It runs holding one of signGate's
// slots.
func (s *Server) signedTarget(ctx context.Context, p *signedRequest, addr string) (target, bool) {
	if s.signScanning != nil {
		s.signScanning(addr)
	}
	for i, sb := range s.svc.AccessTokens() {
		if i%256 == 255 && ctx.Err() != nil {
			return target{}, false // its client is gone
		}
		if p.madeWith(sb.Token) {
			return target{owner: sb.Owner, id: sb.ID}, true
		}
	}
	return target{}, false
}

// Bounds on scans of signed URLs that name no sandbox.
const (
	// signScanWait is the longest a request waits for its address's
	// turn and a slot; then it is answered 429.
	signScanWait = time.Second
	// maxSignQueued is the most requests of one address that scan or
	// wait at once; more are answered 429 at once.
	maxSignQueued = 4
)

// clientAddr is the address a request's scans are counted by
// (fairgate.ClientAddr): behind a cluster's gateway, the client it names.
func (s *Server) clientAddr(r *http.Request) string {
	return fairgate.ClientAddr(r, s.cfg.ForwardedFor)
}

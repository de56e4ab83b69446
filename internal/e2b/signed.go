package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Signed file URLs (Sandbox.uploadUrl and downloadUrl in E2B's SDKs): a
// URL anyone may use, without a header, to read or write one file of one
// sandbox, until it expires if it says so. The SDK builds it from the
// sandbox URL, so it arrives at /files of this server's root (or of a
// sandbox's own host) with no sandbox ID:
//
//	/files?path=P&username=U&signature=v1_S&signature_expiration=T
//
// where S is the unpadded standard base64 of
// SHA-256("P:OP:U:TOKEN[:T]"), OP is read (GET) or write (POST), U is
// empty when the SDK sent no user, and TOKEN is the sandbox's access
// token. The token is secret and names one sandbox of one owner: the URL
// opens the sandbox whose token its signature was made with, for that
// path and operation only, and is checked against each live sandbox's.
const signatureVersion = "v1_"

// maxSignature bounds what is hashed for a signature check.
const maxSignature = 4096

// SignedProbeHeader asks, of a signed file URL, only whether this server
// holds its sandbox (204), doing nothing else: a cluster's gateway sends
// it to every node to find the one. It tells no one more than using the
// URL would.
const SignedProbeHeader = "Vivarium-Signed-Probe"

// SignedFiles serves signed file URLs: mount it at /files of the
// server's root.
func (s *Server) SignedFiles() http.Handler {
	return http.HandlerFunc(s.serveSigned)
}

func fileSignature(path, op, user, token, expiration string) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return signatureVersion + base64.RawStdEncoding.EncodeToString(sum[:])
}

func (s *Server) serveSigned(w http.ResponseWriter, r *http.Request) {
	var op string
	switch r.Method {
	case http.MethodGet:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		writeEnvdError(w, http.StatusMethodNotAllowed, "a signed file URL is read with GET and written with POST")
		return
	}
	q := r.URL.Query()
	sig, exp := q.Get("signature"), q.Get("signature_expiration")
	if !strings.HasPrefix(sig, signatureVersion) || len(r.URL.RawQuery) > maxSignature {
		writeEnvdError(w, http.StatusUnauthorized, "a signature is required: make the URL with uploadUrl or downloadUrl")
		return
	}
	var expires int64
	if exp != "" {
		var err error
		if expires, err = strconv.ParseInt(exp, 10, 64); err != nil {
			writeEnvdError(w, http.StatusUnauthorized, "invalid signature_expiration")
			return
		}
	}
	if q.Get("path") == "" {
		// Unsigned, the parts' names would choose the files.
		writeEnvdError(w, http.StatusBadRequest, "a signed file URL names its file: make it with a path")
		return
	}
	t, ok := s.signedTarget(q.Get("path"), op, q.Get("username"), exp, sig)
	if !ok {
		writeEnvdError(w, http.StatusUnauthorized, "invalid signature")
		return
	}
	// Checked once the signature is known good, as envd does: what
	// expired says so.
	if exp != "" && time.Now().Unix() > expires {
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
	if op == "read" {
		s.readFile(w, r)
	} else {
		s.writeFiles(w, r)
	}
}

// signedTarget finds the live sandbox whose access token made sig. One
// check runs at a time: a check hashes once per live sandbox, and anyone
// may ask for one without a key, so a flood of forged URLs must not take
// more than a core.
func (s *Server) signedTarget(path, op, user, exp, sig string) (target, bool) {
	s.signScans <- struct{}{}
	defer func() { <-s.signScans }()
	for _, sb := range s.svc.All() {
		want := fileSignature(path, op, user, s.accessToken(sb.Owner, sb.ID), exp)
		if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) == 1 {
			return target{owner: sb.Owner, id: sb.ID}, true
		}
	}
	return target{}, false
}

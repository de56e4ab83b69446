package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/jsonerr"
)

// The Connect protocol (connectrpc.com/docs/protocol), as E2B's SDKs speak
// it to envd: POST /package.Service/Method, messages in protobuf's JSON
// mapping. A unary call is a JSON body both ways (application/json); a
// server-streaming call sends one enveloped message and receives
// enveloped messages (application/connect+json), each a flags byte and a
// 4-byte big-endian length before the JSON, the last one flagged
// end-of-stream and carrying the error, if any. Only JSON is spoken: the
// SDKs (JS and Python alike) use it; a binary (proto) request is refused
// with a message saying so.

// maxRPCMessage bounds a request message: paths, a command, a chunk of
// stdin.
const maxRPCMessage = 4 << 20

const (
	flagCompressed = 0b01
	flagEndStream  = 0b10
)

type unaryMethod func(r *http.Request, t target, msg []byte) (any, error)

type streamMethod func(r *http.Request, t target, msg []byte, st *rpcStream) error

// rpcError is Connect's JSON error.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

func (s *Server) writeRPCError(w http.ResponseWriter, err error) {
	code, msg := connectCode(s.log, err)
	writeJSON(w, apierr.ConnectStatus(code), rpcError{Code: code, Message: msg})
}

// contentType checks a Connect request's codec: JSON, unary or streaming.
func contentType(r *http.Request, stream bool) error {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	want := "application/json"
	if stream {
		want = "application/connect+json"
	}
	switch {
	case err == nil && mt == want:
		return nil
	case strings.HasSuffix(mt, "proto"):
		return newConnectError(codeUnimplemented,
			"vivarium speaks Connect with JSON messages only; binary protobuf is not supported (use the JSON codec)")
	}
	return newConnectError(codeInvalidArgument, fmt.Sprintf("content type %q: want %s", r.Header.Get("Content-Type"), want))
}

// timeoutOf reads Connect-Timeout-Ms; zero means none.
func timeoutOf(r *http.Request) (time.Duration, error) {
	v := r.Header.Get("Connect-Timeout-Ms")
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || len(v) > 10 {
		return 0, newConnectError(codeInvalidArgument, "invalid Connect-Timeout-Ms "+strconv.Quote(v))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// readMessage reads at most maxRPCMessage bytes, decompressing gzip.
func readMessage(r io.Reader, encoding string) ([]byte, error) {
	switch encoding {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, newConnectError(codeInvalidArgument, "invalid gzip message")
		}
		defer zr.Close()
		r = zr
	default:
		return nil, newConnectError(codeUnimplemented, "unsupported compression "+strconv.Quote(encoding))
	}
	b, err := io.ReadAll(io.LimitReader(r, maxRPCMessage+1))
	if err != nil {
		return nil, newConnectError(codeInvalidArgument, "reading the request: "+err.Error())
	}
	if len(b) > maxRPCMessage {
		return nil, newConnectError(codeResourceExhausted, fmt.Sprintf("request message over %d bytes", maxRPCMessage))
	}
	return b, nil
}

// serveUnary runs a unary method.
func (s *Server) serveUnary(w http.ResponseWriter, r *http.Request, h unaryMethod) {
	if err := contentType(r, false); err != nil {
		s.writeRPCError(w, err)
		return
	}
	timeout, err := timeoutOf(r)
	if err != nil {
		s.writeRPCError(w, err)
		return
	}
	if timeout > 0 {
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		r = r.WithContext(ctx)
	}
	msg, err := readMessage(r.Body, r.Header.Get("Content-Encoding"))
	if err != nil {
		s.writeRPCError(w, err)
		return
	}
	out, err := h(r, targetOf(r), msg)
	if err != nil {
		s.writeRPCError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// rpcStream writes a server stream's messages.
type rpcStream struct {
	mu       sync.Mutex
	w        http.ResponseWriter
	rc       *http.ResponseController
	lastSent time.Time
	dropped  bool // Drop was called: nothing more is written
	// Timeout is the call's Connect-Timeout-Ms (zero: none).
	Timeout time.Duration
	// keepalive is the interval the client asked for (zero: none).
	keepalive time.Duration
}

// Send writes one message.
func (st *rpcStream) Send(v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return st.write(0, body)
}

func (st *rpcStream) write(flags byte, body []byte) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.dropped {
		return http.ErrAbortHandler
	}
	var head [5]byte
	head[0] = flags
	binary.BigEndian.PutUint32(head[1:], uint32(len(body)))
	if _, err := st.w.Write(append(head[:], body...)); err != nil {
		return err
	}
	st.lastSent = time.Now()
	return st.rc.Flush()
}

// Drop drops the connection, as envd's does when its sandbox dies: the
// SDKs then ask whether the sandbox still runs and report it killed. It
// waits for a write in progress (a keepalive's), and does not return.
func (st *rpcStream) Drop() {
	st.mu.Lock()
	st.dropped = true
	st.mu.Unlock()
	panic(http.ErrAbortHandler)
}

// KeepAlive sends msg whenever the stream has been quiet for the interval
// the client asked for (Keepalive-Ping-Interval, seconds), so that proxies
// and clients do not take a quiet command for a dead connection. It stops
// when ctx is done.
func (st *rpcStream) KeepAlive(ctx context.Context, msg any) {
	if st.keepalive <= 0 {
		return
	}
	go func() {
		t := time.NewTicker(st.keepalive / 2)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				st.mu.Lock()
				quiet := time.Since(st.lastSent) >= st.keepalive
				st.mu.Unlock()
				if quiet && st.Send(msg) != nil {
					return
				}
			}
		}
	}()
}

// serveStream runs a server-streaming method. Errors are always reported
// in the end-of-stream message, with status 200: a Connect client takes a
// non-200 streaming response for a transport failure and drops the
// message.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request, h streamMethod) {
	if err := contentType(r, true); err != nil {
		w.Header().Set("Content-Type", "application/connect+json")
		s.writeRPCError(w, err)
		return
	}
	st := &rpcStream{w: w, rc: http.NewResponseController(w)}
	if v := r.Header.Get("Keepalive-Ping-Interval"); v != "" {
		if sec, err := strconv.Atoi(v); err == nil && sec > 0 {
			st.keepalive = time.Duration(min(max(sec, 5), 300)) * time.Second
		}
	}
	msg, err := s.readEnvelope(r)
	if err == nil {
		st.Timeout, err = timeoutOf(r)
	}
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(http.StatusOK)
	st.rc.Flush()
	if err == nil {
		ctx, cancel := context.WithCancel(r.Context())
		if st.Timeout > 0 {
			ctx, cancel = context.WithTimeout(r.Context(), st.Timeout)
		}
		err = h(r.WithContext(ctx), targetOf(r), msg, st)
		if err == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && r.Context().Err() == nil {
			err = newConnectError(codeDeadlineExceeded, fmt.Sprintf("the call exceeded its %v timeout", st.Timeout))
		}
		cancel()
	}
	end := map[string]any{}
	if err != nil {
		code, m := connectCode(s.log, err)
		end["error"] = rpcError{Code: code, Message: m}
	}
	body, _ := json.Marshal(end)
	st.write(flagEndStream, body)
}

// readEnvelope reads a streaming call's one request message.
func (s *Server) readEnvelope(r *http.Request) ([]byte, error) {
	var head [5]byte
	if _, err := io.ReadFull(r.Body, head[:]); err != nil {
		return nil, newConnectError(codeInvalidArgument, "missing request message")
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > maxRPCMessage {
		return nil, newConnectError(codeResourceExhausted, fmt.Sprintf("request message over %d bytes", maxRPCMessage))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r.Body, body); err != nil {
		return nil, newConnectError(codeInvalidArgument, "truncated request message")
	}
	if head[0]&flagCompressed != 0 {
		return readMessage(bytes.NewReader(body), r.Header.Get("Connect-Content-Encoding"))
	}
	return body, nil
}

// decodeMessage decodes a request message. Unknown fields are ignored, as
// protobuf's JSON mapping allows and newer SDKs rely on.
func decodeMessage(msg []byte, v any) error {
	if len(bytes.TrimSpace(msg)) == 0 {
		return nil
	}
	if err := json.Unmarshal(msg, v); err != nil {
		return newConnectError(codeInvalidArgument, "invalid request message: "+jsonerr.Message(err))
	}
	return nil
}

// Types of protobuf's JSON mapping.

// pbBytes is a bytes field: base64, standard or URL-safe, padded or not.
type pbBytes []byte

func (b pbBytes) MarshalJSON() ([]byte, error) {
	return json.Marshal(base64.StdEncoding.EncodeToString(b))
}

func (b *pbBytes) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	s = strings.TrimRight(s, "=")
	dec, err := base64.RawStdEncoding.DecodeString(s)
	if err != nil {
		dec, err = base64.RawURLEncoding.DecodeString(s)
	}
	if err != nil {
		return fmt.Errorf("invalid base64 bytes")
	}
	*b = dec
	return nil
}

// pbInt64 is an int64 field: a string on the wire, a number accepted.
type pbInt64 int64

func (i pbInt64) MarshalJSON() ([]byte, error) { return json.Marshal(strconv.FormatInt(int64(i), 10)) }

// pbUint32 is a uint32 field: a number, a string accepted.
type pbUint32 uint32

func (u *pbUint32) UnmarshalJSON(data []byte) error {
	s := strings.Trim(string(data), `"`)
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("invalid uint32 %s", data)
	}
	*u = pbUint32(n)
	return nil
}

// pbTime is a google.protobuf.Timestamp.
type pbTime time.Time

func (t pbTime) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Time(t).UTC().Format(time.RFC3339Nano))
}

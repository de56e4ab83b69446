package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
)

// Errors of the adapter itself, of the table's kinds.
var (
	// errUnsupported: an E2B feature Vivarium does not offer.
	errUnsupported = apierr.New(apierr.Unsupported, "not supported by vivarium")
	// errUser: the request asked to act as a user other than the
	// sandbox's one.
	errUser = apierr.New(apierr.PermissionDenied, "unknown user")
)

// apiError is E2B's error body, on the control plane and envd's HTTP API
// alike: the SDKs raise its message with the class the status selects.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// writeEnvdError answers with E2B's error body.
func writeEnvdError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// httpStatus is the status E2B's HTTP APIs answer err with (the table's
// E2B column), and the message for the caller. An unexpected error is
// logged in full and answered without details, which may name host paths.
func httpStatus(log *slog.Logger, err error) (int, string) {
	k, msg := apierr.Answer(log, err)
	return k.E2B(), msg
}

// Connect's error codes, as the adapter's own errors name them.
const (
	codeInvalidArgument   = apierr.ConnectInvalidArgument
	codeDeadlineExceeded  = apierr.ConnectDeadlineExceeded
	codeNotFound          = apierr.ConnectNotFound
	codeAlreadyExists     = apierr.ConnectAlreadyExists
	codePermissionDenied  = apierr.ConnectPermissionDenied
	codeResourceExhausted = apierr.ConnectResourceExhausted
	codeUnimplemented     = apierr.ConnectUnimplemented
	codeInternal          = apierr.ConnectInternal
	codeUnavailable       = apierr.ConnectUnavailable
)

// connectError is an error with its Connect code, for what Connect's
// protocol itself refuses (a codec, a call's deadline) and what the
// adapter says in E2B's terms. The SDKs raise not_found as NotFoundError
// (FileNotFoundError for files), unavailable as the sandbox having timed
// out, deadline_exceeded as TimeoutError, invalid_argument as
// InvalidArgumentError, unauthenticated as AuthenticationError.
type connectError struct {
	code, msg string
}

func (e *connectError) Error() string { return e.code + ": " + e.msg }

func newConnectError(code, msg string) *connectError { return &connectError{code: code, msg: msg} }

// connectCode is err's Connect code (its own, else the table's) and the
// message for the caller.
func connectCode(log *slog.Logger, err error) (string, string) {
	var ce *connectError
	if errors.As(err, &ce) {
		return ce.code, ce.msg
	}
	k, msg := apierr.Answer(log, err)
	return k.Connect, msg
}

type targetKey struct{}

func withTarget(ctx context.Context, t target) context.Context {
	return context.WithValue(ctx, targetKey{}, t)
}

func targetOf(r *http.Request) target { return r.Context().Value(targetKey{}).(target) }

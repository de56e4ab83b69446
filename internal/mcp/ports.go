package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// fetch_port: a model checks a server its code started in a sandbox (a web
// app, an API), through the service's connection into the sandbox's own
// network (service.DialPort): the sandbox gets no network for it.

type fetchPortInput struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox, from create_sandbox."`
	Port      int    `json:"port" jsonschema:"The TCP port the server listens on inside the sandbox, from 1 to 65535."`
	Path      string `json:"path,omitempty" jsonschema:"What to ask for, such as /api/items?limit=5. The default is /."`
}

// Bounds on one fetch_port.
const (
	fetchPortTimeout = 60 * time.Second
	maxFetchBody     = 8 << 20
)

func (s *server) addPortTools() {
	addTool(s, &sdk.Tool{
		Name:  "fetch_port",
		Title: "Fetch from a server in a sandbox",
		Description: `Send an HTTP GET to a server running inside a sandbox (a web app or API your code started) and get back its status, headers and body (long bodies truncated with a note).
Start the server first so that it keeps running, for example with run_python: import subprocess; subprocess.Popen(["python3", "-m", "http.server", "8000"]). It may listen on 0.0.0.0 or 127.0.0.1. Only the sandbox's own servers are reachable this way.`,
		Annotations: &sdk.ToolAnnotations{Title: "Fetch from a server in a sandbox", ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	}, s.fetchPort)
}

func (s *server) fetchPort(ctx context.Context, req *sdk.CallToolRequest, in fetchPortInput) (*sdk.CallToolResult, any, error) {
	owner, err := s.owner(req)
	if err != nil {
		return nil, nil, toolError(s.log, err)
	}
	if in.Port < 1 || in.Port > 65535 {
		return nil, nil, toolError(s.log, fmt.Errorf("%w: port must be from 1 to 65535", sandbox.ErrInvalidSpec))
	}
	target, err := url.Parse("/" + strings.TrimLeft(in.Path, "/"))
	if err != nil {
		return nil, nil, toolError(s.log, fmt.Errorf("%w: path %q: %v", sandbox.ErrInvalidSpec, in.Path, err))
	}
	u := url.URL{Scheme: "http", Host: fmt.Sprintf("localhost:%d", in.Port), Path: target.Path, RawQuery: target.RawQuery}
	client := &http.Client{
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.svc.DialPort(ctx, owner, in.SandboxID, in.Port)
			},
			DisableKeepAlives:      true,
			MaxResponseHeaderBytes: 64 << 10,
		},
		Timeout:       fetchPortTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	r, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	resp, err := client.Do(r)
	if err != nil {
		switch {
		case errors.Is(err, sandbox.ErrPortClosed):
			return nil, nil, fmt.Errorf("nothing listens on port %d in the sandbox: start the server first (and keep it running), "+
				"on 0.0.0.0 or 127.0.0.1", in.Port)
		case errors.Is(err, context.Canceled):
			return nil, nil, toolError(s.log, context.Canceled)
		}
		var unwrapped error = err
		var ue *url.Error
		if errors.As(err, &ue) {
			unwrapped = ue.Err
		}
		var ne net.Error
		switch {
		case errors.As(unwrapped, &ne) && ne.Timeout():
			return nil, nil, fmt.Errorf("the server on port %d did not answer within %v", in.Port, fetchPortTimeout)
		case isServiceError(unwrapped):
			return nil, nil, toolError(s.log, unwrapped)
		}
		return nil, nil, fmt.Errorf("the server on port %d did not answer with valid HTTP", in.Port)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxFetchBody))
	var b strings.Builder
	fmt.Fprintf(&b, "HTTP %s\n", resp.Status)
	for _, k := range []string{"Content-Type", "Content-Length", "Location"} {
		if v := resp.Header.Get(k); v != "" {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	b.WriteString("\n")
	b.WriteString(truncate(strings.ToValidUTF8(string(body), "\uFFFD"), s.cfg.MaxText, "body"))
	return &sdk.CallToolResult{Content: []sdk.Content{text(b.String())}}, nil, nil
}

// isServiceError is an error of the service's (the sandbox is gone, not
// the caller's, has no ports, too many connections), which clientMessage
// words for the model, rather than the sandbox's server's.
func isServiceError(err error) bool {
	return apierr.Classify(err) != apierr.Internal
}

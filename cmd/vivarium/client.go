package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// apiClient speaks to a server's /v1 API.
type apiClient struct {
	base, key string
	http      *http.Client
}

func newAPIClient() *apiClient {
	base := os.Getenv("VIVARIUM_URL")
	if base == "" {
		base = "http://127.0.0.1:8080"
	}
	return &apiClient{base: strings.TrimSuffix(base, "/"), key: os.Getenv("VIVARIUM_API_KEY"), http: &http.Client{}}
}

// apiError is an error answer of the server.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

func (c *apiClient) do(method, p string, body io.Reader, contentType string, accept string) (*http.Response, error) {
	req, err := http.NewRequest(method, c.base+p, body)
	if err != nil {
		return nil, err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the server at %s (set VIVARIUM_URL): %w", c.base, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		var e struct {
			Error struct{ Code, Message string }
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Error.Message == "" {
			e.Error.Message = strings.TrimSpace(string(b))
		}
		return nil, &apiError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	return resp, nil
}

// call sends v as JSON (if not nil) and decodes the answer into out (if
// not nil), or returns it raw.
func (c *apiClient) call(method, p string, v any, out any) ([]byte, error) {
	var body io.Reader
	ct := ""
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(method, p, body, ct, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return raw, fmt.Errorf("unexpected answer from the server: %w", err)
		}
	}
	return raw, nil
}

// clientFail reports a failed call of the command what ("sandbox exec")
// and returns its exit status: 3 for what the server does not have, 1
// otherwise.
func clientFail(what string, err error) int {
	fmt.Fprintf(os.Stderr, "vivarium %s: %v\n", what, err)
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return 3
	}
	return 1
}

func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

// codeFrom reads code from -c, a file, or standard input ("-").
func codeFrom(code string, pos []string) (string, error) {
	switch {
	case code != "" && len(pos) > 0:
		return "", errors.New("give either -c CODE or a file, not both")
	case code != "":
		return code, nil
	case len(pos) == 0:
		return "", errors.New("nothing to run: give a FILE, -c CODE, or - for standard input")
	case pos[0] == "-":
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 32<<20))
		return string(b), err
	default:
		b, err := os.ReadFile(pos[0])
		return string(b), err
	}
}

// stream runs an execution or command of the command what with NDJSON
// streaming, printing output as it arrives, and returns the exit status
// to use.
func (c *apiClient) stream(what, p string, req map[string]any) int {
	body, _ := json.Marshal(req)
	resp, err := c.do("POST", p, bytes.NewReader(body), "application/json", "application/x-ndjson")
	if err != nil {
		return clientFail(what, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev struct {
			Type   string          `json:"type"`
			Text   string          `json:"text"`
			Result sandbox.Output  `json:"result"`
			Error  json.RawMessage `json:"error"`
			// The summary of an execution or a command.
			Summary *struct {
				Status   sandbox.Status `json:"status"`
				ExitCode int            `json:"exit_code"`
				Error    any            `json:"error"`
			} `json:"summary"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			fmt.Fprintf(os.Stderr, "vivarium: malformed event from the server: %v\n", err)
			return 1
		}
		switch ev.Type {
		case "stdout":
			os.Stdout.WriteString(ev.Text)
		case "stderr":
			os.Stderr.WriteString(ev.Text)
		case "result":
			showResult(ev.Result)
		case "error":
			var e sandbox.Error
			if json.Unmarshal(ev.Error, &e) == nil && e.Traceback != "" {
				fmt.Fprint(os.Stderr, strings.TrimSuffix(e.Traceback, "\n")+"\n")
			} else if e.Name != "" {
				fmt.Fprintf(os.Stderr, "%s: %s\n", e.Name, e.Value)
			}
		case "end":
			if ev.Summary == nil {
				var e struct {
					Message string
					Status  int
				}
				json.Unmarshal(ev.Error, &e)
				return clientFail(what, &apiError{Status: e.Status, Message: e.Message})
			}
			if s := ev.Summary.Status; s == sandbox.StatusTimeout || s == sandbox.StatusMemoryLimit || s == sandbox.StatusKilled {
				fmt.Fprintf(os.Stderr, "vivarium: %s\n", s)
			}
			return ev.Summary.ExitCode
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "vivarium: %v\n", err)
	} else {
		fmt.Fprintln(os.Stderr, "vivarium: the server ended the stream early")
	}
	return 1
}

// showResult prints a rich result the way a terminal can: its text, and
// where an image was produced, a note (images are kept with --json).
func showResult(o sandbox.Output) {
	if o.Text != "" {
		fmt.Println(o.Text)
	}
	if o.PNG != "" {
		n := base64.StdEncoding.DecodedLen(len(o.PNG))
		fmt.Fprintf(os.Stderr, "[image/png, about %s; use --json to keep it]\n", formatSize(int64(n)))
	}
}

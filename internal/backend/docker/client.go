package docker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The Engine API versions the client speaks: from Debian 12's docker.io
// (20.10, API 1.41) to the newest the requests below were checked against.
// The daemon's own version is used within that range, as the docker
// command negotiates it.
const (
	minAPIVersion = "1.41"
	maxAPIVersion = "1.47"
)

// DefaultHost is the Docker daemon's usual socket.
const DefaultHost = "unix:///var/run/docker.sock"

// client speaks the Docker Engine API over the daemon's unix socket: the
// dozen calls the backend makes, nothing more (see the package comment for
// why not the moby client module).
type client struct {
	socket  string
	version string // the API version requests name, "1.41"
	http    *http.Client
}

// socketPath returns the unix socket a DOCKER_HOST-style address names.
// Only a local daemon will do: it bind-mounts host directories into each
// container.
func socketPath(host string) (string, error) {
	if host == "" {
		host = os.Getenv("DOCKER_HOST")
	}
	if host == "" {
		host = DefaultHost
	}
	if strings.HasPrefix(host, "/") {
		return host, nil
	}
	p, ok := strings.CutPrefix(host, "unix://")
	if !ok || p == "" {
		return "", fmt.Errorf("%w: docker host %q: the docker backend needs a local daemon on a unix socket (unix:///PATH), since it binds host directories into each container", ErrNoDaemon, host)
	}
	return p, nil
}

// dial connects to the daemon at host and agrees on an API version.
func dial(ctx context.Context, host string) (*client, error) {
	socket, err := socketPath(host)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(socket); err != nil {
		return nil, fmt.Errorf("%w: no Docker daemon socket at %s (is dockerd running?)", ErrNoDaemon, socket)
	}
	c := &client{socket: socket}
	c.http = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
	}}
	var v struct {
		Version, APIVersion, MinAPIVersion string
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.call(ctx, "GET", "/version", nil, nil, &v); err != nil {
		return nil, fmt.Errorf("%w: the Docker daemon at %s does not answer: %v", ErrNoDaemon, socket, err)
	}
	if v.APIVersion == "" {
		return nil, fmt.Errorf("%w: the daemon at %s did not say which API version it speaks", ErrNoDaemon, socket)
	}
	if versionLess(v.APIVersion, minAPIVersion) {
		return nil, fmt.Errorf("%w: the Docker daemon at %s (Docker %s) speaks API %s; the docker backend needs %s or newer",
			ErrAPITooOld, socket, v.Version, v.APIVersion, minAPIVersion)
	}
	c.version = v.APIVersion
	if versionLess(maxAPIVersion, c.version) {
		c.version = maxAPIVersion
		if v.MinAPIVersion != "" && versionLess(c.version, v.MinAPIVersion) {
			c.version = v.MinAPIVersion
		}
	}
	return c, nil
}

// versionLess compares API versions ("1.41" < "1.9" is false).
func versionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

// apiError is an error status from the daemon, with its message.
type apiError struct {
	Status  int
	Message string
}

func (e *apiError) Error() string { return fmt.Sprintf("docker: %s (HTTP %d)", e.Message, e.Status) }

// statusOf is the HTTP status of a daemon's error, or 0.
func statusOf(err error) int {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

func (c *client) url(path string, q url.Values) string {
	u := "http://docker"
	if c.version != "" {
		u += "/v" + c.version
	}
	u += path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// call makes one request: body, when not nil, is sent as JSON (or as is,
// when it is an io.Reader), and a JSON answer is decoded into out.
func (c *client) call(ctx context.Context, method, path string, q url.Values, body, out any) error {
	resp, err := c.send(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out); err != nil {
		return fmt.Errorf("docker: %s %s: decode the answer: %w", method, path, err)
	}
	return nil
}

// send makes one request and returns the response of a successful one.
func (c *client) send(ctx context.Context, method, path string, q url.Values, body any) (*http.Response, error) {
	var r io.Reader
	contentType := ""
	switch b := body.(type) {
	case nil:
	case io.Reader:
		r, contentType = b, "application/x-tar"
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		r, contentType = bytes.NewReader(data), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(path, q), r)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("docker: %s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		var m struct{ Message string }
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(data, &m) != nil || m.Message == "" {
			m.Message = strings.TrimSpace(string(data))
		}
		return nil, &apiError{Status: resp.StatusCode, Message: m.Message}
	}
	return resp, nil
}

// jsonStream reads a stream of JSON messages (image import's progress),
// passing each status to progress, and returns the error one reports.
func jsonStream(r io.Reader, progress func(string)) error {
	dec := json.NewDecoder(r)
	for {
		var m struct {
			Status, Progress, ID, Error string
		}
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if m.Error != "" {
			return errors.New(m.Error)
		}
		if progress != nil && m.Status != "" {
			progress(strings.TrimSpace(m.Status + " " + m.Progress))
		}
	}
}

// hijack makes a request whose connection the daemon then takes over as a
// raw stream (attach), and returns the connection and a reader of what
// follows the response's header.
func (c *client) hijack(ctx context.Context, path string, q url.Values) (*net.UnixConn, io.Reader, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, nil, fmt.Errorf("docker: attach: %w", err)
	}
	uc := conn.(*net.UnixConn)
	req, err := http.NewRequest("POST", c.url(path, q), nil)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "tcp")
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("docker: attach: %w", err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("docker: attach: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols && resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		conn.Close()
		return nil, nil, &apiError{Status: resp.StatusCode, Message: strings.TrimSpace(string(data))}
	}
	conn.SetDeadline(time.Time{})
	return uc, br, nil
}

// demux reads a container's multiplexed output (no TTY): frames of an
// 8-byte header (stream: 1 stdout, 2 stderr; three zero bytes; the
// payload's length, big-endian) and a payload. Read returns stdout's bytes;
// stderr's are kept, bounded, for error messages.
type demux struct {
	r    io.Reader
	left int // of the current stdout frame
	hdr  [8]byte

	mu     sync.Mutex
	stderr []byte
}

const maxStderr = 64 << 10

func (d *demux) Read(p []byte) (int, error) {
	for d.left == 0 {
		if _, err := io.ReadFull(d.r, d.hdr[:]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				err = io.EOF
			}
			return 0, err
		}
		n := int(binary.BigEndian.Uint32(d.hdr[4:]))
		switch d.hdr[0] {
		case 1:
			d.left = n
		default: // stderr, or anything else: kept for diagnosis, bounded
			d.mu.Lock()
			keep := min(max(maxStderr-len(d.stderr), 0), n)
			buf := make([]byte, keep)
			_, err := io.ReadFull(d.r, buf)
			d.stderr = append(d.stderr, buf...)
			d.mu.Unlock()
			if err == nil {
				_, err = io.CopyN(io.Discard, d.r, int64(n-keep))
			}
			if err != nil {
				return 0, io.EOF
			}
		}
	}
	if len(p) > d.left {
		p = p[:d.left]
	}
	n, err := d.r.Read(p)
	d.left -= n
	return n, err
}

// Stderr returns what the container wrote to its standard error so far.
func (d *demux) Stderr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return string(d.stderr)
}

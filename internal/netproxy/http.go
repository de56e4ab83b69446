package netproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/netpolicy"
)

// handle serves one connection from the sandbox: one CONNECT tunnel, or
// one plain request and its response (the connection then closes; HTTP
// clients open another).
//
// In order:
//  1. read the request head, bounded in bytes and time;
//  2. find the destination (CONNECT's authority, or an absolute http://
//     URL) and normalise it;
//  3. decide it: a service the proxy serves itself, or the checker's
//     verdict and the addresses it allows;
//  4. check the byte allowance, dial the allowed addresses in order;
//  5. tunnel (CONNECT) or write the request out again and relay the
//     response, counting every byte against the allowance;
//  6. report one Event.
func (p *Proxy) handle(c net.Conn) {
	start := time.Now()
	ev := Event{Time: start}
	defer func() {
		ev.Duration = time.Since(start)
		p.cfg.Audit(ev)
	}()
	c.SetReadDeadline(start.Add(p.cfg.HeaderTimeout))
	head := &headLimit{r: c, left: p.cfg.MaxHeaderBytes, on: true}
	br := bufio.NewReaderSize(head, 4096)
	req, err := http.ReadRequest(br)
	if err != nil {
		ev.Outcome = Refused
		switch {
		case head.hit:
			ev.Reason = fmt.Sprintf("the request head is over %d bytes", p.cfg.MaxHeaderBytes)
			reply(c, http.StatusRequestHeaderFieldsTooLarge, ev.Reason)
		case errors.Is(err, os.ErrDeadlineExceeded):
			ev.Reason = fmt.Sprintf("no complete request within %v", p.cfg.HeaderTimeout)
			reply(c, http.StatusRequestTimeout, ev.Reason)
		case errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
			ev.Reason = "closed without a request"
		default:
			ev.Reason = "malformed request"
			reply(c, http.StatusBadRequest, ev.Reason+": "+clean(err.Error(), 120))
		}
		return
	}
	head.on = false
	ev.Method = clean(req.Method, 20)

	host, port, err := destination(req)
	if err != nil {
		ev.Outcome, ev.Reason, ev.Host = Refused, err.Error(), clean(req.Host, 100)
		reply(c, http.StatusBadRequest, ev.Reason)
		return
	}
	ev.Host, ev.Port = clean(host, 260), int(port)
	target, err := netpolicy.ParseTarget(host)
	if err != nil {
		ev.Outcome, ev.Reason = Refused, err.Error()
		reply(c, http.StatusForbidden, "vivarium refused "+ev.Host+": "+clean(err.Error(), 200))
		return
	}
	ev.Host = target.String()

	up, err := p.connect(target, port, &ev)
	if err != nil {
		code := http.StatusForbidden
		if ev.Outcome == Failed {
			code = http.StatusBadGateway
		}
		reply(c, code, "vivarium: "+ev.Reason)
		return
	}
	ev.Outcome = Allowed
	defer func() {
		ev.BytesIn, ev.BytesOut = up.in.Load(), up.out.Load()
		if why := p.unwatch(up); why != "" {
			ev.Reason = why
		}
		p.release(up)
	}()
	c.SetReadDeadline(time.Time{})
	var end error
	if req.Method == http.MethodConnect {
		end = p.tunnel(c, br, up)
	} else {
		end = p.forward(c, req, up)
	}
	if end != nil {
		ev.Reason = end.Error()
	}
}

// destination finds where a request goes: CONNECT's host:port, or the
// host of an absolute http:// URL (port 80 by default).
func destination(req *http.Request) (string, uint16, error) {
	if req.Method == http.MethodConnect {
		host, portStr, err := net.SplitHostPort(req.RequestURI)
		if err != nil || host == "" {
			return "", 0, errors.New("CONNECT needs HOST:PORT")
		}
		port, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || port == 0 {
			return "", 0, errors.New("CONNECT needs a port from 1 to 65535")
		}
		return host, uint16(port), nil
	}
	u := req.URL
	switch {
	case u == nil || !u.IsAbs() || u.Host == "":
		return "", 0, errors.New("this is the sandbox's HTTP proxy: send absolute URLs (GET http://host/path) or CONNECT host:port")
	case u.Scheme == "https":
		return "", 0, errors.New("https:// URLs go through CONNECT (HTTPS_PROXY): the proxy never sees inside TLS")
	case u.Scheme != "http":
		return "", 0, fmt.Errorf("scheme %q is not proxied: http:// URLs and CONNECT only", clean(u.Scheme, 20))
	case u.User != nil:
		return "", 0, errors.New("URLs with credentials before the host are refused")
	}
	host, port := u.Hostname(), uint16(80)
	if ps := u.Port(); ps != "" {
		n, err := strconv.ParseUint(ps, 10, 16)
		if err != nil || n == 0 {
			return "", 0, errors.New("the URL's port must be from 1 to 65535")
		}
		port = uint16(n)
	}
	return host, port, nil
}

// connect decides a destination and connects to it, filling in ev.
func (p *Proxy) connect(t netpolicy.Target, port uint16, ev *Event) (*meteredConn, error) {
	fail := func(outcome, format string, args ...any) (*meteredConn, error) {
		ev.Outcome, ev.Reason = outcome, fmt.Sprintf(format, args...)
		return nil, errors.New(ev.Reason)
	}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.DialTimeout+10*time.Second)
	defer cancel()
	type dialer struct {
		addr string
		dial func(context.Context) (net.Conn, error)
		ip   netip.Addr // invalid for a service
	}
	var dials []dialer
	checker := p.checker.Load() // the policy this connection is decided by
	svc, isService := p.cfg.Services[t.Name]
	isService = isService && t.Name != ""
	if isService {
		dials = append(dials, dialer{"(served by vivarium)", svc, netip.Addr{}})
	} else {
		addrs, err := checker.Check(ctx, t, port)
		if err != nil {
			return fail(Refused, "%s", err.Error())
		}
		for _, a := range addrs {
			ap := netip.AddrPortFrom(a, port)
			dials = append(dials, dialer{ap.String(), func(ctx context.Context) (net.Conn, error) { return p.dial(ctx, ap) }, a})
		}
	}
	if p.budget.exhausted() {
		return fail(Refused, "this sandbox has used its %d bytes of network traffic", p.limits.MaxBytes)
	}
	var last error
	for _, d := range dials {
		dctx, dcancel := context.WithTimeout(ctx, p.cfg.DialTimeout)
		c, err := d.dial(dctx)
		dcancel()
		if err == nil {
			if !p.adopt(c) {
				return fail(Failed, "the sandbox is closing")
			}
			ev.Addr = d.addr
			m := &meteredConn{Conn: c, ctx: p.ctx, b: p.budget, idle: p.cfg.IdleTimeout}
			if !isService {
				p.watch(m, checker, dest{target: t, port: port, addr: d.ip})
			}
			return m, nil
		}
		last = err
		if p.ctx.Err() != nil {
			break
		}
	}
	return fail(Failed, "could not connect to %s port %d: %s", t, port, dialError(last))
}

func (p *Proxy) dial(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
	if p.cfg.Dial != nil {
		return p.cfg.Dial(ctx, ap)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", ap.String())
}

// dialError names a dial failure without the Go error chain.
func dialError(err error) string {
	var op *net.OpError
	switch {
	case err == nil:
		return "no address"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		return "timed out"
	case errors.As(err, &op) && op.Err != nil:
		return clean(op.Err.Error(), 100)
	}
	return clean(err.Error(), 100)
}

// tunnel relays a CONNECT tunnel until both directions end.
func (p *Proxy) tunnel(c net.Conn, br *bufio.Reader, up *meteredConn) error {
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return err
	}
	fromSandbox := idleReader{r: br, c: c, idle: p.cfg.IdleTimeout}
	errc := make(chan error, 2)
	go func() {
		_, err := io.Copy(up, fromSandbox)
		up.CloseWrite()
		errc <- err
	}()
	go func() {
		_, err := io.Copy(idleWriter{c: c, idle: p.cfg.IdleTimeout}, up)
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			c.Close()
		}
		errc <- err
	}()
	var first error
	for range 2 {
		if err := <-errc; err != nil && first == nil {
			first = err
			// One side failed: the other must not wait for its idle
			// timeout.
			c.Close()
			up.Close()
		}
	}
	return endReason(first)
}

// hopHeaders are meant for one hop (RFC 9110, 7.6.1) and are not passed on.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func dropHopHeaders(h http.Header) {
	for _, f := range h["Connection"] {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// forward writes a plain request out again and relays its response.
// net/http writes the request's framing anew from what it parsed, so
// conflicting lengths, obsolete line folding and the like never reach
// the upstream server as sent.
func (p *Proxy) forward(c net.Conn, req *http.Request, up *meteredConn) error {
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		// The body is sent at once below: tell the client to send it.
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
	}
	req.Header.Del("Expect")
	dropHopHeaders(req.Header)
	// The Host header names the destination that was checked, whatever
	// the client put in its own.
	req.Host = req.URL.Host
	req.Close = true
	req.RequestURI = ""
	req.Body = io.NopCloser(idleReader{r: req.Body, c: c, idle: p.cfg.IdleTimeout})
	if err := req.Write(up); err != nil {
		reply(c, http.StatusBadGateway, "vivarium: sending the request failed: "+endReason(err).Error())
		return endReason(err)
	}
	head := &headLimit{r: up, left: p.cfg.MaxHeaderBytes, on: true}
	ubr := bufio.NewReaderSize(head, 4096)
	var resp *http.Response
	for {
		var err error
		resp, err = http.ReadResponse(ubr, req)
		if err != nil {
			why := "the server's response is malformed"
			if head.hit {
				why = fmt.Sprintf("the server's response head is over %d bytes", p.cfg.MaxHeaderBytes)
			} else if errors.Is(err, errBudget) || errors.Is(err, os.ErrDeadlineExceeded) {
				why = endReason(err).Error()
			}
			reply(c, http.StatusBadGateway, "vivarium: "+why)
			return errors.New(why)
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		resp.Body.Close() // an interim response: the final one follows
	}
	head.on = false
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		reply(c, http.StatusBadGateway, "vivarium: protocol upgrades are not proxied")
		return errors.New("the server switched protocols")
	}
	dropHopHeaders(resp.Header)
	resp.Close = true
	if err := resp.Write(idleWriter{c: c, idle: p.cfg.IdleTimeout}); err != nil {
		return endReason(err)
	}
	return nil
}

// endReason turns how a relay ended into words for the audit log; nil
// for a clean end.
func endReason(err error) error {
	switch {
	case err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed):
		return nil
	case errors.Is(err, errBudget):
		return errBudget
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errors.New("idle for too long")
	case errors.Is(err, context.Canceled):
		return errors.New("the sandbox closed")
	}
	return errors.New(dialError(err))
}

// refuseBusy answers a connection over the sandbox's limit of open ones.
func (p *Proxy) refuseBusy(c net.Conn) {
	ev := Event{Time: time.Now(), Outcome: Refused,
		Reason: fmt.Sprintf("too many connections at once: this sandbox may have %d", p.limits.MaxConns)}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	head := &headLimit{r: c, left: p.cfg.MaxHeaderBytes, on: true}
	if req, err := http.ReadRequest(bufio.NewReaderSize(head, 4096)); err == nil {
		ev.Method = clean(req.Method, 20)
		if host, port, err := destination(req); err == nil {
			ev.Host, ev.Port = clean(host, 260), int(port)
		}
	}
	reply(c, http.StatusTooManyRequests, "vivarium: "+ev.Reason)
	p.cfg.Audit(ev)
}

// reply writes a complete response with the reason in both the status
// line (which Python's http.client shows in its errors) and the body.
func reply(c net.Conn, code int, reason string) {
	reason = clean(reason, 400)
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s\n",
		code, reason, len(reason)+1, reason)
}

// clean makes text from the sandbox safe to echo in a status line and to
// log: printable ASCII only, at most n bytes.
func clean(s string, n int) string {
	b := make([]byte, 0, min(len(s), n))
	for i := 0; i < len(s) && len(b) < n; i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f {
			c = '?'
		}
		b = append(b, c)
	}
	return string(b)
}

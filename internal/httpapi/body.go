package httpapi

import (
	"io"
	"net/http"
	"time"
)

// BodyIdleTimeout is how long a request's body may send nothing before the
// server stops reading it (IdleBodies).
const BodyIdleTimeout = 30 * time.Second

// IdleBodies bounds every wait for a request's body: a read that gets no
// byte within idle fails, and with it the request, so that a client that
// stops sending mid-body holds its request's resources (an upload's slot,
// a staged file) for at most idle, whatever it is uploading. A body of any
// size still goes through, however long it takes, while it keeps coming.
// h must be given the server's own ResponseWriter (this wraps every other
// handler), whose connection's read deadline is set.
func IdleBodies(h http.Handler, idle time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			// Set now too: a body the handler leaves unread is read
			// by the server after it (to reuse the connection), and a
			// client that sends none of it must not hold the
			// connection for good.
			rc := http.NewResponseController(w)
			rc.SetReadDeadline(time.Now().Add(idle))
			r.Body = &idleBody{ReadCloser: r.Body, rc: rc, idle: idle}
		}
		h.ServeHTTP(w, r)
	})
}

type idleBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
}

// Read reads with the connection's read deadline idle from now. At the
// body's end the deadline is cleared: the server then reads the
// connection to see whether the client goes, and a deadline left would
// end the request's context while its handler still works. After any
// other error it is left as it is, past: the connection is closed once
// the handler ends, rather than waited on.
func (b *idleBody) Read(p []byte) (int, error) {
	b.rc.SetReadDeadline(time.Now().Add(b.idle)) // fails only on a hijacked connection, whose body is not read here
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

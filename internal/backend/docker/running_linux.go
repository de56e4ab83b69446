package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
)

// sandboxContainer is one container.
type sandboxContainer struct {
	r       *Runtime
	id      string
	sandbox string
	conn    *net.UnixConn
	out     *demux
	done    chan struct{}

	pidfd  int // PID 1's, -1 until held
	cg     *cgroups.External
	memory int64 // the memory limit, which bounds socket buffers too
	view   *view // its file system, unmounted once it is removed

	mu        sync.Mutex
	last      cgroups.Stats // the last read, for after the cgroup is gone
	oomKilled bool          // Docker says an OOM kill ended the container
}

// inspect is what the backend reads of GET /containers/ID/json.
type inspect struct {
	State struct {
		Running   bool
		Pid       int
		OOMKilled bool
	}
}

// hold opens a pidfd of the container's PID 1 and finds its cgroup. The
// pidfd is checked to be the container's (its cgroup path names the
// container), so a pid reused by the time it was opened is refused.
func (c *sandboxContainer) hold(ctx context.Context) error {
	var in inspect
	if err := c.r.c.call(ctx, "GET", "/containers/"+c.id+"/json", nil, nil, &in); err != nil {
		return fmt.Errorf("inspect the container: %w", err)
	}
	if !in.State.Running || in.State.Pid <= 0 {
		return errors.New("the container ended as it started")
	}
	fd, err := unix.PidfdOpen(in.State.Pid, 0)
	if err != nil {
		return fmt.Errorf("pidfd_open of the container's process: %w", err)
	}
	c.pidfd = fd
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", in.State.Pid))
	if err != nil || !strings.Contains(string(b), c.id) {
		return fmt.Errorf("the container's process %d is not in the container's cgroup (%v)", in.State.Pid, err)
	}
	if c.cg, err = cgroups.OfProcess(in.State.Pid); err != nil {
		return fmt.Errorf("the container's cgroup: %w", err)
	}
	// Before the agent gets its first request, so before the code makes a
	// socket: Docker's KernelMemoryTCP reaches runc on cgroup v1 no more.
	if err := c.cg.LimitSockets(c.memory); err != nil {
		return fmt.Errorf("the container's socket memory: %w", err)
	}
	return nil
}

// waitExit follows POST /containers/ID/wait to the container's exit, then
// asks Docker whether an OOM kill ended it.
func (c *sandboxContainer) waitExit(body io.ReadCloser) {
	defer close(c.done)
	io.Copy(io.Discard, io.LimitReader(body, 1<<20))
	body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var in inspect
	if err := c.r.c.call(ctx, "GET", "/containers/"+c.id+"/json", nil, nil, &in); err == nil && in.State.OOMKilled {
		c.mu.Lock()
		c.oomKilled = true
		c.mu.Unlock()
	}
}

func (c *sandboxContainer) Stdin() io.WriteCloser { return stdin{c.conn} }
func (c *sandboxContainer) Stdout() io.Reader     { return c.out }
func (c *sandboxContainer) Done() <-chan struct{} { return c.done }

// stdin is the attach stream's writing half; closing it closes the
// container's standard input (StdinOnce), which ends the agent.
type stdin struct{ conn *net.UnixConn }

func (s stdin) Write(p []byte) (int, error) { return s.conn.Write(p) }
func (s stdin) Close() error                { return s.conn.CloseWrite() }

// Stats implements container.Container: the container's own cgroup, which
// Docker made and limits. Once it is gone, the last reading holds, with
// the OOM kill Docker reports if the kernel's count was not seen.
func (c *sandboxContainer) Stats() (cgroups.Stats, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cg == nil {
		return cgroups.Stats{}, false
	}
	if st, err := c.cg.Stats(); err == nil {
		c.last = st
	} else if c.oomKilled && c.last.OOMKills == 0 {
		c.last.OOMKills = 1
	}
	return c.last, true
}

// Kill implements container.Container: SIGKILL to the container's PID 1
// through its pidfd, which takes every process of its PID namespace with
// it, at once and whatever the daemon is doing; then the daemon is told
// too (a runtime such as runsc has processes of its own to end).
func (c *sandboxContainer) Kill() error {
	select {
	case <-c.done:
		return nil
	default:
	}
	var err error
	if c.pidfd >= 0 {
		if e := unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0); e != nil && !errors.Is(e, syscall.ESRCH) {
			err = fmt.Errorf("kill the container's process: %w", e)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e := c.r.c.call(ctx, "POST", "/containers/"+c.id+"/kill", url.Values{"signal": {"KILL"}}, nil, nil); e != nil {
		// 404: gone; 409: not running.
		if s := statusOf(e); s != 404 && s != 409 && err == nil {
			err = fmt.Errorf("kill the container: %w", e)
		}
	}
	return err
}

// Remove implements container.Container: the container (with its writable
// layer and any anonymous volume) is deleted, its pidfd and streams
// closed, its view unmounted.
func (c *sandboxContainer) Remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.r.c.call(ctx, "DELETE", "/containers/"+c.id, url.Values{"force": {"1"}, "v": {"1"}}, nil, nil)
	if statusOf(err) == 404 {
		err = nil
	}
	if c.conn != nil {
		c.conn.Close()
		// The agent writes nothing there unless it failed (a Go panic).
		if msg := c.out.Stderr(); msg != "" {
			c.r.cfg.Logger.Warn("docker: the agent's standard error", "sandbox", c.sandbox, "stderr", msg)
		}
	}
	if c.pidfd >= 0 {
		unix.Close(c.pidfd)
		c.pidfd = -1
	}
	if err != nil {
		// Its view stays for Sweep: the container may still use it.
		return fmt.Errorf("remove the container: %w", err)
	}
	if c.view != nil {
		err = c.view.close()
		c.view = nil
	}
	// runc removes the container's cgroup; runsc leaves it, empty.
	if c.r.cgroupParent != "" {
		err = errors.Join(err, cgroups.RemoveEmpty(c.r.cfg.Name+"/"+c.id))
	}
	return err
}

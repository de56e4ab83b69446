package container

// A container runtime played in the test's process, so that this package's
// own logic (the agent's stream, pause and resume, snapshots, forks,
// paused sandboxes kept on disk) is tested without runsc or dockerd. Each
// container is a goroutine that speaks the agent's protocol
// (internal/agent) over real pipes, and whose "runner" is a tiny
// interpreter whose state (named values) is what a checkpoint saves and a
// restore loads, as runsc saves and loads the sandbox's kernel.
//
// The interpreter runs, line by line: "NAME = VALUE" sets NAME, a line
// that is a bare NAME gives its value as a result (NameError where it has
// none), "crash" ends the container as a kill by the host would; any
// other line (the reseed's Python, which is counted) does nothing.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// fakeRuntime starts fakeContainers. It is a Runtime; restorer makes it a
// Restorer too.
type fakeRuntime struct {
	launches, restores atomic.Int32
	// failRestore, when it returns an error for the nth RestoreAs (from
	// 1), fails that restore.
	failRestore func(n int32) error
	// configs receives each fresh agent's configuration.
	configs chan agent.Config
}

func newFakeRuntime() *fakeRuntime { return &fakeRuntime{configs: make(chan agent.Config, 16)} }

func (r *fakeRuntime) Name() string { return "fake" }

func (r *fakeRuntime) Launch(_ context.Context, l Launch) (Container, error) {
	r.launches.Add(1)
	if fi, err := os.Stat(l.Disk.Workspace); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("the disk's workspace: %v", err)
	}
	return r.start(&kernel{Vars: map[string]string{}}, true), nil
}

// restorer is a fakeRuntime that starts containers from checkpoints.
type restorer struct{ *fakeRuntime }

var _ Restorer = restorer{}

func (r restorer) RestoreAs(_ context.Context, l Launch, dir string) (Container, error) {
	n := r.restores.Add(1)
	if r.failRestore != nil {
		if err := r.failRestore(n); err != nil {
			return nil, err
		}
	}
	if fi, err := os.Stat(l.Disk.Workspace); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("the disk's workspace: %v", err)
	}
	k, err := loadKernel(dir)
	if err != nil {
		return nil, err
	}
	return r.start(k, false), nil
}

func (restorer) ImageKind() (string, error) { return "fake kernel 1", nil }

// kernel is what a container's checkpoint holds: its runner's generation
// and the interpreter's values.
type kernel struct {
	mu   sync.Mutex
	Gen  uint32            `json:"gen"`
	Vars map[string]string `json:"vars"`
	// Reseeds counts the reseeds run (sandbox.Reseed's code).
	Reseeds int `json:"reseeds"`
}

const imageName = "checkpoint.img"

func loadKernel(dir string) (*kernel, error) {
	b, err := os.ReadFile(filepath.Join(dir, imageName))
	if err != nil {
		return nil, err
	}
	var k kernel
	if err := json.Unmarshal(b, &k); err != nil {
		return nil, err
	}
	if k.Vars == nil {
		k.Vars = map[string]string{}
	}
	return &k, nil
}

// fakeContainer is one container: the agent's goroutine on two pipes.
type fakeContainer struct {
	r              *fakeRuntime
	k              *kernel
	stdinR, stdinW *os.File
	stdoutR        *os.File
	out            *agent.Writer
	outW           *os.File
	done           chan struct{}
	killOnce       sync.Once
}

var (
	_ Container    = (*fakeContainer)(nil)
	_ Checkpointer = (*fakeContainer)(nil)
)

// start runs a container's agent on k: a fresh one waits for its
// configuration and starts runner generation 1; a restored one goes on
// where k was saved.
func (r *fakeRuntime) start(k *kernel, fresh bool) *fakeContainer {
	inR, inW, err := os.Pipe()
	if err != nil {
		panic(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		panic(err)
	}
	c := &fakeContainer{r: r, k: k, stdinR: inR, stdinW: inW, stdoutR: outR, outW: outW, out: agent.NewWriter(outW),
		done: make(chan struct{})}
	go c.agent(fresh)
	return c
}

func (c *fakeContainer) Stdin() io.WriteCloser { return c.stdinW }
func (c *fakeContainer) Stdout() io.Reader     { return c.stdoutR }
func (c *fakeContainer) Done() <-chan struct{} { return c.done }
func (c *fakeContainer) Stats() (cgroups.Stats, bool) {
	return cgroups.Stats{}, false
}
func (c *fakeContainer) Remove() error { return nil }

// Kill ends the container: its agent stops reading, and its stream ends.
func (c *fakeContainer) Kill() error {
	c.killOnce.Do(func() {
		c.stdinR.Close()
		c.outW.Close()
		close(c.done)
	})
	return nil
}

func (c *fakeContainer) CheckpointSupported() error { return nil }
func (c *fakeContainer) RestoreOverhead() int64     { return 0 }

// Checkpoint saves the kernel into dir and ends the container, as runsc
// checkpoint does.
func (c *fakeContainer) Checkpoint(_ context.Context, dir string) error {
	c.k.mu.Lock()
	b, err := json.Marshal(c.k)
	c.k.mu.Unlock()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, imageName), b, 0o600); err != nil {
		return err
	}
	return c.Kill()
}

// Restore starts a container from the checkpoint in dir, in place of c.
func (c *fakeContainer) Restore(_ context.Context, dir string) (Container, error) {
	c.r.restores.Add(1)
	k, err := loadKernel(dir)
	if err != nil {
		return nil, err
	}
	return c.r.start(k, false), nil
}

// agent plays the agent: the configuration (fresh), then control
// messages and the runner's requests until the container ends.
func (c *fakeContainer) agent(fresh bool) {
	defer c.Kill()
	fr := agent.NewReader(c.stdinR)
	if fresh {
		f, err := fr.Next()
		if err != nil || f.Kind != agent.KindConfig {
			c.out.Ctl(agent.Ctl{Op: agent.OpError, Step: "read config", Error: fmt.Sprint("no configuration: ", err)})
			return
		}
		var cfg agent.Config
		if err := json.Unmarshal(f.Data, &cfg); err != nil {
			return
		}
		select {
		case c.r.configs <- cfg:
		default:
		}
		c.k.mu.Lock()
		c.k.Gen = 1
		c.k.mu.Unlock()
		c.out.Ctl(agent.Ctl{Op: agent.OpRunner, Gen: 1, PID: 2})
		c.event(1, map[string]any{"type": "ready"})
		c.out.Ctl(agent.Ctl{Op: agent.OpReady})
	}
	var reqs bytes.Buffer
	for {
		f, err := fr.Next()
		if err != nil {
			return
		}
		switch f.Kind {
		case agent.KindCtl:
			var m agent.Ctl
			if json.Unmarshal(f.Data, &m) == nil && m.Op == agent.OpPing {
				c.out.Ctl(agent.Ctl{Op: agent.OpPing, ID: m.ID})
			}
		case agent.KindData:
			c.k.mu.Lock()
			gen := c.k.Gen
			c.k.mu.Unlock()
			if f.Stream != agent.RequestStream(gen) {
				continue
			}
			reqs.Write(f.Data)
			for {
				req, ok := nextRequest(&reqs)
				if !ok {
					break
				}
				if req.Type == "execute" && !c.execute(gen, req.Code) {
					return
				}
			}
		}
	}
}

// nextRequest takes a whole request frame off the front of b.
func nextRequest(b *bytes.Buffer) (runner.Request, bool) {
	var req runner.Request
	if b.Len() < 4 {
		return req, false
	}
	n := int(b.Bytes()[0])<<24 | int(b.Bytes()[1])<<16 | int(b.Bytes()[2])<<8 | int(b.Bytes()[3])
	if b.Len() < 4+n {
		return req, false
	}
	b.Next(4)
	json.Unmarshal(b.Next(n), &req)
	return req, true
}

var name = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// execute runs code; it reports false where the code crashed the
// container.
func (c *fakeContainer) execute(gen uint32, code string) bool {
	if strings.Contains(code, ".seed()") {
		c.k.mu.Lock()
		c.k.Reseeds++
		c.k.mu.Unlock()
	}
	for _, line := range strings.Split(code, "\n") {
		line = strings.TrimSpace(line)
		k, v, set := strings.Cut(line, " = ")
		switch {
		case line == "crash":
			return false
		case set && name.MatchString(k):
			c.k.mu.Lock()
			c.k.Vars[k] = v
			c.k.mu.Unlock()
		case name.MatchString(line):
			c.k.mu.Lock()
			v, ok := c.k.Vars[line]
			c.k.mu.Unlock()
			if !ok {
				c.event(gen, map[string]any{"type": "error", "name": "NameError",
					"value": fmt.Sprintf("name '%s' is not defined", line)})
				continue
			}
			c.event(gen, map[string]any{"type": "result", "data": map[string]any{"text/plain": v},
				"is_main_result": true})
		}
	}
	c.event(gen, map[string]any{"type": "done"})
	return true
}

// event sends the runner's event on its generation's event stream.
func (c *fakeContainer) event(gen uint32, ev map[string]any) {
	var b bytes.Buffer
	if err := runner.WriteFrame(&b, ev); err != nil {
		panic(err)
	}
	c.out.Write(agent.KindData, agent.EventStream(gen), b.Bytes())
}

var errRefused = errors.New("the fake runtime refuses this restore")

// reseeds is how many reseeds ran in s's container's kernel since it was
// saved.
func reseeds(s sandbox.Sandbox) int {
	k := s.(*Sandbox).session().c.(*fakeContainer).k
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.Reseeds
}

package bench

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The driver is a small Python program around jupyter_client's
// KernelManager and BlockingKernelClient, the library Jupyter servers use.
//
//go:embed jupyter_driver.py
var jupyterDriverPy []byte

// jupyter times Jupyter kernels, in one of two ways: a kernel started,
// used and killed per request (warm false), the way a service without
// pooling would isolate requests, or an execution in a kernel that is
// already running (warm true), the round trip of a notebook session. Each
// concurrent caller gets a driver (and warm kernel) of its own.
type jupyter struct {
	python string
	w      Workload
	warm   bool

	dir  string
	pool *pool[*jupyterDriver]
}

func (j *jupyter) setup(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "vivarium-bench-jupyter-")
	if err != nil {
		return err
	}
	j.dir = dir
	if err := os.WriteFile(filepath.Join(dir, "jupyter_driver.py"), jupyterDriverPy, 0o600); err != nil {
		return err
	}
	j.pool = newPool(j.open, (*jupyterDriver).close)
	// The first driver (and warm kernel) starts here, not in a measured
	// iteration.
	return j.pool.with(ctx, func(*jupyterDriver) error { return nil })
}

func (j *jupyter) open(ctx context.Context) (*jupyterDriver, error) {
	// Connection files, kernel specs and IPython's profile stay in the
	// bench's directory, not in a home directory.
	env := peerEnv(
		"HOME="+j.dir,
		"JUPYTER_RUNTIME_DIR="+filepath.Join(j.dir, "runtime"),
		"JUPYTER_DATA_DIR="+filepath.Join(j.dir, "data"),
		"JUPYTER_CONFIG_DIR="+filepath.Join(j.dir, "config"),
		"IPYTHONDIR="+filepath.Join(j.dir, "ipython"),
		// ipykernel's debugger warns on every start about frozen modules.
		"PYDEVD_DISABLE_FILE_VALIDATION=1",
	)
	d, err := startJupyterDriver(j.python, filepath.Join(j.dir, "jupyter_driver.py"), env)
	if err != nil {
		return nil, err
	}
	if j.warm {
		if _, err := d.do(ctx, "start", j.w.Init); err != nil {
			d.close()
			return nil, err
		}
	}
	return d, nil
}

func (j *jupyter) run(ctx context.Context) error {
	op := "once"
	if j.warm {
		op = "exec"
	}
	return j.pool.with(ctx, func(d *jupyterDriver) error {
		out, err := d.do(ctx, op, j.w.Code)
		if err != nil {
			return err
		}
		if !strings.Contains(out, j.w.Want) {
			return fmt.Errorf("%w: kernel printed %q, want %q", ErrOutput, out, j.w.Want)
		}
		return nil
	})
}

func (j *jupyter) teardown() error {
	var err error
	if j.pool != nil {
		err = j.pool.closeAll()
	}
	if j.dir != "" {
		err = errors.Join(err, os.RemoveAll(j.dir))
	}
	return err
}

// jupyterDriver is one running jupyter_driver.py.
type jupyterDriver struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies *os.File
	r       *bufio.Reader
	stderr  *tailBuffer
}

func startJupyterDriver(python, script string, env []string) (*jupyterDriver, error) {
	// Not tied to a context: a driver outlives the iteration that started it.
	cmd := exec.Command(python, script)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	d := &jupyterDriver{cmd: cmd, stderr: &tailBuffer{}}
	cmd.Stderr = d.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// A pipe of our own rather than StdoutPipe: an *os.File can be given
	// a read deadline when an iteration's context ends.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, fmt.Errorf("jupyter driver: %w", err)
	}
	d.stdin, d.replies, d.r = stdin, pr, bufio.NewReader(pr)
	return d, nil
}

// do sends one request and waits for its reply.
func (d *jupyterDriver) do(ctx context.Context, op, code string) (string, error) {
	req, err := json.Marshal(struct {
		Op   string `json:"op"`
		Code string `json:"code"`
	}{op, code})
	if err != nil {
		return "", err
	}
	stop := context.AfterFunc(ctx, func() { d.replies.SetReadDeadline(time.Now()) })
	defer stop()
	if _, err := d.stdin.Write(append(req, '\n')); err != nil {
		return "", d.failed(err)
	}
	line, err := d.r.ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return "", fmt.Errorf("jupyter: %w", ctx.Err())
		}
		return "", d.failed(err)
	}
	var rep struct {
		OK     bool   `json:"ok"`
		Stdout string `json:"stdout"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return "", d.failed(fmt.Errorf("bad reply %q", line))
	}
	if !rep.OK {
		return "", errors.New("jupyter: " + rep.Error)
	}
	return rep.Stdout, nil
}

func (d *jupyterDriver) failed(err error) error {
	return fmt.Errorf("jupyter driver: %v: %s", err, lastLine(d.stderr.String()))
}

// close ends the driver: closing its stdin makes it stop its warm kernel
// and exit; a driver that does not within 10 seconds is killed.
func (d *jupyterDriver) close() error {
	d.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		d.cmd.Process.Kill()
		err = fmt.Errorf("jupyter driver did not exit: killed")
		<-done
	}
	d.replies.Close()
	return err
}

// tailBuffer keeps the last 4 KiB written to it: the end of a long-lived
// program's stderr, where the reason it failed is.
type tailBuffer struct {
	mu sync.Mutex
	b  []byte
}

const tailBufferSize = 4 << 10

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - tailBufferSize; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

package agent

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
	"github.com/vivarium-sandbox/vivarium/internal/seccomp"
)

// Arg0 is the agent's argv[0]: the vivarium binary, bind-mounted into the
// container, runs as the agent when started under this name.
const Arg0 = "vivarium-sandbox-agent"

// IsAgent reports whether this process was started as a container's agent.
func IsAgent() bool { return len(os.Args) > 0 && os.Args[0] == Arg0 }

// The agent runs before main and before the packages it does not need are
// initialised, as the native init does (see its init function).
func init() {
	if IsAgent() {
		runtime.LockOSThread()
		os.Exit(Run(os.Stdin, os.Stdout))
	}
}

// agent is the state of a running agent.
type agent struct {
	cfg Config
	out *Writer

	stdoutW, stderrW *os.File // the write ends every runner and command shares
	stdout, stderr   *pump

	mu       sync.Mutex
	gen      uint32
	runner   int                // pid of the current runner, 0 if none
	requests map[uint32]*queue  // by stream: the runner's requests, commands' stdin
	commands map[int]uint32     // pid → command id
	pgids    map[uint32]int     // command id → pid (its process group)
	waiting  map[uint32][]*pump // command id → its output pumps, flushed before its exit is told
	terms    map[uint32]int     // command id → its terminal's master, to resize it
	egress   *egress            // the sandbox's connections to its network proxy; nil: none
}

// Run is the agent: it returns the exit code of the container.
func Run(in io.Reader, outw io.Writer) int {
	out := NewWriter(outw)
	r := NewReader(in)
	fail := func(step string, err error) int {
		out.Ctl(Ctl{Op: OpError, Step: step, Error: err.Error()})
		return 1
	}
	f, err := r.Next()
	if err != nil || f.Kind != KindConfig {
		return fail("read config", fmt.Errorf("no configuration frame: %v", err))
	}
	a := &agent{out: out, requests: map[uint32]*queue{}, commands: map[int]uint32{}, pgids: map[uint32]int{},
		waiting: map[uint32][]*pump{}, terms: map[uint32]int{}}
	if err := json.Unmarshal(f.Data, &a.cfg); err != nil {
		return fail("read config", err)
	}
	if step, err := a.setup(); err != nil {
		return fail(step, err)
	}
	// Listening before anything of the sandbox's starts: its code cannot
	// take the proxy's address first.
	if a.egress, err = listenEgress(a.cfg.Egress, out); err != nil {
		return fail("listen for the network proxy", err)
	}
	sigchld := make(chan os.Signal, 16)
	signal.Notify(sigchld, syscall.SIGCHLD)
	if err := a.startRunner(); err != nil {
		return fail("start runner", err)
	}
	out.Ctl(Ctl{Op: OpReady})

	// Bytes for the runner and the commands go to their queues from the
	// reading goroutine itself; control messages, which start and signal
	// processes, go to this one, the thread whose privileges were dropped
	// (a goroutine locked to a thread is woken by a thread switch, which
	// under gVisor is too dear to pay for every frame).
	frames := make(chan Frame, 16)
	go func() {
		defer close(frames)
		for {
			f, err := r.Next()
			if err != nil {
				return
			}
			if f.Kind == KindCtl {
				frames <- f
			} else {
				a.handleData(f)
			}
		}
	}()
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				return 0 // the supervisor is gone: so is the sandbox
			}
			a.handle(f)
		case <-sigchld:
			a.reap()
		}
	}
}

// setup confines the agent before it starts anything, in order: no
// supplementary groups, the sandbox's resource limits, the capability
// bounding set emptied and securebits locked, the seccomp filter (with
// no_new_privs); every process the agent starts inherits all of it, then
// becomes the sandbox user.
func (a *agent) setup() (string, error) {
	if err := cloexecFrom(3); err != nil {
		return "close-on-exec inherited descriptors", err
	}
	// The sandbox user may not read the agent's /proc entries (environ,
	// maps, fds): not dumpable, whatever the kernel's rules for root's.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return "prctl(PR_SET_DUMPABLE)", err
	}
	if err := syscall.Setgroups(nil); err != nil {
		return "setgroups", err
	}
	if err := os.Chdir(a.cfg.Workspace); err != nil {
		return "chdir workspace", err
	}
	// Its own data (environment, memory, descriptors) must not be
	// readable by the sandbox user through /proc/1.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return "set non-dumpable", err
	}
	// RLIMIT_CORE 1, not 0: at 0 a core_pattern that pipes to a handler
	// still runs it (as host root, under runc); at 1 the kernel dumps
	// nothing.
	limits := []struct {
		res      int
		cur, max uint64
	}{{unix.RLIMIT_CORE, 1, 1}}
	if a.cfg.OpenFiles > 0 {
		limits = append(limits, struct {
			res      int
			cur, max uint64
		}{unix.RLIMIT_NOFILE, a.cfg.OpenFiles, a.cfg.OpenFiles})
	}
	if a.cfg.FileSize > 0 {
		limits = append(limits, struct {
			res      int
			cur, max uint64
		}{unix.RLIMIT_FSIZE, a.cfg.FileSize, a.cfg.FileSize})
	}
	if a.cfg.MaxProcs > 0 {
		limits = append(limits, struct {
			res      int
			cur, max uint64
		}{unix.RLIMIT_NPROC, a.cfg.MaxProcs, a.cfg.MaxProcs})
	}
	if a.cfg.CPUSeconds > 0 {
		limits = append(limits, struct {
			res      int
			cur, max uint64
		}{unix.RLIMIT_CPU, a.cfg.CPUSeconds, a.cfg.CPUSeconds + 1})
	}
	for _, l := range limits {
		if err := syscall.Setrlimit(l.res, &syscall.Rlimit{Cur: l.cur, Max: l.max}); err != nil {
			return "rlimit", err
		}
	}
	for c := 0; ; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if err == unix.EINVAL && c > 0 {
				break
			}
			if err == unix.EPERM {
				break // the runtime kept no CAP_SETPCAP: the set is what it gave
			}
			return "drop the capability bounding set", err
		}
	}
	unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	prog, err := seccomp.Compile(seccomp.DefaultRules())
	if err != nil {
		return "seccomp", err
	}
	if err := seccomp.Install(prog); err != nil {
		return "seccomp", err
	}
	var fds [4]int
	if err := unix.Pipe2(fds[:2], unix.O_CLOEXEC); err != nil {
		return "output pipes", err
	}
	if err := unix.Pipe2(fds[2:], unix.O_CLOEXEC); err != nil {
		return "output pipes", err
	}
	a.stdoutW, a.stderrW = os.NewFile(uintptr(fds[1]), "stdout"), os.NewFile(uintptr(fds[3]), "stderr")
	a.stdout = newPump(os.NewFile(uintptr(fds[0]), "stdout"), StreamStdout, a.out)
	a.stderr = newPump(os.NewFile(uintptr(fds[2]), "stderr"), StreamStderr, a.out)
	return "", nil
}

// cloexecFrom marks every descriptor from fd up close-on-exec: with
// close_range (Linux 5.11), or one by one where the kernel (gVisor's) has no
// CLOSE_RANGE_CLOEXEC.
func cloexecFrom(fd int) error {
	if unix.CloseRange(uint(fd), ^uint(0), unix.CLOSE_RANGE_CLOEXEC) == nil {
		return nil
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range entries {
		var n int
		if _, err := fmt.Sscan(e.Name(), &n); err == nil && n >= fd {
			unix.CloseOnExec(n)
		}
	}
	return nil
}

// userAttr makes a process the sandbox user's, in a session of its own,
// killed if the agent dies.
func (a *agent) userAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(a.cfg.UID), Gid: uint32(a.cfg.GID), Groups: append([]uint32{}, a.cfg.Groups...)},
		Setsid:     true,
		Pdeathsig:  syscall.SIGKILL,
	}
}

// startRunner starts a new runner generation with fresh request and event
// pipes, and tells the supervisor.
func (a *agent) startRunner() error {
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer reqR.Close()
	evR, evW, err := os.Pipe()
	if err != nil {
		reqW.Close()
		return err
	}
	defer evW.Close()
	python, args := a.cfg.Python, a.cfg.RunnerArgs
	if python == "" {
		// A template's sandbox: python3 on the template's PATH, else a
		// runner without Python (runner.ServeNoPython), this program
		// again, which answers executions with an error; commands run.
		if python, err = lookPath("python3", a.cfg.Env); err != nil {
			if len(args) == 0 {
				reqW.Close()
				return fmt.Errorf("the template has no python3 on its PATH: %w", err)
			}
			python, args = "/proc/self/exe", []string{args[len(args)-1]}
		}
	}
	argv0 := python
	if python == "/proc/self/exe" {
		argv0 = runner.NoPythonArg0
	}
	cmd := &exec.Cmd{
		Path: python, Args: append([]string{argv0}, args...),
		Env: a.cfg.Env, Dir: a.cfg.Workspace, Stdout: a.stdoutW, Stderr: a.stderrW,
		ExtraFiles: []*os.File{reqR, evW}, SysProcAttr: a.userAttr(),
	}
	if err := cmd.Start(); err != nil {
		reqW.Close()
		evR.Close()
		return err
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	a.mu.Lock()
	a.gen++
	gen := a.gen
	a.runner = pid
	a.requests[RequestStream(gen)] = newQueue(reqW)
	a.mu.Unlock()
	// The supervisor hears of the runner before any of its events: it
	// drops the events of a runner it does not know, and its ready event
	// lost would leave the sandbox waiting for it.
	err = a.out.Ctl(Ctl{Op: OpRunner, Gen: gen, PID: pid})
	go a.forwardEvents(evR, EventStream(gen))
	return err
}

// forwardEvents passes a runner's event frames on, as many as were read
// at once in one frame of the stream. Before them, the code's output
// written so far is flushed into the stream, so that a stream shows output
// and events in the order they happened (the runner flushes its output
// before an event, and waits for a result's ack, see runner.py).
func (a *agent) forwardEvents(r *os.File, stream uint32) {
	defer r.Close()
	defer a.out.Write(KindClose, stream, nil)
	br := bufio.NewReaderSize(r, 64<<10)
	var batch []byte
	flush := func() {
		// What the code printed before these events goes out first: a
		// result's or an error's place in the output, and all of an
		// execution's output before its end.
		a.stdout.sync()
		a.stderr.sync()
		if len(batch) > 0 {
			a.out.Write(KindData, stream, batch)
		}
		batch = batch[:0]
		if cap(batch) > 1<<20 {
			batch = nil
		}
	}
	defer flush()
	var head [4]byte
	for {
		if br.Buffered() == 0 {
			flush() // what was read goes out before the agent waits
		}
		if _, err := io.ReadFull(br, head[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(head[:])
		if n > 64<<20 {
			// Not a frame the runner writes: pass what follows on raw,
			// for the supervisor to refuse as it would from a pipe.
			batch = append(batch, head[:]...)
			flush()
			io.Copy(dataWriter{a.out, stream}, br)
			return
		}
		start := len(batch)
		batch = append(batch, head[:]...)
		batch = append(batch, make([]byte, n)...)
		if m, err := io.ReadFull(br, batch[start+4:]); err != nil {
			batch = batch[:start+4+m] // truncated: the supervisor says so
			return
		}
		if len(batch) >= MaxFrame {
			flush()
		}
	}
}

type dataWriter struct {
	w      *Writer
	stream uint32
}

func (d dataWriter) Write(p []byte) (int, error) {
	if err := d.w.Write(KindData, d.stream, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// handleData passes bytes from the supervisor on to a runner or a command.
func (a *agent) handleData(f Frame) {
	if IsEgressStream(f.Stream) {
		if a.egress != nil {
			a.egress.data(f)
		}
		return
	}
	a.mu.Lock()
	q := a.requests[f.Stream]
	a.mu.Unlock()
	if q == nil {
		return // a stream that ended, or never was
	}
	if f.Kind == KindClose {
		q.close()
		return
	}
	q.push(f.Data)
}

// handle acts on one frame from the supervisor.
func (a *agent) handle(f Frame) {
	switch f.Kind {
	case KindData, KindClose:
		a.handleData(f)
	case KindCtl:
		var c Ctl
		if json.Unmarshal(f.Data, &c) != nil {
			return
		}
		switch c.Op {
		case OpSpawn:
			a.spawn(c)
		case OpSignal:
			a.mu.Lock()
			pid := a.pgids[c.ID]
			_, terminal := a.terms[c.ID]
			a.mu.Unlock()
			switch {
			case pid <= 0 || c.Signal <= 0:
			case terminal:
				signalSession(pid, unix.Signal(c.Signal))
			default:
				unix.Kill(-pid, unix.Signal(c.Signal))
			}
		case OpInterrupt:
			a.mu.Lock()
			pid := a.runner
			a.mu.Unlock()
			if pid > 0 {
				// To its main thread: Python handles signals there, and
				// only the thread a signal goes to leaves a call that
				// blocks (threads of a library, numpy's, do not).
				unix.Tgkill(pid, pid, unix.SIGINT)
			}
		case OpRestart:
			a.restart()
		case OpResize:
			a.resize(c)
		case OpEgressReset:
			if a.egress != nil {
				a.egress.reset()
			}
		case OpEgressRelease:
			if a.egress != nil {
				a.egress.release()
			}
		case OpPing:
			a.out.Ctl(Ctl{Op: OpPing, ID: c.ID})
		}
	}
}

// restart kills every process but the agent, waits for them, and starts a
// new runner.
func (a *agent) restart() {
	unix.Kill(-1, unix.SIGKILL)
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			break
		}
		a.exited(pid, ws)
	}
	if err := a.startRunner(); err != nil {
		a.out.Ctl(Ctl{Op: OpError, Step: "restart runner", Error: err.Error()})
	}
}

// spawn starts a command as the sandbox user with its own three streams.
func (a *agent) spawn(c Ctl) {
	reply := Ctl{Op: OpSpawned, ID: c.ID}
	fail := func(err error) {
		reply.Error = err.Error()
		a.out.Ctl(reply)
	}
	if len(c.Argv) == 0 {
		fail(errors.New("empty command"))
		return
	}
	path, err := lookPath(c.Argv[0], c.Env)
	if err != nil {
		fail(err)
		return
	}
	if c.Rows > 0 {
		if err := a.spawnTerminal(c, path); err != nil {
			fail(err)
		}
		return
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		fail(err)
		return
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		fail(err)
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		fail(err)
		return
	}
	dir := c.Dir
	if dir == "" {
		dir = a.cfg.Workspace
	}
	cmd := &exec.Cmd{Path: path, Args: c.Argv, Env: c.Env, Dir: dir, Stdin: inR, Stdout: outW, Stderr: errW,
		SysProcAttr: a.userAttr()}
	err = cmd.Start()
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		fail(err)
		return
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	sin, sout, serr := CommandStreams(c.ID)
	po, pe := newPump(outR, sout, a.out), newPump(errR, serr, a.out)
	a.mu.Lock()
	a.commands[pid] = c.ID
	a.pgids[c.ID] = pid
	a.requests[sin] = newQueue(inW)
	a.waiting[c.ID] = []*pump{po, pe}
	a.mu.Unlock()
	reply.PID = pid
	a.out.Ctl(reply)
}

// reap collects every exited child and tells the supervisor of the runner
// and commands among them (orphans re-parented to the agent are only
// collected).
func (a *agent) reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		a.exited(pid, ws)
	}
}

func (a *agent) exited(pid int, ws unix.WaitStatus) {
	c := Ctl{Op: OpExited, Code: ws.ExitStatus()}
	if ws.Signaled() {
		c.Signal = int(ws.Signal())
		c.Code = 128 + c.Signal
	}
	a.mu.Lock()
	id, isCommand := a.commands[pid]
	isRunner := pid == a.runner && pid != 0
	var pumps []*pump
	switch {
	case isRunner:
		c.Gen = a.gen
		a.runner = 0
		if q := a.requests[RequestStream(a.gen)]; q != nil {
			q.close()
			delete(a.requests, RequestStream(a.gen))
		}
	case isCommand:
		c.ID = id
		delete(a.commands, pid)
		delete(a.pgids, id)
		sin, _, _ := CommandStreams(id)
		if q := a.requests[sin]; q != nil {
			q.close()
			delete(a.requests, sin)
		}
		pumps = a.waiting[id]
		delete(a.waiting, id)
		if fd, ok := a.terms[id]; ok {
			unix.Close(fd)
			delete(a.terms, id)
		}
	}
	a.mu.Unlock()
	if !isRunner && !isCommand {
		return
	}
	if isRunner {
		a.stdout.sync()
		a.stderr.sync()
	}
	for _, p := range pumps {
		p.sync()
	}
	a.out.Ctl(c)
}

// lookPath finds a program in the PATH of the command's environment.
func lookPath(name string, env []string) (string, error) {
	if bytes.ContainsRune([]byte(name), '/') {
		return name, nil
	}
	path := "/usr/bin:/bin"
	for _, kv := range env {
		if len(kv) > 5 && kv[:5] == "PATH=" {
			path = kv[5:]
		}
	}
	for _, dir := range bytes.Split([]byte(path), []byte(":")) {
		if len(dir) == 0 || dir[0] != '/' {
			continue
		}
		p := string(dir) + "/" + name
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found", name)
}

// pump forwards one pipe into a stream for as long as it has writers.
// Reads happen under mu; sync reads until the pipe is empty, so once it
// returns everything written before it was called has been forwarded.
type pump struct {
	f      *os.File
	rc     syscall.RawConn
	stream uint32
	out    *Writer
	mu     sync.Mutex
	buf    []byte
	done   chan struct{}
}

func newPump(r *os.File, stream uint32, out *Writer) *pump {
	// A non-blocking copy of the descriptor makes a pollable file.
	f := r
	if fd, err := unix.FcntlInt(r.Fd(), unix.F_DUPFD_CLOEXEC, 0); err == nil {
		unix.SetNonblock(fd, true)
		f = os.NewFile(uintptr(fd), r.Name())
		r.Close()
	}
	p := &pump{f: f, stream: stream, out: out, buf: make([]byte, 32<<10), done: make(chan struct{})}
	p.rc, _ = f.SyscallConn()
	go p.loop()
	return p
}

func (p *pump) loop() {
	defer close(p.done)
	defer p.f.Close()
	defer p.out.Write(KindClose, p.stream, nil)
	for {
		eof := false
		err := p.rc.Read(func(fd uintptr) bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			n, err := unix.Read(int(fd), p.buf)
			switch {
			case err == unix.EAGAIN:
				return false
			case err == unix.EINTR:
				return true
			case err != nil || n == 0:
				eof = true
			default:
				p.out.Write(KindData, p.stream, p.buf[:n])
			}
			return true
		})
		if err != nil || eof {
			return
		}
	}
}

func (p *pump) sync() {
	p.rc.Control(func(fd uintptr) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for {
			n, err := unix.Read(int(fd), p.buf)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n <= 0 {
				return
			}
			p.out.Write(KindData, p.stream, p.buf[:n])
		}
	})
}

// queue writes to a pipe without ever blocking the agent's main loop: what
// the pipe cannot take yet waits here, up to maxQueued bytes; beyond that
// it is dropped (a process that reads nothing cannot make the agent hold
// more), or, for a connection (abort set), whose bytes cannot be dropped,
// the connection is ended.
type queue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	w      io.Writer
	end    func() // once written: the write side closed
	abort  func() // over maxQueued; nil: drop
	done   chan struct{}
	data   [][]byte
	size   int
	closed bool
}

const maxQueued = 64 << 20

func newQueue(w *os.File) *queue { return startQueue(w, func() { w.Close() }, nil) }

// newConnQueue is a queue to a connection: its end closes the
// connection's write side, and too much queued ends it.
func newConnQueue(c net.Conn) *queue {
	end := func() {
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			c.Close()
		}
	}
	return startQueue(c, end, func() { c.Close() })
}

func startQueue(w io.Writer, end, abort func()) *queue {
	q := &queue{w: w, end: end, abort: abort, done: make(chan struct{})}
	q.cond = sync.NewCond(&q.mu)
	go q.loop()
	return q
}

func (q *queue) push(p []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if q.size+len(p) > maxQueued {
		if q.abort != nil {
			q.closed = true
			q.data, q.size = nil, 0
			q.abort()
			q.cond.Signal()
		}
		return
	}
	q.data = append(q.data, p)
	q.size += len(p)
	q.cond.Signal()
}

func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Signal()
}

func (q *queue) loop() {
	defer close(q.done)
	defer q.end()
	for {
		q.mu.Lock()
		for len(q.data) == 0 && !q.closed {
			q.cond.Wait()
		}
		if len(q.data) == 0 {
			q.mu.Unlock()
			return
		}
		p := q.data[0]
		q.data = q.data[1:]
		q.size -= len(p)
		q.mu.Unlock()
		if _, err := q.w.Write(p); err != nil {
			q.mu.Lock()
			q.closed = true
			q.data, q.size = nil, 0
			q.mu.Unlock()
			return
		}
	}
}

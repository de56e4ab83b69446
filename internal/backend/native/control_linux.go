package native

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"golang.org/x/sys/unix"
)

// After setup, init serves the supervisor on a SOCK_SEQPACKET socket (one
// JSON message per packet). It starts, signals and restarts the runner and
// spawns commands in the sandbox, passing their pipes back with
// SCM_RIGHTS. Every process is forked from init's locked thread, the one
// whose capability bounding set and securebits were dropped.
const fdControl = 7

// maxControlMsg bounds one control packet (a spawn's argv and env).
const maxControlMsg = 256 << 10

// Control operations. Supervisor → init: opSpawn, opSignal, opInterrupt,
// opRestart, opRebind, opAdopt, opTerminals, opTerminalEnd. Init →
// supervisor: opSpawned, opExited, opRunner, opTerminal.
const (
	opSpawn     = "spawn"     // start a command: ID, Argv, Env, Dir, User, Term
	opSignal    = "signal"    // signal a command's process group: PID, Signal
	opInterrupt = "interrupt" // SIGINT to the runner; with an ID, init answers it once sent
	opRestart   = "restart"   // kill every process but init, start a new runner
	opSpawned   = "spawned"   // a command started (PID, with its stdin, stdout and stderr, or its terminal's master) or not (Error)
	opExited    = "exited"    // a command (ID) or the runner (ID 0) ended: Code, Signal
	opRunner    = "runner"    // a runner started
	// opAdopt names a zygote's runner that init adopted (PID, in the
	// sandbox's PID namespace): init reports its end as a runner's.
	opAdopt = "adopt"
	// opRebind carries a socket that becomes init's control socket: one
	// made in the sandbox's network namespace, which CRIU can dump.
	opRebind = "rebind"
	// Terminals across a pause (terminal_linux.go). Init keeps a copy of
	// each terminal's master, so that the pair is whole in the tree CRIU
	// dumps. opTerminals (IDs: the supervisor's terminals, after a
	// restore) asks for them again: init answers opTerminal (ID, with the
	// master) for each of those it holds, and lets go of the others.
	// opTerminalEnd (ID): the supervisor read the terminal's end, init
	// lets go of its copy.
	opTerminals   = "terminals"
	opTerminal    = "terminal"
	opTerminalEnd = "terminal-end"
)

type ctlMsg struct {
	Op     string   `json:"op"`
	ID     uint64   `json:"id,omitempty"`
	Argv   []string `json:"argv,omitempty"`
	Env    []string `json:"env,omitempty"`
	Dir    string   `json:"dir,omitempty"`
	User   string   `json:"user,omitempty"` // a command's: sandbox.UserRoot or the sandbox user
	PID    int      `json:"pid,omitempty"`
	Signal int      `json:"signal,omitempty"`
	Code   int      `json:"code"`
	Error  string   `json:"error,omitempty"`
	// Owner is the host user of a forked sandbox (opSpawnInit).
	Owner uint32 `json:"owner,omitempty"`
	// Tasks is how many of an opSpawnInit's descriptors, after init's
	// five, are the sandbox's cgroup's tasks files; as many follow, the
	// zygote's own (cgroup v1: the init is born in its group,
	// threadCgroup).
	Tasks int `json:"tasks,omitempty"`
	// Term starts a command in a terminal of this size (opSpawn).
	Term *sandbox.TerminalSize `json:"term,omitempty"`
	// IDs are the commands whose terminals the supervisor reads
	// (opTerminals).
	IDs []uint64 `json:"ids,omitempty"`
	// Cred is the uid and gid a build step's command runs as (opSpawn,
	// in place of User): any user of the image.
	Cred *[2]uint32 `json:"cred,omitempty"`
	// Groups are that command's supplementary groups (with Cred).
	Groups []uint32 `json:"groups,omitempty"`
}

func sendCtl(fd int, m ctlMsg, files ...int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if len(files) > 0 {
		oob = unix.UnixRights(files...)
	}
	return unix.Sendmsg(fd, b, oob, nil, 0)
}

// recvCtl reads one message and the descriptors that came with it.
func recvCtl(fd int, buf, oob []byte) (ctlMsg, []int, error) {
	for {
		n, oobn, flags, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ctlMsg{}, nil, err
		}
		var fds []int
		if oobn > 0 {
			cmsgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, c := range cmsgs {
				if got, err := unix.ParseUnixRights(&c); err == nil {
					fds = append(fds, got...)
				}
			}
		}
		if n == 0 {
			closeAll(fds)
			return ctlMsg{}, nil, errors.New("control socket closed")
		}
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			closeAll(fds)
			return ctlMsg{}, nil, errors.New("control message truncated")
		}
		var m ctlMsg
		if err := json.Unmarshal(buf[:n], &m); err != nil {
			closeAll(fds)
			return ctlMsg{}, nil, fmt.Errorf("control message: %w", err)
		}
		return m, fds, nil
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// supervise is init's life after setup: it runs the runner, serves the
// control socket and reaps every process. It returns the exit code of
// init. A one-shot sandbox ends with its runner; a persistent one when the
// supervisor closes the control socket.
func supervise(cfg *initConfig, report func(initStatus)) int {
	// First: no code of the sandbox runs yet, and its pids limit leaves
	// init room (InitReserve). Before the control socket's reader, whose
	// system call would hold the one P until the runtime's monitor took
	// it back (up to 10 ms), and before the runner, whose start competes
	// with it for the sandbox's CPU (as much again).
	spareThreads(initSpareThreads)
	sigchld := make(chan os.Signal, 16)
	signal.Notify(sigchld, syscall.SIGCHLD)
	reqs := make(chan ctlMsg)
	go func() {
		defer close(reqs)
		buf, oob := make([]byte, maxControlMsg), make([]byte, 256)
		for {
			m, fds, err := recvCtl(fdControl, buf, oob)
			if err != nil {
				closeAll(fds)
				return
			}
			if m.Op == opRebind && len(fds) == 1 {
				// Before a checkpoint (checkpoint_linux.go): the new
				// socket takes the place of the old, here, between two
				// reads.
				unix.Dup3(fds[0], fdControl, unix.O_CLOEXEC)
			}
			closeAll(fds) // the supervisor sends none but opRebind's
			if m.Op == opRebind {
				continue
			}
			reqs <- m
		}
	}()

	runner, pipes, err := startRunner(cfg)
	if err != nil {
		report(initStatus{Event: "error", Step: "start runner", Error: err.Error()})
		return 1
	}
	report(initStatus{Event: "started"})
	sendCtl(fdControl, ctlMsg{Op: opRunner, PID: runner}, pipes...)
	closeAll(pipes)
	commands := map[int]uint64{} // pid → command ID
	terminals := map[int]bool{}  // the commands started in a terminal
	masters := map[uint64]int{}  // init's copies of their masters, by command ID (at most maxPTYs)
	var orphans recentExits      // orphans reaped: one may be a runner not yet adopted

	for {
		select {
		case m, ok := <-reqs:
			if !ok {
				return 0 // the supervisor is gone: so is the sandbox
			}
			switch m.Op {
			case opSpawn:
				pid, files, err := spawn(cfg, m)
				reply := ctlMsg{Op: opSpawned, ID: m.ID, PID: pid}
				if err == nil && m.Term != nil {
					if err = keepMaster(masters, m.ID, files[0]); err != nil {
						signalSession(pid, unix.SIGKILL)
						closeAll(files)
						files = nil
					}
				}
				if err != nil {
					reply.Error = err.Error()
				} else {
					commands[pid] = m.ID
					if m.Term != nil {
						terminals[pid] = true
					} else {
						delete(terminals, pid) // a pid a terminal had before
					}
				}
				sendCtl(fdControl, reply, files...)
				closeAll(files)
			case opSignal:
				// Only commands' process groups: never init, never a pid
				// the supervisor did not get from a spawn.
				if _, ok := commands[m.PID]; ok && m.Signal > 0 {
					if terminals[m.PID] {
						signalSession(m.PID, unix.Signal(m.Signal))
					} else {
						unix.Kill(-m.PID, unix.Signal(m.Signal))
					}
				}
			case opAdopt:
				// A forked sandbox's runner, re-parented to init by the
				// zygote's fork (zygote.py's _fork_adopted); it may have
				// ended, and been reaped as an orphan, before this came.
				if cfg.Role != roleForked || runner != 0 || m.PID <= 0 {
					continue
				}
				runner = m.PID
				if ws, ok := orphans.take(m.PID); ok {
					exited(m.PID, ws, &runner, commands, nil)
				}
			case opTerminals:
				for id, fd := range masters {
					if slices.Contains(m.IDs, id) {
						sendCtl(fdControl, ctlMsg{Op: opTerminal, ID: id}, fd)
						continue
					}
					// Nobody reads it (a fork's copy: its supervisor
					// knows none of the source's commands): its end
					// hangs the terminal up, as a copy's pipes are closed.
					unix.Close(fd)
					delete(masters, id)
				}
				sendCtl(fdControl, ctlMsg{Op: opTerminals}) // the answer's end
			case opTerminalEnd:
				if fd, ok := masters[m.ID]; ok {
					unix.Close(fd)
					delete(masters, m.ID)
				}
			case opInterrupt:
				if runner > 0 {
					// To its main thread: Python handles signals there,
					// and only the thread a signal goes to leaves a call
					// that blocks (threads of a library, numpy's, do not).
					unix.Tgkill(runner, runner, unix.SIGINT)
				}
				if m.ID != 0 {
					sendCtl(fdControl, ctlMsg{Op: opInterrupt, ID: m.ID})
				}
			case opRestart:
				// Argv: from now on init starts the runner itself, with
				// these arguments (a restored sandbox of a zygote's, whose
				// PID namespace the zygote cannot enter any more).
				if len(m.Argv) > 0 {
					cfg.RunnerArgs = m.Argv
				}
				// Every process of the namespace but init itself, and the
				// terminals they had.
				unix.Kill(-1, unix.SIGKILL)
				for id, fd := range masters {
					unix.Close(fd)
					delete(masters, id)
				}
				for pid, ws := range reapAll(true) {
					exited(pid, ws, &runner, commands, nil)
				}
				for pid, ws := range awaitAlone(2 * time.Second) {
					exited(pid, ws, &runner, commands, nil)
				}
				runner, pipes, err = startRunner(cfg)
				if err != nil {
					sendCtl(fdControl, ctlMsg{Op: opRunner, Error: err.Error()})
					return 1
				}
				sendCtl(fdControl, ctlMsg{Op: opRunner, PID: runner}, pipes...)
				closeAll(pipes)
			}
		case <-sigchld:
			for pid, ws := range reapAll(false) {
				if pid == runner && cfg.OneShot {
					st := initStatus{Event: "exit", Code: ws.ExitStatus()}
					if ws.Signaled() {
						st.Signal = int(ws.Signal())
						st.Code = 128 + st.Signal
					}
					report(st)
					return 0
				}
				exited(pid, ws, &runner, commands, &orphans)
			}
		}
	}
}

// recentExits keeps the statuses of the last few orphans init reaped.
type recentExits struct {
	pids [8]int
	ws   [8]unix.WaitStatus
	next int
}

func (r *recentExits) add(pid int, ws unix.WaitStatus) {
	r.pids[r.next], r.ws[r.next] = pid, ws
	r.next = (r.next + 1) % len(r.pids)
}

func (r *recentExits) take(pid int) (unix.WaitStatus, bool) {
	for i, p := range r.pids {
		if p == pid {
			r.pids[i] = 0
			return r.ws[i], true
		}
	}
	return 0, false
}

// codeOOMScore is the oom_score_adj of the sandbox's code: the runner
// raises its own to it before any code runs (runner.py's _first_to_go),
// and a command has it from its start (startAsCode).
const codeOOMScore = "500"

// startAsCode starts cmd with init's own oom_score_adj raised to the
// code's, so that the command, and every process it starts (they inherit
// it), is the memory limit's victim before init, as the runner's code
// is: a command of many small processes (a pool of workers) at its
// sandbox's memory limit could otherwise have init, the largest task,
// killed, and with it the whole sandbox. The command gets the score as
// it is forked: written after its start, a shell had already forked its
// first child with init's. Raising a score needs no privilege; init's
// goes back to what it was (a process may always lower its own back to
// what it was given), and a process of the code may lower its own to
// that only. For that moment init is not preferred to the code, only its
// equal.
func startAsCode(cmd *exec.Cmd) error {
	const self = "/proc/self/oom_score_adj"
	was, err := os.ReadFile(self)
	if err != nil || os.WriteFile(self, []byte(codeOOMScore), 0) != nil {
		return cmd.Start()
	}
	defer os.WriteFile(self, was, 0)
	return cmd.Start()
}

// exited reports a process that ended, if the supervisor knows it, and
// keeps an orphan's status in orphans (if not nil).
func exited(pid int, ws unix.WaitStatus, runner *int, commands map[int]uint64, orphans *recentExits) {
	m := ctlMsg{Op: opExited, PID: pid, Code: ws.ExitStatus()}
	if ws.Signaled() {
		m.Signal = int(ws.Signal())
		m.Code = 128 + m.Signal
	}
	switch id, ok := commands[pid]; {
	case pid == *runner:
		*runner = 0
	case ok:
		m.ID = id
		delete(commands, pid)
	default:
		if orphans != nil {
			orphans.add(pid, ws) // re-parented to init
		}
		return
	}
	sendCtl(fdControl, m)
}

// awaitAlone waits, up to limit, until init is the only process left in
// its PID namespace, reaping what becomes its child on the way: a killed
// process's children are re-parented to init only once it has exited, and
// a zygote's runner is reaped by the zygote, outside. Whatever exited, it
// returns, for the supervisor to hear of.
func awaitAlone(limit time.Duration) map[int]unix.WaitStatus {
	out := map[int]unix.WaitStatus{}
	deadline := time.Now().Add(limit)
	for delay := 50 * time.Microsecond; ; delay = min(2*delay, 5*time.Millisecond) {
		maps.Copy(out, reapAll(false))
		if onlyInit() || time.Now().After(deadline) {
			return out
		}
		time.Sleep(delay)
	}
}

// onlyInit reports whether /proc lists no process but init.
func onlyInit() bool {
	d, err := os.Open("/proc")
	if err != nil {
		return true
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	for _, n := range names {
		if n != "1" && n[0] >= '0' && n[0] <= '9' {
			return false
		}
	}
	return true
}

// reapAll collects exited children without blocking; with all set it
// waits until init has no children left.
func reapAll(all bool) map[int]unix.WaitStatus {
	out := map[int]unix.WaitStatus{}
	for {
		var ws unix.WaitStatus
		opts := unix.WNOHANG
		if all {
			opts = 0
		}
		pid, err := unix.Wait4(-1, &ws, opts, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return out
		}
		out[pid] = ws
	}
}

// spawn starts a command as the sandbox user in a session of its own and
// returns its pid and the parent ends of its stdin, stdout and stderr, or,
// for a command with a terminal, the terminal's master, the slave being
// the command's controlling terminal and standard streams.
func spawn(cfg *initConfig, m ctlMsg) (int, []int, error) {
	if len(m.Argv) == 0 {
		return 0, nil, errors.New("empty command")
	}
	path, err := lookPath(m.Argv[0], m.Env)
	if err != nil {
		return 0, nil, err
	}
	dir := m.Dir
	if dir == "" {
		dir = cfg.startDir()
	}
	attr := userAttr(cfg)
	if m.User == sandbox.UserRoot {
		// uid 0 of the sandbox's user namespace: it owns the sandbox's
		// system directories, and has no capability (the bounding set is
		// empty and the securebits locked: dropCapabilities).
		attr.Credential.Uid, attr.Credential.Gid, attr.Credential.Groups = 0, 0, []uint32{}
	}
	if m.Cred != nil {
		if !cfg.Build || m.Cred[0] > maxBuildID || m.Cred[1] > maxBuildID {
			return 0, nil, fmt.Errorf("no command of this sandbox runs as %d:%d", m.Cred[0], m.Cred[1])
		}
		if err := checkBuildGroups(m.Groups); err != nil {
			return 0, nil, err
		}
		attr.Credential.Uid, attr.Credential.Gid = m.Cred[0], m.Cred[1]
		attr.Credential.Groups = append([]uint32{}, m.Groups...)
	} else if len(m.Groups) > 0 {
		return 0, nil, errors.New("supplementary groups are a build step's alone")
	}
	var parent, child []*os.File
	defer func() {
		for _, f := range child {
			f.Close()
		}
	}()
	closeParent := func() {
		for _, f := range parent {
			f.Close()
		}
	}
	if m.Term != nil {
		master, slave, err := openTerminal(*m.Term, int(attr.Credential.Uid), int(attr.Credential.Gid))
		if err != nil {
			return 0, nil, err
		}
		parent, child = []*os.File{master}, []*os.File{slave, slave, slave}
		// The child's descriptor 0 becomes its controlling terminal,
		// after setsid.
		attr.Setctty, attr.Ctty = true, 0
	} else {
		for i := 0; i < 3; i++ {
			r, w, err := os.Pipe()
			if err != nil {
				closeParent()
				return 0, nil, err
			}
			if i == 0 { // stdin: the child reads
				parent, child = append(parent, w), append(child, r)
			} else {
				parent, child = append(parent, r), append(child, w)
			}
		}
	}
	cmd := &exec.Cmd{
		Path: path, Args: m.Argv, Env: m.Env, Dir: dir,
		Stdin: child[0], Stdout: child[1], Stderr: child[2],
		SysProcAttr: attr,
	}
	if err := startAsCode(cmd); err != nil {
		closeParent()
		return 0, nil, err
	}
	pid := cmd.Process.Pid
	cmd.Process.Release() // init reaps with wait4; drop Go's pidfd
	fds := make([]int, len(parent))
	for i, f := range parent {
		// Detach the descriptor from the *os.File so that its finalizer
		// does not close it behind our back.
		fd, err := unix.Dup(int(f.Fd()))
		f.Close()
		if err != nil {
			closeAll(fds[:i])
			return pid, nil, err
		}
		fds[i] = fd
	}
	return pid, fds, nil
}

// userAttr makes a process the sandbox user's, in a session of its own,
// killed if init dies.
func userAttr(cfg *initConfig) *syscall.SysProcAttr {
	u := cfg.user()
	return &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: append([]uint32{}, u.Groups...)},
		Setsid:     true,
		Pdeathsig:  syscall.SIGKILL,
	}
}

// lookPath finds a program in the PATH of the command's environment (init's
// own environment is empty).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: command not found", name)
}

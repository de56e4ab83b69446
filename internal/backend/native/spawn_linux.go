package native

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
)

// Every sandbox is a host user of its own, and its user namespace must be
// OWNED by that user: the kernel charges what processes in a user
// namespace hold (inotify instances and watches, queued signals,
// message-queue bytes, locked memory, namespaces) to the namespace's owner
// in the namespace above, up to the host's per-user limits. A namespace
// created by root would put every sandbox on root's budgets, and one sandbox
// could take all of root's 128 inotify instances.
//
// The owner is the effective uid of the process that creates the namespace,
// at the moment it does. Go's exec applies SysProcAttr.Credential only after
// the clone, so a namespace created through it belongs to its caller. The
// spawner therefore creates namespaces from a thread of its own whose
// effective uid and gid it sets to the sandbox's host user before each
// clone and back to root after:
//
//  1. the thread is locked and never unlocked: its credentials are its
//     own (Linux keeps them per thread; the raw setresuid below changes only
//     this thread), and the Go runtime never clones a new thread from a
//     locked one, so nothing else ever runs with them;
//  2. SECBIT_NO_SETUID_FIXUP keeps the thread's effective capabilities when
//     its effective uid leaves 0: it needs CAP_SETUID, CAP_SETGID and
//     CAP_SETFCAP to write the child's uid and gid maps (a range, with a
//     root mapping), and CAP_DAC_OVERRIDE for cgroup and proc files;
//  3. the child is cloned with CLONE_NEWUSER (and the other namespaces),
//     becoming root of a namespace owned by the sandbox's uid, which maps 0
//     to that uid; a new user namespace starts with default securebits and
//     no capability outside itself, so nothing of the thread's odd state
//     reaches it;
//  4. the thread stays alive as long as the process: it is the parent
//     (for Pdeathsig) of every init it started, which dies with it;
//  5. the thread has no supplementary groups, so neither has any init.
type spawner struct {
	reqs chan spawnRequest
}

type spawnRequest struct {
	cmd   *exec.Cmd
	owner uint32
	// fixedLayout starts cmd without address-space randomization
	// (fixedLayout's comment).
	fixedLayout bool
	// cg, if not nil, is the group cmd is born in (cgroup v1).
	cg   *threadCgroup
	done chan error
}

// threadCgroup is a cgroup v1 group a spawned process is born in: the
// spawner's thread enters it before the clone and goes back home after
// (cgroups.EnterThread), where a move of the child by its pid would wait
// for an RCU grace period. into and home are "tasks" files
// (cgroups.ThreadEntry, cgroups.ThreadHome), the caller's, not closed.
type threadCgroup struct{ into, home []int }

var (
	spawnerOnce sync.Once
	theSpawner  *spawner
	spawnerErr  error
)

// getSpawner returns the process's spawner, starting its thread once.
func getSpawner() (*spawner, error) {
	spawnerOnce.Do(func() {
		sp := &spawner{reqs: make(chan spawnRequest)}
		ready := make(chan error)
		go sp.loop(ready)
		if spawnerErr = <-ready; spawnerErr == nil {
			theSpawner = sp
		}
	})
	return theSpawner, spawnerErr
}

func (sp *spawner) loop(ready chan<- error) {
	runtime.LockOSThread() // never unlocked: see the type's comment
	const secbitNoSetuidFixup = 1 << 2
	bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
	if err == nil {
		err = unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits|secbitNoSetuidFixup), 0, 0, 0)
	}
	if err != nil {
		ready <- fmt.Errorf("spawner: securebits (needs CAP_SETPCAP): %w", err)
		return
	}
	// No supplementary groups (root's, of the server): every init starts
	// without them, and need not drop them on all of its threads
	// (initMain's setgroups). The raw call changes this thread alone.
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		ready <- fmt.Errorf("spawner: setgroups: %w", e)
		return
	}
	ready <- nil
	for r := range sp.reqs {
		r.done <- spawnInGroup(r)
	}
}

// spawnInGroup is spawnWithLayout, in r.cg where it is given. The thread
// is back home before it serves the next request, whatever happened: a
// thread of this process left in a sandbox's group would be counted,
// frozen and killed with the sandbox.
func spawnInGroup(r spawnRequest) error {
	if r.cg == nil {
		return spawnWithLayout(r.cmd, r.owner, r.fixedLayout)
	}
	err := cgroups.EnterThread(r.cg.into)
	if err == nil {
		err = spawnWithLayout(r.cmd, r.owner, r.fixedLayout)
	} else {
		err = fmt.Errorf("start in the sandbox's cgroup: %w", err)
	}
	if herr := cgroups.EnterThread(r.cg.home); herr != nil {
		// Nothing can repair it (the spawner's thread is the parent of
		// every init, and lives as long as the process).
		panic(fmt.Sprintf("spawner: back from a sandbox's cgroup: %v", herr))
	}
	return err
}

// addrNoRandomize is the personality flag ADDR_NO_RANDOMIZE.
const addrNoRandomize = 0x0040000

// spawnWithLayout is spawnAs, where fixedLayout from a thread whose
// personality has ADDR_NO_RANDOMIZE: the child inherits it, keeps it
// across execve (no privilege is gained) and passes it on to its own
// children, so that every process of the sandbox maps its libraries,
// heap and stack where the same program does in any other such sandbox.
// Pausable sandboxes are started so: their kept copies share most of
// their pages with a reference image (pagedelta.go), about 10x less disk.
// The sandbox cannot change it (the seccomp filter allows no personality
// flag), and nothing outside the sandbox relies on its layout.
func spawnWithLayout(cmd *exec.Cmd, owner uint32, fixedLayout bool) error {
	if !fixedLayout {
		return spawnAs(cmd, owner)
	}
	old, _, e := unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	if e != 0 {
		return fmt.Errorf("personality: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_PERSONALITY, old|addrNoRandomize, 0, 0); e != 0 {
		return fmt.Errorf("personality ADDR_NO_RANDOMIZE: %w", e)
	}
	err := spawnAs(cmd, owner)
	if _, _, e := unix.RawSyscall(unix.SYS_PERSONALITY, old, 0, 0); e != 0 {
		// Later sandboxes would be spawned without randomization.
		panic(fmt.Sprintf("spawner: personality back: %v", e))
	}
	return err
}

// spawnAs starts cmd with this thread's effective ids set to owner (0:
// as root).
func spawnAs(cmd *exec.Cmd, owner uint32) error {
	if owner == 0 {
		return cmd.Start()
	}
	if err := setThreadEIDs(owner); err != nil {
		setThreadEIDs(0)
		return fmt.Errorf("become host user %d: %w", owner, err)
	}
	err := cmd.Start()
	if rerr := setThreadEIDs(0); rerr != nil {
		// This thread can no longer spawn as root; nothing can repair
		// it, and a wrong owner would be a security bug.
		panic(fmt.Sprintf("spawner: back to root: %v", rerr))
	}
	return err
}

// setThreadEIDs sets the effective (and so the file system) uid and gid of
// the calling thread only. The gid first: changing it needs CAP_SETGID,
// which the effective uid does not affect here (SECBIT_NO_SETUID_FIXUP).
func setThreadEIDs(id uint32) error {
	const keep = ^uintptr(0) // -1: unchanged
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, uintptr(id), keep); e != 0 {
		return e
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, uintptr(id), keep); e != 0 {
		return e
	}
	return nil
}

// startOwned starts cmd in new user, mount, PID, network, IPC and UTS
// namespaces; the user namespace belongs to owner and maps ids 0-65535 to
// owner, owner+1, ...; the child becomes root of it before exec.
func startOwned(cmd *exec.Cmd, owner uint32, fixedLayout bool, cg *threadCgroup) error {
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(owner), Size: 65536}}
	attr := cmd.SysProcAttr
	if attr == nil {
		attr = &syscall.SysProcAttr{}
		cmd.SysProcAttr = attr
	}
	attr.Cloneflags |= syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
		syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS
	attr.UidMappings, attr.GidMappings = ids, ids
	attr.GidMappingsEnableSetgroups = true // init drops supplementary groups with setgroups
	// Root of the new namespace before exec: an unmapped uid keeps no
	// capability across execve.
	attr.Credential = &syscall.Credential{Uid: 0, Gid: 0}
	return spawnFrom(cmd, owner, fixedLayout, cg)
}

// spawnCmd starts cmd from the spawner's thread, as owner, and with
// Pdeathsig: if this process dies, so does what it started. (Pdeathsig
// follows the creating thread, and the spawner's thread lives as long as
// the process; another thread of the runtime might exit first.)
func spawnCmd(cmd *exec.Cmd, owner uint32) error {
	return spawnFrom(cmd, owner, false, nil)
}

func spawnFrom(cmd *exec.Cmd, owner uint32, fixedLayout bool, cg *threadCgroup) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	sp, err := getSpawner()
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	sp.reqs <- spawnRequest{cmd: cmd, owner: owner, fixedLayout: fixedLayout, cg: cg, done: done}
	return <-done
}

// initCommand is the command that re-executes this binary as a sandbox's
// init with the given descriptors (fdCtrl onwards).
func initCommand(exe string, child []*os.File) *exec.Cmd {
	return &exec.Cmd{Path: exe, Args: []string{initArg0}, Env: initEnv, ExtraFiles: child}
}

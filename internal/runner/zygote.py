"""Vivarium's zygote: a Python that has already imported the runner and the
configured modules (numpy, pandas ...) and forks a copy of itself into each
new sandbox, so that a sandbox starts in a millisecond or two instead of a
whole interpreter start-up, and shares the preloaded pages copy-on-write.

The zygote runs in the zygote's own mount, PID, network, IPC and UTS
namespaces, in the host's user namespace, as a host user of its own with
one capability, CAP_SYS_ADMIN: setns needs it to place each child into a
sandbox's namespaces, whose user namespace is a child of the host's (each
sandbox is a host user of its own). It never runs user code; a template's
zygote runs the image's interpreter and modules, and so starts confined
(no_new_privs and the zygote's filter, loaded by its init's zygoteExec
before the interpreter ran) and serves one tenant. Each child, before any
user code runs, and in this order:

  0. leaves the zygote's session and process group;
  1. moves itself into the sandbox's cgroup, where the supervisor sent
     its "tasks" files (cgroup v1: a process that moves itself waits for
     no RCU grace period, as a move by its pid does), and waits until the
     supervisor lets it go on (having moved it in by its pid otherwise);
  2. joins the sandbox's user namespace, and then, with the capabilities it
     has there, its mount, network, IPC, UTS and cgroup namespaces (its PID
     namespace was chosen before the fork);
  3. takes its standard streams and the runner's pipes, closes every other
     descriptor the zygote held;
  4. sets the sandbox's resource limits;
  5. drops every capability (bounding and ambient sets, securebits
     locked), takes the sandbox user's supplementary groups and ids,
     and empties its capability sets (the sandbox user may be root);
  6. sets no_new_privs and loads the sandbox's seccomp filter;
  7. takes the sandbox's environment, reseeds every random generator the
     zygote seeded, and runs the runner.

It speaks to the supervisor on descriptor 3, a SOCK_SEQPACKET socket: one
JSON message per packet, descriptors passed with SCM_RIGHTS.
"""

import array
import ctypes
import gc
import json
import os
import random
import resource
import select
import signal
import socket
import struct
import sys

import landlock

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2
# linux/securebits.h: noroot, noroot locked, keep_caps locked, no ambient
# raise, no ambient raise locked: as the Go init sets them.
SECUREBITS = (1 << 0) | (1 << 1) | (1 << 5) | (1 << 6) | (1 << 7)

MAX_MESSAGE = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


class SetupError(Exception):
    def __init__(self, step, err):
        super().__init__("%s: %s" % (step, err))


def _check(step, rc):
    if rc != 0:
        e = ctypes.get_errno()
        raise SetupError(step, os.strerror(e))


def _prctl(step, option, a=0, b=0, c=0, d=0):
    _check(step, _libc.prctl(option, a, b, c, d))


def _load_filter(path):
    """Reads the sandbox's seccomp program, compiled by the supervisor."""
    with open(path, "rb") as f:
        raw = f.read()
    n = len(raw) // 8
    prog = (SockFilter * n)()
    for i in range(n):
        code, jt, jf, k = struct.unpack_from("=HBBI", raw, i * 8)
        prog[i] = SockFilter(code, jt, jf, k)
    return prog


def _install_filter(prog):
    fprog = SockFprog(len(prog), ctypes.cast(prog, ctypes.POINTER(SockFilter)))
    _prctl("seccomp", PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))


def _drop_capabilities():
    cap = 0
    while True:
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == 22 and cap > 0:  # EINVAL: past the last one
                break
            _check("drop capability %d from the bounding set" % cap, -1)
        cap += 1
    _prctl("clear ambient capabilities", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    _prctl("securebits", PR_SET_SECUREBITS, SECUREBITS)


def _clear_capabilities():
    """Empties the permitted, effective and inheritable sets (capset): a
    change of ids to uid 0, a template's USER root, keeps them."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()  # two of {effective, permitted, inheritable}
    _check("clear capabilities (capset)", _libc.capset(header, data))


LANDLOCK_ABI = landlock.abi()


def _check_confined():
    """The zygote starts confined (its init's zygoteExec set no_new_privs
    and loaded its filter before the interpreter ran): say so, or fail."""
    with open("/proc/self/status") as f:
        status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    if status.get("NoNewPrivs") != "1" or status.get("Seccomp") != "2":
        raise SetupError("the zygote's confinement", "no_new_privs %s, seccomp %s"
                         % (status.get("NoNewPrivs"), status.get("Seccomp")))


def _check_no_capabilities():
    """The sandbox user must hold no capability at all: say so, or fail."""
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("CapInh", "CapPrm", "CapEff", "CapAmb") and int(value, 16) != 0:
                raise SetupError("drop capabilities", "%s is %s" % (key, value.strip()))


def _reseed():
    """Every child starts from the zygote's memory: generators seeded there
    would give every sandbox the same numbers."""
    seed = os.urandom(16)
    random.seed(seed)
    nprandom = sys.modules.get("numpy.random")
    if nprandom is not None:
        try:
            # The legacy global generator takes 32 bits; from the kernel's
            # entropy, as seed() would, at a tenth of the cost.
            nprandom.seed(int.from_bytes(seed[:4], "little"))
        except Exception:
            pass


def become_sandbox(req, fds, filter_prog, sock):
    """The child's side: everything from the fork to the runner. It returns
    the runner's exit code, for the interpreter to exit with as python3
    would (threads joined, atexit handlers run, objects finalized)."""
    (user_ns, pid_ns, mnt_ns, net_ns, ipc_ns, uts_ns, cgroup_ns) = fds[:7]
    (req_r, evt_w, out_w, err_w, go_r), tasks = fds[7:12], fds[12:]
    os.close(pid_ns)
    os.close(sock.detach())
    # A session and process group of its own at once: the zygote's group
    # holds every other sandbox's runner, and a signal to one's own group
    # (kill(0, ...)) must not reach them.
    os.setsid()
    # 1. The cgroup: this process is single-threaded (as the zygote is), so
    # "0" moves all of it. Then the supervisor's word; EOF: it gave up on
    # this child.
    for fd in tasks:
        try:
            os.write(fd, b"0")
        except OSError as e:
            _setup_error(evt_w, "move into the sandbox's cgroup: %s" % e)
            os._exit(125)
        os.close(fd)
    if os.read(go_r, 1) != b"g":
        os._exit(125)
    os.close(go_r)
    evt = evt_w  # where a setup error is reported
    try:
        # 2. The sandbox's namespaces: its user namespace alone first. The
        # kernel checks the others against the caller's capabilities as
        # they are before the call, and in the host's user namespace the
        # zygote has only CAP_SYS_ADMIN, where joining a mount namespace
        # also needs CAP_SYS_CHROOT; in the sandbox's user namespace the
        # child has every capability, until it drops them below.
        # The namespaces come as files the supervisor opened, not as the
        # sandbox init's pidfd: setns through a pidfd also asks for ptrace
        # access to init, which a zygote without CAP_SYS_PTRACE lacks.
        for fd, kind, name in ((user_ns, CLONE_NEWUSER, "user"), (mnt_ns, CLONE_NEWNS, "mount"),
                               (net_ns, CLONE_NEWNET, "network"), (ipc_ns, CLONE_NEWIPC, "IPC"),
                               (uts_ns, CLONE_NEWUTS, "UTS"), (cgroup_ns, CLONE_NEWCGROUP, "cgroup")):
            _check("join the sandbox's %s namespace (setns)" % name, _libc.setns(fd, kind))
            os.close(fd)
            if kind == CLONE_NEWUSER:
                # Root of the sandbox's user namespace, whose capabilities
                # setns just gave. The zygote's own host user is not mapped
                # there; had the child stayed that user, the step from it
                # to the sandbox user would not be a step away from root,
                # and the kernel would keep its capabilities across it.
                os.setresgid(0, 0, 0)
                os.setresuid(0, 0, 0)
        os.chdir(req.get("dir") or "/workspace")
        # 3. Descriptors: 0 /dev/null, 1 and 2 the sandbox's output, 3 and
        # 4 the runner's pipes; nothing else of the zygote's.
        null = os.open("/dev/null", os.O_RDONLY)
        for src, dst in ((null, 0), (out_w, 1), (err_w, 2)):
            os.dup2(src, dst)
        tmp_r, tmp_w = os.dup(req_r), os.dup(evt_w)
        os.dup2(tmp_r, 3)
        os.dup2(tmp_w, 4)
        evt = 4
        os.closerange(5, 1 << 20)
        # 3b. File access beneath the sandbox's root only (Landlock): the
        # child's own executable is the zygote's, outside it, and
        # /proc/self/exe would open that one file, shared by every sandbox
        # of the zygote (a lock on it would be seen by all of them).
        if LANDLOCK_ABI:
            landlock.confine_to_root(LANDLOCK_ABI)
        # 4. Limits.
        for res, cur, top in req.get("rlimits", []):
            resource.setrlimit(res, (cur, top))
        # 5. Privileges.
        _drop_capabilities()
        os.setgroups(req.get("groups") or [])
        uid, gid = req["uid"], req["gid"]
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        _clear_capabilities()
        _check_no_capabilities()
        # Credential changes reset these two: set them as the sandbox user.
        _prctl("set dumpable", PR_SET_DUMPABLE, 1)
        _prctl("parent death signal", PR_SET_PDEATHSIG, signal.SIGKILL)
        # 6. No way back.
        _prctl("no_new_privs", PR_SET_NO_NEW_PRIVS, 1)
        _install_filter(filter_prog)
    except BaseException as e:
        msg = str(e) if isinstance(e, SetupError) else "%s: %s" % (type(e).__name__, e)
        _setup_error(evt, msg)
        os._exit(125)
    # 7. The sandbox's own process from here. Only what differs from the
    # zygote's environment is changed: each write copies pages.
    env = dict(kv.partition("=")[::2] for kv in req.get("env", []))
    for k in [k for k in os.environ if k not in env]:
        del os.environ[k]
    for k, v in env.items():
        if os.environ.get(k) != v:
            os.environ[k] = v
    # The sandbox's PYTHONPATH (its installed packages) goes where the
    # interpreter would have put it at start-up: after the script's own
    # directory, before the standard library.
    for i, d in enumerate(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p):
        if d not in sys.path:
            sys.path.insert(1 + i, d)
    _reseed()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    # The preloaded objects stay frozen: a collection that walked them would
    # copy every page they are on, and they are not garbage.
    gc.enable()
    import runner

    return runner.main(req.get("mode", "--persistent"))


def _setup_error(fd, msg):
    body = json.dumps({"type": "setup_error", "value": msg}).encode()
    try:
        os.write(fd, struct.pack(">I", len(body)) + body)
    except OSError:
        pass


class Zygote:
    def __init__(self, sock):
        self.sock = sock
        self.children = {}  # pid -> token
        self.filter = _load_filter(os.path.join(HERE, "seccomp.bpf"))

    def send(self, msg, fds=()):
        anc = []
        if fds:
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        self.sock.sendmsg([json.dumps(msg).encode()], anc)

    def receive(self):
        fds = array.array("i")
        msg, anc, flags, _ = self.sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(32 * fds.itemsize))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
        if not msg:
            for fd in fds:
                os.close(fd)
            return None, []
        return json.loads(msg), list(fds)

    def fork(self, req, fds):
        """Forks a child for a sandbox. In the parent it returns None; in
        the child, what the child needs to become the sandbox's runner,
        once the zygote's own stack is unwound."""
        token = req.get("token")
        # The sandbox's namespaces, the runner's pipes and the gate, and the
        # tasks files of the sandbox's cgroup (cgroup v1), one a hierarchy.
        if not 12 <= len(fds) <= 24:
            raise ValueError("fork needs 12 descriptors and tasks files, got %d" % len(fds))
        # The child is born in the sandbox's PID namespace: this sets the
        # namespace of the zygote's next child, and only that.
        _check("enter the sandbox's PID namespace", _libc.setns(fds[1], CLONE_NEWPID))
        if req.get("adopt"):
            pid, pidfd = self._fork_adopted()
            if pid == 0:
                return (req, fds, self.filter, self.sock)
        else:
            pid = os.fork()
            if pid == 0:
                return (req, fds, self.filter, self.sock)
            self.children[pid] = token
            pidfd = os.pidfd_open(pid)
        try:
            self.send({"op": "forked", "token": token, "pid": pid}, [pidfd])
        finally:
            os.close(pidfd)

    def _fork_adopted(self):
        """Forks a runner that the sandbox's init adopts: a child forks it
        and exits at once, and the kernel gives the orphan to the reaper of
        its PID namespace, the sandbox's init. The sandbox is then one
        process tree, init's, which CRIU can save and restore whole. In the
        runner it returns (0, None); in the zygote, the runner's pid and a
        pidfd of it, which the child passed before it exited. The zygote
        hears nothing of the runner's end: init reaps it and says so."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            ours.close()
            try:
                runner = os.fork()
                if runner == 0:
                    theirs.close()
                    return 0, None
                socket.send_fds(theirs, [b"%d" % runner], [os.pidfd_open(runner)])
            except BaseException:
                pass  # the zygote hears of it as no pidfd
            os._exit(0)
        theirs.close()
        try:
            msg, got, _, _ = socket.recv_fds(ours, 32, 1)
        finally:
            ours.close()
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        if not got:
            raise OSError("the runner's parent exited before it passed the runner on")
        return int(msg or b"0"), got[0]

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            token = self.children.pop(pid, None)
            if token is None:
                continue
            msg = {"op": "exited", "token": token, "code": 0, "signal": 0}
            if os.WIFSIGNALED(status):
                msg["signal"] = os.WTERMSIG(status)
                msg["code"] = 128 + msg["signal"]
            else:
                msg["code"] = os.WEXITSTATUS(status)
            self.send(msg)

    def serve(self):
        """Serves fork requests until the supervisor goes (None), or, in a
        child, returns what become_sandbox needs."""
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        while True:
            ready, _, _ = select.select([self.sock, wake_r], [], [])
            if wake_r in ready:
                try:
                    os.read(wake_r, 512)
                except BlockingIOError:
                    pass
                self.reap()
            if self.sock not in ready:
                continue
            req, fds = self.receive()
            if req is None:
                return None  # the supervisor is gone
            child = None
            try:
                if req.get("op") == "fork":
                    child = self.fork(req, fds)
            except Exception as e:
                self.send({"op": "fork_failed", "token": req.get("token"), "error": str(e)})
            if child is not None:
                os.close(wake_r)
                os.close(wake_w)
                return child
            for fd in fds:
                os.close(fd)


# The cells _warm_up runs: the runner's own path for any cell, and, where
# pandas is preloaded, the construction of a small DataFrame.
WARM_UP_CELLS = ("x = [1, 2.5, 'a']\ny = {'k': x}",)
# CPython 3.11 quickens a code object at its eighth call: the runner's
# functions run once a cell.
WARM_UP_RUNS = 8
PANDAS_WARM_UP_CELLS = (
    "import pandas as pd\nframe = pd.DataFrame({'n': range(8), 'f': [0.5] * 8, 's': list('abcdefgh')})",
)


def _warm_up():
    """Runs a few cells through the runner's own path (a request read, the
    cell compiled and run, its end sent) before the zygote freezes its
    objects.

    CPython 3.11 rewrites a function's code object as it first runs it
    (each call counts towards quickening, each unspecialised instruction
    towards specialising it): done in every child, that wrote to pages of
    code objects the zygote shares with all of them, and made them the
    child's own. Done here once, the children run code already specialised,
    and most of it writes nothing but reference counts. The cells' state is
    dropped: a child starts with nothing of theirs but warmer code."""
    import builtins
    import linecache

    import runner

    cells = list(WARM_UP_CELLS)
    if "pandas" in sys.modules:
        cells += PANDAS_WARM_UP_CELLS
    req_r, req_w = os.pipe()
    evt_r, evt_w = os.pipe()
    saved_main, had_display = sys.modules.get("__main__"), hasattr(builtins, "display")
    channel = runner.Channel(req_r, evt_w)
    try:
        rt = runner.Runtime(channel)
        for code in cells:
            for _ in range(WARM_UP_RUNS):
                body = json.dumps({"type": "execute", "code": code}).encode()
                os.write(req_w, struct.pack(">I", len(body)) + body)
                req = channel.receive()
                exit_code, _ = rt.run_cell(req["code"], "<warm-up>", None)
                channel.send({"type": "done", "exit_code": exit_code})
                os.read(evt_r, 1 << 16)
        rt.default.close()
    finally:
        for fd in (req_w, evt_r, channel.req, channel.evt):
            os.close(fd)
        sys.modules["__main__"] = saved_main
        sys.modules.pop("_vivarium_runtime", None)
        if not had_display:
            builtins.__dict__.pop("display", None)
        linecache.cache.pop("<warm-up>", None)


# What _fill_pools allocated: kept for the zygote's life, as the blocks
# they fill must stay taken.
_fillers = []


def _free_blocks():
    """The free blocks of pymalloc's partly used pools, by block size, as
    sys._debugmallocstats writes them to the C library's stderr."""
    with open(os.memfd_create("mallocstats"), "w+b") as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode("ascii", "replace")
    free = {}
    for line in text.splitlines():
        fields = line.split()
        # class, size, pools, blocks in use, available blocks
        if len(fields) == 5 and all(x.isdigit() for x in fields):
            free[int(fields[1])] = int(fields[4])
    return free


def _fill_pools():
    """Takes every free block of the pools the zygote's objects are in.

    Python's allocator gives a new object a free block of a partly used
    pool first, and after gc.collect the zygote's pools are full of holes.
    A child would put each of its new objects into one of them: a page of
    the zygote's, copied for one object. With those blocks taken, the
    child's new objects go to pools of their own, side by side."""
    free = _free_blocks()
    for size, n in free.items():
        if size <= 16:
            make = object
        elif size <= 32:
            make = lambda: float(len(_fillers)) + 0.5  # noqa: E731
        else:
            make = lambda: bytes(size - 33)  # noqa: E731 (bytes' header is 33 bytes)
        _fillers.append([make() for _ in range(n)])


MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20


def _collapse_huge_pages():
    """Backs the zygote's heap with transparent huge pages where it can.

    Every fork copies the page tables of the zygote's memory, and every
    child's exit tears its copy down: with 2 MiB pages that is one entry
    where there were 512. A child that writes to such a page gets a copy of
    the 4 KiB it wrote, as before (the kernel splits a shared huge page on
    a write); what it reads stays shared. A kernel without MADV_COLLAPSE
    (before 6.1), or without memory to spare, leaves the pages as they are.
    """
    try:
        with open("/proc/self/maps") as f:
            maps = f.read().splitlines()
    except OSError:
        return
    for line in maps:
        fields = line.split()
        if fields[1][:2] != "rw" or fields[1][3] != "p" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        start = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        end &= ~(HUGE_PAGE - 1)
        if end > start:
            _libc.madvise(start, end - start, MADV_COLLAPSE)  # a failure leaves the pages as they were


def main():
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
        # A template's python3 may be older: its sandboxes then start one
        # each, without a zygote.
        sys.exit("the zygote needs Python 3.9 or later (os.pidfd_open, socket.send_fds); this is %s"
                 % sys.version.split()[0])
    sock = socket.socket(fileno=3)
    # The zygote started confined, before the interpreter ran: no privilege
    # gained by exec, and a filter that is the sandbox's plus setns and the
    # calls that drop privileges (the children stack the sandbox's on it).
    _check_confined()
    sys.path.append(HERE)
    errors = {}
    import runner  # noqa: F401  (the runner, imported once for every child)

    runner.prepare_environment()
    for name in [m for m in os.environ.get("VIVARIUM_PRELOAD", "").split(",") if m]:
        try:
            __import__(name)
        except BaseException as e:
            errors[name] = "%s: %s" % (type(e).__name__, e)
    if "matplotlib" in sys.modules:
        try:
            import matplotlib.pyplot  # noqa: F401  (the backend and fonts, once)
        except BaseException as e:
            errors["matplotlib.pyplot"] = str(e)
    try:
        _warm_up()
    except BaseException as e:
        errors["warm-up"] = "%s: %s" % (type(e).__name__, e)
    sys.stdout.flush()
    sys.stderr.flush()
    # Pages the zygote wrote stay shared with every child as long as no one
    # writes them: keep the collector away from the preloaded objects.
    gc.collect()
    try:
        _fill_pools()
    except Exception as e:  # the children's pages are then as they were
        errors["filling the allocator's pools"] = "%s: %s" % (type(e).__name__, e)
    gc.freeze()
    gc.disable()
    _collapse_huge_pages()
    # The interpreter's cache of attribute lookups holds a reference to each
    # name it caches: a child's lookups replaced entries, and the counts of
    # two names, strings all over the zygote's pages, changed with each. An
    # empty cache's entries hold one static name instead.
    sys._clear_type_cache()
    z = Zygote(sock)
    z.send({"op": "ready", "errors": errors, "modules": len(sys.modules), "landlock": LANDLOCK_ABI})
    child = z.serve()
    if child is None:
        return 0
    del z
    code = become_sandbox(*child)
    import runner

    runner.exit_now(code)


if __name__ == "__main__":
    main()

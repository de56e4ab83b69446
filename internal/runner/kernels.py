"""Code contexts whose language runs in a process of its own in the sandbox:
JavaScript and TypeScript (Node, kernel_node.js), R (Rscript, kernel_r.R)
and Java (JShell, kernel_java.java).

A kernel is started when code first runs in its context, as the sandbox's
user, in the context's working directory, with the sandbox's environment
and limits: it is one more process of the sandbox, nothing on the host side
changes. Its stdout and stderr are the sandbox's, like the runner's; stdin
is /dev/null. It speaks with the runner over three pipes whose numbers it
finds in VIVARIUM_KERNEL_FDS ("request,event,ack"):

  request (runner -> kernel), one line per cell:
      cell <code in hex> [<name in hex>=<value in hex> ...]
  event (kernel -> runner), one JSON object per line:
      {"type": "result", "data": {mime: value}, "main": bool,
       "files": {mime: path}}  (files: binary representations the kernel
       wrote to a file of its own, read, base64-encoded and removed by the
       runner: R has no base64 of its own)
      {"type": "error", "name": ..., "value": ..., "traceback": ...}
      {"type": "done", "code": int}
  ack (runner -> kernel): "ack\\n" once a result has been passed on, so that
      nothing the cell prints after it can overtake it.

Hex keeps the request trivial to parse in every language (neither Java nor R
has JSON in its standard library). Everything a kernel sends is as hostile
as the code: lines are size-capped, and a kernel that breaks the protocol is
killed and its state reported lost.
"""

import json
import os
import select
import shutil
import signal
import subprocess

_DIR = os.path.dirname(os.path.abspath(__file__))

# A kernel's event line, beyond which the kernel is killed: a result's own
# cap (runner.MAX_RESULT_BYTES) applies after decoding.
MAX_LINE = 24 << 20
# A representation a kernel passes as a file (a plot) beyond which it is
# left out.
MAX_FILE = 6 << 20
# How long a kernel may take to end a cell after an interrupt before it is
# killed (its state with it).
INTERRUPT_GRACE = 3.0


class KernelUnavailable(Exception):
    """The host has no runtime for the language."""


def _which(*names):
    for n in names:
        p = shutil.which(n)
        if p:
            return p
    return None


def kernel_command(language):
    """The kernel's argv, or KernelUnavailable naming what is missing."""
    if language in ("javascript", "typescript"):
        node = _which("node", "nodejs")
        if node is None:
            raise KernelUnavailable("%s needs Node.js (node), which this server does not have" % language)
        # --expose-internals: the kernel rewrites top-level await with the
        # very function Node's own REPL uses (internal/repl/await).
        return [node, "--expose-internals", "--no-warnings", os.path.join(_DIR, "kernel_node.js"), language]
    if language == "r":
        rscript = _which("Rscript")
        if rscript is None:
            raise KernelUnavailable("r needs R (Rscript, Debian's r-base-core), which this server does not have")
        return [rscript, "--vanilla", os.path.join(_DIR, "kernel_r.R")]
    if language == "java":
        java = _which("java")
        jshell = _which("jshell")
        if java is None or jshell is None:
            raise KernelUnavailable("java needs a JDK with JShell (Debian's default-jdk-headless), "
                                    "which this server does not have")
        # Source-file mode: the kernel is compiled when it starts. A small
        # serial heap and the first JIT tier start fastest. java.util is
        # opened for the kernel to set an execution's environment.
        return [java, "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "--add-opens=java.base/java.util=ALL-UNNAMED", os.path.join(_DIR, "kernel_java.java")]
    raise KernelUnavailable("no kernel for %r" % language)


def _hex(s):
    return s.encode("utf-8", "surrogateescape").hex()


class KernelContext:
    """A context whose state lives in a kernel process (see the module
    doc). emit(data, main) passes a result on, as Runtime.emit_result;
    wait(fd) returns once fd is readable, as the runner's
    _Interrupts.wait_readable, which a signal that came just before it
    wakes too."""

    def __init__(self, language, cwd, emit, wait=None):
        self.language = language
        self.cwd = cwd
        self.emit = emit
        self.wait = wait or (lambda fd: select.select([fd], [], []))
        self.proc = None
        self.fds = ()  # the runner's ends: request, event, ack
        self.buf = bytearray()

    def _start(self):
        argv = kernel_command(self.language)
        req_r, req_w = os.pipe()
        evt_r, evt_w = os.pipe()
        ack_r, ack_w = os.pipe()
        child = (req_r, evt_w, ack_r)
        env = dict(os.environ)
        env["VIVARIUM_KERNEL_FDS"] = "%d,%d,%d" % child
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd or None,
                env=env,
                pass_fds=child,
                # Its own process group: an interrupt reaches the kernel and
                # what it started, not the runner.
                start_new_session=True,
            )
        except BaseException:
            for fd in (req_r, req_w, evt_r, evt_w, ack_r, ack_w):
                os.close(fd)
            raise
        for fd in child:
            os.close(fd)
        self.fds = (req_w, evt_r, ack_w)
        self.buf = bytearray()

    def run(self, code, env):
        """Runs a cell; returns (exit_code, error_event or None)."""
        if self.proc is None or self.proc.poll() is not None:
            self._reap()
            try:
                self._start()
            except KernelUnavailable as e:
                return 1, {"type": "error", "name": "KernelUnavailable", "value": str(e), "traceback": ""}
            except OSError as e:
                return 1, {"type": "error", "name": type(e).__name__,
                           "value": "cannot start the %s kernel: %s" % (self.language, e), "traceback": ""}
        line = "cell " + _hex(code)
        for k, v in (env or {}).items():
            line += " %s=%s" % (_hex(k), _hex(v))
        err = None
        try:
            try:
                _write_all(self.fds[0], (line + "\n").encode("ascii"))
            except OSError:
                pass  # the kernel is gone: reading says so
            while True:
                ev = self._event(None)
                if ev is None:
                    return self._lost("the %s kernel exited" % self.language, died=True)
                kind = ev.get("type")
                if kind == "result":
                    data = ev.get("data")
                    if isinstance(data, dict):
                        data = {k: v for k, v in data.items() if isinstance(k, str)}
                        data.update(_read_files(ev.get("files")))
                        self.emit(data, bool(ev.get("main")))
                    _write_all(self.fds[2], b"ack\n")
                elif kind == "error":
                    err = {"type": "error", "name": str(ev.get("name") or "Error"), "value": str(ev.get("value") or ""),
                           "traceback": str(ev.get("traceback") or "")}
                elif kind == "done":
                    code = ev.get("code")
                    return (code if isinstance(code, int) else 1), err
        except KeyboardInterrupt:
            return self._interrupt(err)
        except (OSError, ValueError) as e:
            return self._lost("the %s kernel broke its protocol (%s)" % (self.language, e))

    def _event(self, deadline):
        """The next event, or None when the kernel is gone (or, with a
        deadline, did not answer by then)."""
        import time

        # Each byte is searched once: a huge line costs its length, not
        # its square.
        scanned = 0
        while True:
            nl = self.buf.find(b"\n", scanned)
            if nl >= 0:
                break
            scanned = len(self.buf)
            if scanned > MAX_LINE:
                raise ValueError("an event line over %d bytes" % MAX_LINE)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.fds[1]], [], [], left)[0]:
                    return None
            else:
                self.wait(self.fds[1])
            chunk = os.read(self.fds[1], 1 << 20)
            if not chunk:
                return None
            self.buf += chunk
        line = bytes(self.buf[:nl])
        del self.buf[:nl + 1]
        ev = json.loads(line.decode("utf-8", "surrogateescape"))
        if not isinstance(ev, dict):
            raise ValueError("an event that is not an object")
        return ev

    def _interrupt(self, err):
        """Passes the interrupt on (SIGINT to the kernel's group) and waits
        a little for the cell to end; a kernel that does not is killed."""
        import time

        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except OSError:
            pass
        deadline = time.monotonic() + INTERRUPT_GRACE
        try:
            while True:
                ev = self._event(deadline)
                if ev is None:
                    break
                if ev.get("type") == "result":
                    _write_all(self.fds[2], b"ack\n")  # dropped: the cell was interrupted
                elif ev.get("type") == "done":
                    return 1, {"type": "error", "name": "KeyboardInterrupt", "value": "",
                               "traceback": "the %s cell was interrupted\n" % self.language}
        except (KeyboardInterrupt, OSError, ValueError):
            pass
        return self._lost("the %s kernel did not stop when interrupted" % self.language, name="KeyboardInterrupt")

    def _lost(self, why, name="KernelDied", died=False):
        """Ends the kernel and reports its variables gone. died: it ended
        by itself, not killed by the runner; a signal that ended it is then
        named in the error event (see runner.py's signal_of)."""
        code = self._reap()
        err = {"type": "error", "name": name, "value": why,
               "traceback": "%s (status %d); its variables are gone\n" % (why, code)}
        if died and code > 128:
            err["signal"] = code - 128
        return (code or 1), err

    def _reap(self):
        code = 1
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                code = self.proc.wait(timeout=5)
            except Exception:
                code = 1
            if code < 0:
                code = 128 - code
            self.proc = None
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = ()
        self.buf = bytearray()
        return code

    def close(self):
        self._reap()


def _read_files(files):
    """The representations a kernel left in files (see the module doc),
    base64-encoded; each file is removed. A file that is not a regular
    file of a sane size is left out."""
    import base64
    import stat

    out = {}
    if not isinstance(files, dict):
        return out
    for mime, path in files.items():
        if not (isinstance(mime, str) and isinstance(path, str) and mime.startswith("image/")):
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_FILE:
                with os.fdopen(os.dup(fd), "rb") as f:
                    out[mime] = base64.b64encode(f.read(MAX_FILE + 1)[:MAX_FILE]).decode("ascii")
        finally:
            os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
    return out


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]

"""Vivarium's runner: executes code inside a sandbox the way a notebook cell runs.

It speaks to the supervisor over two pipes that the sandbox's init hands over
as file descriptors 3 (requests, read) and 4 (events, write). Each message is
a frame: a 4-byte big-endian length, then that many bytes of JSON. Code output
goes to the real stdout and stderr, which the supervisor captures separately,
so nothing user code prints can look like a protocol message.

Standard library only; it must start fast and run on any Python 3.8+.
"""

import _ast
import _signal
import binascii
import builtins
import fcntl
import gc
import json
import linecache
import os
import re
import select
import struct
import sys
import textwrap
import threading
import time as _time
import types

_RUNNER_FILE = os.path.abspath(__file__)
_RUNNER_DIR = os.path.dirname(_RUNNER_FILE)
# The runner's own files, whose frames tracebacks leave out.
_OWN_FILES = (_RUNNER_FILE, os.path.join(_RUNNER_DIR, "cells.py"), os.path.join(_RUNNER_DIR, "start.py"))

# Rich results beyond this many bytes (per result) are replaced by a note:
# the supervisor caps frames, and nobody wants a 100 MB HTML table anyway.
MAX_RESULT_BYTES = 8 << 20

# The _repr_*_ methods IPython knows, in its order, with their MIME types.
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
)
_BINARY_MIME = ("image/png", "image/jpeg")


class _Interrupts:
    """Where SIGINT, with which the supervisor stops a cell, raises
    KeyboardInterrupt: only in the cell's code. Raised in the runner's own
    code it would leave a frame half-written or half-read, or a result's
    ack unread in the pipe, and the next cell would wait forever; between
    cells it would end the runner. There it is held until the cell's code
    runs again, and one still held when the next request comes (it was
    meant for a cell that has ended) is dropped."""

    def __init__(self):
        self.open = False  # the main thread runs a cell's code
        self.held = False
        self.main = threading.get_ident()
        self.wake = self.wake_w = -1

    def install(self):
        """Installs the handler, and a pipe the kernel's signal handler
        writes a byte to (signal.set_wakeup_fd), which the runner's waits
        for a kernel or a shell watch too (wait_readable)."""
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # Out of the way of the code's descriptors, as the channel's are.
        self.wake = fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 10)
        self.wake_w = fcntl.fcntl(w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(r)
        os.close(w)
        _signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        _signal.signal(_signal.SIGINT, self.handler)

    def wait_readable(self, fd, _select=select.select, _read=os.read):
        """Returns once fd is readable, or raises KeyboardInterrupt where
        the cell's code may be interrupted. A signal that came just before
        the wait began wakes it too: Python runs a handler between
        bytecodes, so a bare read entered after the signal came would
        sleep through it until the kernel or the shell wrote, maybe never
        (a cell's busy loop)."""
        while True:
            if self.wake_w >= 0:
                # Again each time: the code may have taken it (asyncio does).
                _signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
            ready = _select([fd, self.wake] if self.wake >= 0 else [fd], [], [])[0]
            if self.wake in ready:
                try:
                    _read(self.wake, 512)
                except OSError:
                    pass
            if fd in ready:
                return
            # Only the wake-up: the loop's next turn runs the handler.

    def handler(self, signum, frame):
        if self.open:
            raise KeyboardInterrupt
        self.held = True

    def enter(self):
        """The cell's code runs from here: a held interrupt fires now."""
        self.open = True
        if self.held:
            self.held = False
            raise KeyboardInterrupt

    def shut(self):
        """Holds interrupts while the runner's code runs on behalf of a
        cell's (a result sent from display()); returns whether to enter
        again after."""
        if self.open and threading.get_ident() == self.main:
            self.open = False
            return True
        return False


_interrupts = _Interrupts()


class Channel:
    """The framed pipes to the supervisor, moved out of user code's way."""

    def __init__(self, req_fd, evt_fd):
        # Move the pipes to higher, close-on-exec descriptors so that
        # subprocesses do not inherit them and fds 3 and 4 are free. Not
        # too high: the open-files limit may be as low as 64.
        self.req = fcntl.fcntl(req_fd, fcntl.F_DUPFD_CLOEXEC, 10)
        self.evt = fcntl.fcntl(evt_fd, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(req_fd)
        os.close(evt_fd)
        self.lock = threading.Lock()

    # The protocol's functions are bound when the runner is loaded: code
    # that replaces json.dumps or os.write for its own ends (a notebook
    # that patches json for pretty output) cannot break the channel.
    def _read_exact(self, n, _read=os.read):
        buf = bytearray()
        while len(buf) < n:
            chunk = _read(self.req, n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def receive(self, fresh=False, _unpack=struct.unpack, _loads=json.loads):
        """The next message, or None at the end. fresh: the main loop waits
        for the next request; an interrupt held until its first bytes came
        was for a cell that has ended."""
        head = self._read_exact(4)
        if head is None:
            return None
        if fresh:
            _interrupts.held = False
        (n,) = _unpack(">I", head)
        body = self._read_exact(n)
        if body is None:
            return None
        return _loads(body)

    def send(self, event, wait_ack=False, _dumps=json.dumps, _pack=struct.pack, _write=os.write):
        body = _dumps(event, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
        frame = _pack(">I", len(body)) + body
        reopen = _interrupts.shut()
        try:
            with self.lock:
                view = memoryview(frame)
                while view:
                    n = _write(self.evt, view)
                    view = view[n:]
                if wait_ack:
                    # The supervisor reads the output pipes up to here
                    # before it acknowledges: nothing printed after this
                    # result can overtake it.
                    while True:
                        req = self.receive()
                        if req is None or req.get("type") == "ack":
                            break
        finally:
            if reopen:
                _interrupts.enter()


_json_loads = json.loads


def _encode(mime, value):
    """Makes a repr's value JSON-ready, or returns None to skip it."""
    if isinstance(value, tuple):  # (data, metadata), as IPython allows
        value = value[0] if value else None
    if value is None:
        return None
    if mime in _BINARY_MIME:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return _b64(bytes(value))
        return str(value)
    if mime == "application/json":
        if isinstance(value, (str, bytes)):
            try:
                return _json_loads(value)
            except ValueError:
                return None
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _b64(data):
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _figure_png(fig):
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return _b64(buf.getvalue())


def mime_bundle(obj):
    """Returns the representations of obj, keyed by MIME type."""
    data = {}
    try:
        text = repr(obj)
    except Exception as e:  # a broken __repr__ must not break the cell
        text = "<unrepresentable %s: %s>" % (type(obj).__name__, e)
    data["text/plain"] = text

    mod = type(obj).__module__ or ""
    if mod.startswith("matplotlib.") and hasattr(obj, "savefig"):
        try:
            data["image/png"] = _figure_png(obj)
        except Exception:
            pass
        _add_chart(data, obj)
        return data

    bundle = _call_repr(obj, "_repr_mimebundle_")
    if isinstance(bundle, tuple):
        bundle = bundle[0] if bundle else None
    if isinstance(bundle, dict):
        for mime, value in bundle.items():
            enc = _encode(mime, value)
            if enc is not None:
                data[mime] = enc
    for method, mime in _REPR_METHODS:
        if mime in data:
            continue
        enc = _encode(mime, _call_repr(obj, method))
        if enc is not None:
            data[mime] = enc
    if mod.startswith("pandas.") and type(obj).__name__ == "DataFrame":
        _add_frame_data(data, obj)
    return data


# Vivarium's own MIME types for E2B's result fields: a figure described as
# data ("chart") and a DataFrame's columns ("data"). Either may be left out
# of a result that is too big (see Runtime.emit_result).
CHART_MIME = "application/vnd.vivarium.chart+json"
DATA_MIME = "application/vnd.vivarium.data+json"
# A DataFrame of more cells than this is shown without its data.
MAX_DATA_CELLS = 1_000_000


def _add_chart(data, fig):
    try:
        import vivarium_mpl_backend

        chart = vivarium_mpl_backend.describe(fig)
    except Exception:
        return
    if chart is not None:
        data[CHART_MIME] = chart


def _add_frame_data(data, df):
    """The frame's columns, each a list of its values, as E2B gives them
    (to_dict(orient="list")), made JSON by pandas itself: dates in ISO
    8601, NaN as null. JSON of more than twice the result limit is not
    decoded: its columns (the same values, less a bracket pair per row,
    at most MAX_DATA_CELLS of them) would still be over the limit, and
    left out of the result anyway (emit_result)."""
    try:
        if df.size > MAX_DATA_CELLS:
            return
        try:
            text = df.to_json(orient="split", index=False, date_format="iso", default_handler=str)
        except (TypeError, ValueError):  # a pandas that shows every index
            text = df.to_json(orient="split", date_format="iso", default_handler=str)
        if len(text) > 2 * MAX_RESULT_BYTES:
            return
        split = _json_loads(text)
        cols = [str(c) for c in split["columns"]]
        out = {c: [] for c in cols}
        for row in split["data"]:
            for c, v in zip(cols, row):
                out[c].append(v)
        data[DATA_MIME] = out
    except Exception:
        pass


def _call_repr(obj, method):
    # Look the method up on the type, as IPython does, so that objects
    # answering every attribute (mocks, proxies) do not produce junk.
    f = getattr(type(obj), method, None)
    if f is None or not callable(f):
        return None
    try:
        return getattr(obj, method)()
    except Exception:
        return None


def _size(data, _dumps=json.dumps):
    """The bytes a result takes in its frame: encoded, not counted in
    characters (an emoji is four bytes, a control character six). A value
    JSON cannot encode (a circular one) raises, as sending it would."""
    return len(_dumps(data, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))


def _new_main():
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    return module


class PythonContext:
    """A namespace of its own, as a separate kernel has. The contexts of a
    sandbox live in this one process, each with its own __main__ and working
    directory: a context then costs a dictionary, not an interpreter with
    its own copy of pandas, and the sandbox keeps one runner to start,
    interrupt, limit and restart. They separate state, not privileges;
    modules imported by one are shared with every other, as sys.modules is.
    """

    language = "python"

    def __init__(self, cwd):
        self.module = _new_main()
        # None for the default context, which keeps the process's own
        # working directory, as it always has.
        self.cwd = cwd

    def close(self):
        self.module.__dict__.clear()


class BashContext:
    """A bash that keeps its variables, functions and working directory
    from one cell to the next. Each cell is written to a file and sourced
    (with stdin from /dev/null, so that a command reading its input cannot
    eat the next cell); the shell then writes the cell's status to a pipe
    that only the runner reads. Its output goes to the sandbox's stdout and
    stderr, like the code's."""

    language = "bash"

    def __init__(self, cwd):
        self.cwd = cwd
        self.proc = None
        self.status_r = -1
        self.status_w = -1

    def _start(self):
        import subprocess

        r, w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                ["/bin/bash", "--noprofile", "--norc"],
                stdin=subprocess.PIPE,
                cwd=self.cwd or None,
                pass_fds=(w,),
                # Its own process group: an interrupt reaches the cell's
                # commands, not the runner.
                start_new_session=True,
            )
        except BaseException:
            os.close(r)
            os.close(w)
            raise
        os.close(w)
        self.status_r, self.status_w = r, w

    def run(self, code, env):
        """Runs a cell; returns (exit_code, error_event or None)."""
        for k in env or {}:
            if not (k.isascii() and k.isidentifier()):
                return 1, {"type": "error", "name": "ValueError", "value": "%r is not a shell variable name" % k,
                           "traceback": ""}
        if self.proc is None or self.proc.poll() is not None:
            try:
                self._start()
            except OSError as e:
                return 1, {"type": "error", "name": type(e).__name__, "value": "cannot start bash: %s" % e,
                           "traceback": ""}
        cell = "/tmp/.vivarium-bash-%d-%d.sh" % (os.getpid(), self.proc.pid)
        fd = os.open(cell, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(code)
            f.write("\n")
        script = []
        for i, (k, v) in enumerate((env or {}).items()):
            script.append('__vv_set%d=${%s+x}; __vv_old%d=${%s-}; export %s=%s' % (i, k, i, k, k, _shell_quote(v)))
        script.append(". %s </dev/null" % _shell_quote(cell))
        script.append("__vv_rc=$?")
        for i, k in enumerate(env or {}):
            script.append('if [ -n "$__vv_set%d" ]; then export %s="$__vv_old%d"; else unset %s; fi; unset __vv_set%d __vv_old%d'
                          % (i, k, i, k, i, i))
        script.append("printf '%%s\\n' \"$__vv_rc\" >&%d" % self.status_w)
        _flush_std()
        # An interrupt may land anywhere from here on (Python checks for
        # signals between bytecodes): wherever it does, the cell stops.
        try:
            try:
                self.proc.stdin.write(("\n".join(script) + "\n").encode("utf-8", "surrogateescape"))
                self.proc.stdin.flush()
            except OSError:
                pass  # bash is gone: its status says why
            line = self._status_line()
        except KeyboardInterrupt as e:
            self._interrupt()
            return 1, _error_event(e)
        if line is None:
            # The cell ended the shell (exit, exec, a signal): the next cell
            # gets a fresh one.
            code = self._reap()
            return code, signal_of({"type": "error", "name": "ExitCode", "value": str(code),
                                    "traceback": "bash exited with status %d; its variables are gone\n" % code}, code)
        try:
            code = int(line)
        except ValueError:
            code = 1
        if code != 0:
            return code, signal_of({"type": "error", "name": "ExitCode", "value": str(code),
                                    "traceback": "the cell's last command exited with status %d\n" % code}, code)
        return 0, None

    def _status_line(self):
        buf = b""
        while not buf.endswith(b"\n"):
            _interrupts.wait_readable(self.status_r)
            chunk = os.read(self.status_r, 64)
            if not chunk:
                return None
            buf += chunk
        return buf.decode("ascii", "replace").strip()

    def _interrupt(self):
        """Stops the cell: SIGINT to its process group, which a
        non-interactive bash answers by exiting, then SIGKILL for what
        ignores it. The next cell starts a fresh shell."""
        import signal

        for sig in (signal.SIGINT, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except OSError:
                pass
            try:
                self.proc.wait(timeout=1)
                break
            except Exception:
                pass
        self._reap()

    def _reap(self):
        code = 1
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                code = self.proc.wait(timeout=5)
            except Exception:
                self.proc.kill()
                code = self.proc.wait()
            if code < 0:
                code = 128 - code
            self.proc = None
        if self.status_r >= 0:
            os.close(self.status_r)
            self.status_r = -1
        return code

    def close(self):
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, 9)
            except OSError:
                pass
        self._reap()


def signal_of(err, status):
    """Names in an error event the signal that ended a context's process
    (a kernel, the shell, or a bash cell's last command), from its status
    as a shell gives it (128+n for signal n). The supervisor, which sees
    the sandbox's OOM kills, tells the memory limit's SIGKILL from others
    by it: the runner lives on when a kernel or a command is the victim."""
    if status > 128:
        err["signal"] = status - 128
    return err


def _shell_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


class Runtime:
    """State shared by the cells of one sandbox."""

    def __init__(self, channel):
        self.channel = channel
        self.default = PythonContext(None)
        self.module = self.default.module
        sys.modules["__main__"] = self.module
        # Code contexts by ID; "" is the default one.
        self.contexts = {"": self.default}
        self.execution_count = 0
        builtins.display = self.display
        # The matplotlib backend and user code reach the runtime here.
        rt = types.ModuleType("_vivarium_runtime")
        rt.display = self.display
        rt.flush_figures = self.flush_figures
        sys.modules["_vivarium_runtime"] = rt

    def emit_result(self, data, main=False):
        # What the code printed before this result goes out first: the
        # supervisor reads the output pipes up to this point before it
        # passes the result on, so a stream keeps the order of events.
        _flush_std()
        size = _size(data)
        if size > MAX_RESULT_BYTES and (CHART_MIME in data or DATA_MIME in data):
            # The description and the data go first: the result is still
            # shown.
            data = {k: v for k, v in data.items() if k not in (CHART_MIME, DATA_MIME)}
            size = _size(data)
        if size > MAX_RESULT_BYTES:
            data = {
                "text/plain": "[vivarium: result of about %d MiB dropped: over the %d MiB limit]"
                % (size >> 20, MAX_RESULT_BYTES >> 20)
            }
        self.channel.send({"type": "result", "data": data, "is_main_result": main}, wait_ack=True)

    def display(self, *objs, **kwargs):
        """Shows each object as a rich result, like IPython's display()."""
        raw = kwargs.get("raw", False)
        for obj in objs:
            if raw and isinstance(obj, dict):
                data = {k: _encode(k, v) for k, v in obj.items()}
                data = {k: v for k, v in data.items() if v is not None}
            else:
                data = mime_bundle(obj)
            self.emit_result(data)

    def flush_figures(self):
        """Emits every open matplotlib figure as a PNG and closes it."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            nums = plt.get_fignums()
        except Exception:
            return
        for num in nums:
            try:
                fig = plt.figure(num)
                data = {"text/plain": repr(fig), "image/png": _figure_png(fig)}
                _add_chart(data, fig)  # after drawing: tick labels exist then
                self.emit_result(data)
            except Exception as e:
                print("vivarium: could not render figure %s: %s" % (num, e), file=sys.stderr)
        try:
            plt.close("all")
        except Exception:
            pass

    def update_contexts(self, live, reset):
        """Drops the state of contexts that no longer exist or were
        restarted; they are made afresh when code next runs in them."""
        live, reset = set(live or ()), set(reset or ())
        for key in list(self.contexts):
            if key and (key not in live or key in reset):
                self.contexts.pop(key).close()
        if "" in reset:
            self.default.close()
            self.default = PythonContext(None)
            self.module = self.default.module
            self.contexts[""] = self.default
            sys.modules["__main__"] = self.module

    def context(self, key, language, cwd):
        ctx = self.contexts.get(key)
        if ctx is None or ctx.language != (language or "python"):
            if ctx is not None:
                ctx.close()
            if language == "bash":
                ctx = BashContext(cwd)
            elif language in ("javascript", "typescript", "r", "java"):
                ctx = _kernels().KernelContext(language, cwd, self.emit_result, _interrupts.wait_readable)
            else:
                ctx = PythonContext(cwd or os.getcwd())
            self.contexts[key] = ctx
        return ctx

    def run_cell(self, code, filename, env, key="", language="python", cwd=None):
        """Runs one cell in a context and returns (exit_code, error_event or
        None)."""
        self.execution_count += 1
        ctx = self.context(key, language, cwd)
        if ctx.language != "python":
            try:
                _interrupts.enter()
                return ctx.run(code, env)
            finally:
                _interrupts.open = False
                _flush_std()
        _forget_missing_path_entries()
        saved_env = {}
        for k, v in (env or {}).items():
            saved_env[k] = os.environ.get(k)
            os.environ[k] = v
        saved_cwd = None
        try:
            if ctx is not self.default:
                # Another namespace and working directory for the cell;
                # the default context's are back afterwards.
                try:
                    saved_cwd = os.getcwd()
                except OSError:
                    saved_cwd = None
                try:
                    os.chdir(ctx.cwd)
                except OSError as e:
                    return 1, _error_event(e)
                sys.modules["__main__"] = ctx.module
            return self._run(_prepare_cell(code), filename, ctx.module)
        finally:
            if ctx is not self.default:
                try:
                    ctx.cwd = os.getcwd()
                except OSError:
                    pass
                sys.modules["__main__"] = self.module
                if saved_cwd is not None:
                    try:
                        os.chdir(saved_cwd)
                    except OSError:
                        pass
            self.flush_figures()
            _flush_std()
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def _run(self, cell, filename, module):
        # Tracebacks show the cell as written; the Python run has as many
        # lines.
        linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
        ns = module.__dict__
        if not filename.startswith("<"):
            ns.setdefault("__file__", filename)
        if cell.cell_magic == "time":
            cells = _load("cells.py")
            cpu0, wall0 = cells.cpu_seconds(), _time.perf_counter()
            try:
                return self._run_python(cell.python, filename, ns)
            finally:
                cells.print_times(cpu0, wall0)
        return self._run_python(cell.python, filename, ns)

    def _run_python(self, code, filename, ns):
        try:
            # The syntax tree from compile and _ast, as ast.parse makes it:
            # the ast module's own imports (enum, contextlib ...) would
            # cost a runner that starts its own interpreter a few ms.
            tree = compile(code, filename, "exec", _ast.PyCF_ONLY_AST, dont_inherit=True)
            last = None
            if tree.body and isinstance(tree.body[-1], _ast.Expr):
                last = _ast.Expression(tree.body.pop().value)
            flags = getattr(_ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
            body = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
            expr = value = None
            if last is not None:
                expr = compile(last, filename, "eval", flags=flags, dont_inherit=True)
            try:
                _interrupts.enter()
                _await(eval(body, ns))
                if expr is not None:
                    value = _await(eval(expr, ns))
            finally:
                _interrupts.open = False
            if value is not None:
                ns["_"] = value
                self.emit_result(mime_bundle(value), main=True)
            return 0, None
        except SystemExit as e:
            return _exit_code(e), None
        except BaseException as e:
            return 1, _error_event(e)


def _load(filename):
    """A module of the runner's, loaded by its path: a file of the user's
    with the same name, first on sys.path, must not stand in for it."""
    name = "_vivarium_" + filename[:-3]
    mod = sys.modules.get(name)
    if mod is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(name, os.path.join(_RUNNER_DIR, filename))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[name] = mod
    return mod


def _kernels():
    return _load("kernels.py")


# IPython's cell syntax (cells.py). Most cells have none of it: only a cell
# with a line that starts with ! or % (or `x = !cmd`) loads cells.py.
_MAYBE_MAGIC = re.compile(r"^[ \t]*[!%]|=[ \t]*[!%]", re.M)
_MAGIC_NAME = "__vivarium_magics__"


class Cell:
    """A cell made ready to run: the Python to compile, the source that
    tracebacks show, and the cell magic that wraps it (or None)."""

    def __init__(self, python, source, cell_magic=None):
        self.python = python
        self.source = source
        self.cell_magic = cell_magic


def _prepare_cell(code):
    source = textwrap.dedent(code)
    if not _MAYBE_MAGIC.search(source):
        return Cell(source, source)
    try:
        cells = _load("cells.py")
        if not isinstance(getattr(builtins, _MAGIC_NAME, None), cells.Magics):
            setattr(builtins, _MAGIC_NAME, cells.Magics(_flush_std, _forget_missing_path_entries))
        return Cell(*cells.transform_cell(code))
    except Exception:  # never worse than running the code as it came
        return Cell(code, code)
# IPython's cell syntax. A cell is Python, plus what IPython adds: the

def _await(value):
    """Runs a cell that used top-level await."""
    if isinstance(value, types.CoroutineType):
        import asyncio

        return asyncio.run(value)
    return value


def _exit_code(e):
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else (256 + code) & 0xFF
    # sys.exit("message") prints the message and exits 1, as python3 does.
    print(code, file=sys.stderr)
    return 1


def _error_event(e):
    tb = e.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) in _OWN_FILES:
        tb = tb.tb_next
    try:
        import traceback  # only where code failed

        te = traceback.TracebackException(type(e), e, tb)
        # The magics' frames are the runner's: the user's code is what
        # the traceback shows.
        te.stack = traceback.StackSummary.from_list(
            [f for f in te.stack if os.path.abspath(f.filename) not in _OWN_FILES])
        text = "".join(te.format())
    except Exception:
        text = "%s\n" % type(e).__name__
    try:
        value = str(e)
    except Exception:
        value = "<unprintable %s>" % type(e).__name__
    return {"type": "error", "name": type(e).__name__, "value": value, "traceback": text}


def _flush_std():
    for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if f is not None:
                f.flush()
        except Exception:
            pass



def _forget_missing_path_entries():
    # A directory on sys.path that did not exist when an import first
    # searched it is remembered as having no finder (None) for good: the
    # packages installed into the sandbox since (PYTHONPATH's
    # /workspace/.packages) would stay invisible. Forgetting those entries
    # makes the next import look again.
    cache = sys.path_importer_cache
    for p in sys.path:
        if cache.get(p, 0) is None:
            del cache[p]


def prepare_environment():
    """What must hold before matplotlib is imported: once per interpreter
    (the zygote calls it before preloading)."""
    if _RUNNER_DIR not in sys.path:
        sys.path.append(_RUNNER_DIR)  # last: for the matplotlib backend only
    if os.environ.pop("VIVARIUM_FIXED_HASHSEED", None):
        # The sandbox's fixed seed was for this interpreter only (the
        # native backend's pausable sandboxes): its programs get random ones.
        os.environ.pop("PYTHONHASHSEED", None)
    os.environ.setdefault("MPLBACKEND", "module://vivarium_mpl_backend")
    os.environ.setdefault("MPLCONFIGDIR", "/tmp/matplotlib")
    _show_pil_images()


class _Viewer:
    """PIL's Image.show() displays the image as a result (there is no
    screen to open a viewer on), as in a notebook."""

    def show(self, image, **options):
        runtime = sys.modules.get("_vivarium_runtime")
        if runtime is None:
            return 0
        runtime.display(image)
        return 1


def _register_viewer(image_show):
    if not any(isinstance(v, _Viewer) for v in getattr(image_show, "_viewers", ())):
        image_show.register(_Viewer(), -1)


def _display_on_save(image_module):
    """Image.save(path) displays the image too, as E2B's code interpreter
    does (its SDK tests count on it); a save to a file object does not."""
    cls = image_module.Image
    save = cls.save
    if getattr(save, "_vivarium", False):
        return

    def save_and_display(self, fp, *args, **kwargs):
        result = save(self, fp, *args, **kwargs)
        # A library's own save (matplotlib writes its PNGs through PIL) is
        # not the code saving an image: its figure is shown on its own.
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith(("matplotlib", "PIL")):
            return result
        if isinstance(fp, (str, bytes, os.PathLike)):
            runtime = sys.modules.get("_vivarium_runtime")
            if runtime is not None:
                runtime.display(self)
        return result

    save_and_display._vivarium = True
    save_and_display.__doc__ = save.__doc__
    cls.save = save_and_display


# Done to a PIL module once it is loaded.
_PIL_HOOKS = {"PIL.ImageShow": _register_viewer, "PIL.Image": _display_on_save}


def _show_pil_images():
    """Hooks PIL's modules when they are loaded (PIL.ImageShow by
    Image.show()), or now for those that already are."""
    for name, hook in _PIL_HOOKS.items():
        if name in sys.modules:
            try:
                hook(sys.modules[name])
            except Exception:
                pass
    if not any(isinstance(f, _PILFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PILFinder())


class _PILFinder:
    """Loads a module of _PIL_HOOKS as the other finders would, then runs
    its hook."""

    def find_spec(self, name, path=None, target=None):
        hook = _PIL_HOOKS.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _PILFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = getattr(spec.loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_and_hook(module):
            exec_module(module)
            try:
                hook(module)
            except Exception:
                pass

        try:
            spec.loader.exec_module = exec_and_hook
        except AttributeError:
            pass
        return spec


def _prepare_interpreter():
    # User code sees its working directory first, as with `python3 file.py`.
    sys.path[0] = os.getcwd()
    prepare_environment()
    sys.argv = [""]
    for f in (sys.stdout, sys.stderr):
        try:
            f.reconfigure(line_buffering=True, errors="backslashreplace")
        except Exception:
            pass


def _first_to_go():
    """Makes the runner, and every process the code starts (they inherit
    it), the memory limit's victims before the sandbox's init: within its
    limit a sandbox of many small processes (a fork storm) had its init,
    the largest, killed by the OOM killer, and with it the whole sandbox.
    Raising one's own score needs no privilege."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")
    except OSError:
        pass


def _preload():
    """Imports the modules of VIVARIUM_PRELOAD, as the zygote does, for a
    native pausable sandbox: every such sandbox then starts with the same
    objects at the same addresses (its layout and hash seed are fixed),
    which its kept copies share with a reference image. The collector is
    kept away from them (gc.freeze), or its bookkeeping would rewrite
    their pages."""
    names = [m for m in os.environ.pop("VIVARIUM_PRELOAD", "").split(",") if m]
    if not names:
        return
    for name in names:
        try:
            __import__(name)
        except BaseException:
            pass
    if "matplotlib" in sys.modules:
        try:
            import matplotlib.pyplot  # noqa: F401
        except BaseException:
            pass
    gc.collect()
    gc.freeze()


def _confine():
    """A runner that init started itself in a restored sandbox of a
    zygote's (VIVARIUM_LANDLOCK) confines itself as the zygote confines
    its runners (landlock.py): every runner of such a sandbox is in a
    Landlock domain, whatever started it."""
    if os.environ.pop("VIVARIUM_LANDLOCK", "") != "1":
        return
    import landlock

    abi = landlock.abi()
    if abi:
        landlock.confine_to_root(abi)


def main(mode=None):
    """Serves requests until the supervisor closes the pipe (or, with
    "--oneshot", after one execution); returns the exit code."""
    if mode is None:
        mode = sys.argv[1] if len(sys.argv) > 1 else "--oneshot"
    _confine()
    _first_to_go()
    _interrupts.install()
    channel = Channel(3, 4)
    _prepare_interpreter()
    _preload()
    rt = Runtime(channel)
    channel.send({"type": "ready"})
    while True:
        # Under the channel's lock: a thread of the code waiting for a
        # result's ack reads the same pipe.
        with channel.lock:
            req = channel.receive(fresh=True)
        if req is None:
            return 0
        if req.get("type") == "contexts":
            rt.update_contexts(req.get("live"), req.get("reset"))
            continue
        if req.get("type") != "execute":
            continue
        try:
            code, err = rt.run_cell(req.get("code", ""), req.get("filename") or "<cell>", req.get("env"),
                                    req.get("context") or "", req.get("language") or "python", req.get("cwd") or None)
        except KeyboardInterrupt as e:
            # Raised as the cell's code ended, in the runner's code around
            # it: the cell was interrupted all the same.
            _interrupts.open = False
            code, err = 1, _error_event(e)
        if err is not None:
            channel.send(err)
        channel.send({"type": "done", "exit_code": code})
        if mode == "--oneshot":
            return code


def exit_now(code):
    """Ends the process as python3 would, in its order: non-daemon threads
    joined, atexit handlers run, standard streams flushed (a failure gives
    120) - but without tearing down every module. That teardown decrements
    every object's count, which in a process forked from a zygote copies
    every shared page: a hundred milliseconds for pandas, for nothing. As
    Python documents, __del__ of objects still alive at exit may not run."""
    try:
        threading._shutdown()
    except BaseException:
        pass
    import atexit

    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        try:
            if f is not None:
                f.flush()
        except Exception:
            code = 120
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())

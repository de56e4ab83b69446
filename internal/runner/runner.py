"""Vivarium's runner: executes code inside a sandbox the way a notebook cell runs.

It speaks to the supervisor over two pipes that the sandbox's init hands over
as file descriptors 3 (requests, read) and 4 (events, write). Each message is
a frame: a 4-byte big-endian length, then that many bytes of JSON. Code output
goes to the real stdout and stderr, which the supervisor captures separately,
so nothing user code prints can look like a protocol message.

Standard library only; it must start fast and run on any Python 3.8+.
"""

import ast
import base64
import builtins
import fcntl
import json
import linecache
import os
import re
import struct
import sys
import threading
import time as _time
import traceback
import types

_RUNNER_FILE = os.path.abspath(__file__)
_RUNNER_DIR = os.path.dirname(_RUNNER_FILE)

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

    def receive(self, _unpack=struct.unpack, _loads=json.loads):
        head = self._read_exact(4)
        if head is None:
            return None
        (n,) = _unpack(">I", head)
        body = self._read_exact(n)
        if body is None:
            return None
        return _loads(body)

    def send(self, event, wait_ack=False, _dumps=json.dumps, _pack=struct.pack, _write=os.write):
        body = _dumps(event, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
        frame = _pack(">I", len(body)) + body
        with self.lock:
            view = memoryview(frame)
            while view:
                n = _write(self.evt, view)
                view = view[n:]
            if wait_ack:
                # The supervisor reads the output pipes up to here before
                # it acknowledges: nothing printed after this result can
                # overtake it.
                while True:
                    req = self.receive()
                    if req is None or req.get("type") == "ack":
                        break


_json_loads = json.loads


def _encode(mime, value):
    """Makes a repr's value JSON-ready, or returns None to skip it."""
    if isinstance(value, tuple):  # (data, metadata), as IPython allows
        value = value[0] if value else None
    if value is None:
        return None
    if mime in _BINARY_MIME:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return base64.b64encode(bytes(value)).decode("ascii")
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


def _figure_png(fig):
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


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
    8601, NaN as null."""
    try:
        if df.size > MAX_DATA_CELLS:
            return
        split = _json_loads(df.to_json(orient="split", date_format="iso", default_handler=str))
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
            return code, {"type": "error", "name": "ExitCode", "value": str(code),
                          "traceback": "bash exited with status %d; its variables are gone\n" % code}
        try:
            code = int(line)
        except ValueError:
            code = 1
        if code != 0:
            return code, {"type": "error", "name": "ExitCode", "value": str(code),
                          "traceback": "the cell's last command exited with status %d\n" % code}
        return 0, None

    def _status_line(self):
        buf = b""
        while not buf.endswith(b"\n"):
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
        setattr(builtins, _MAGIC_NAME, _Magics(self))
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
                ctx = _kernels().KernelContext(language, cwd, self.emit_result)
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
                return ctx.run(code, env)
            finally:
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
            cpu0, wall0 = _cpu(), _time.perf_counter()
            try:
                return self._run_python(cell.python, filename, ns)
            finally:
                _print_times(cpu0, wall0)
        return self._run_python(cell.python, filename, ns)

    def _run_python(self, code, filename, ns):
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
            body = compile(tree, filename, "exec", flags=flags, dont_inherit=True)
            _await(eval(body, ns))
            if last is not None:
                expr = compile(last, filename, "eval", flags=flags, dont_inherit=True)
                value = _await(eval(expr, ns))
                if value is not None:
                    ns["_"] = value
                    self.emit_result(mime_bundle(value), main=True)
            return 0, None
        except SystemExit as e:
            return _exit_code(e), None
        except BaseException as e:
            return 1, _error_event(e)


def _kernels():
    """kernels.py, loaded by its path: a kernels.py of the user's, first on
    sys.path, must not stand in for it."""
    mod = sys.modules.get("_vivarium_kernels")
    if mod is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_vivarium_kernels", os.path.join(_RUNNER_DIR, "kernels.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["_vivarium_kernels"] = mod
    return mod
# IPython's cell syntax. A cell is Python, plus what IPython adds: the
# code may be indented as a whole (a template string in the caller's
# program), and a line may be a shell escape (!cmd, x = !cmd), a line
# magic (%cd, %env, %time, %pip ...) or, first in the cell, a cell magic
# (%%time, %%bash, %%writefile). Each such line becomes one line of Python
# that calls _Magics, so the cell keeps its line numbers, and a magic runs
# when its line is reached, as in IPython. Only lines that start a
# statement are read this way: never a line inside a string or brackets,
# where ! and % are text or operators.

_MAGIC_NAME = "__vivarium_magics__"
_MAGIC_LINE = re.compile(r"^([ \t]*)(!|%)(.*)$")
_MAYBE_MAGIC = re.compile(r"^[ \t]*[!%]|=[ \t]*[!%]", re.M)
_SHELL_ASSIGN = re.compile(r"^([ \t]*)([A-Za-z_][\w.]*)[ \t]*=[ \t]*([!%])(.*)$")


class UsageError(Exception):
    """A magic used wrongly, or one Vivarium does not have: IPython's
    name for it."""


class Cell:
    """A cell made ready to run: the Python to compile, the source that
    tracebacks show, and the cell magic that wraps it (or None)."""

    def __init__(self, python, source, cell_magic=None):
        self.python = python
        self.source = source
        self.cell_magic = cell_magic


def transform_cell(code):
    """Turns a cell written for IPython into Python (see above)."""
    import textwrap

    source = textwrap.dedent(code)
    lines = source.splitlines(True)
    first = next((i for i, l in enumerate(lines) if l.strip()), None)
    if first is not None and lines[first].lstrip().startswith("%%"):
        head = lines[first].strip()[2:]
        name, _, arg = head.partition(" ")
        body = "".join(lines[first + 1:])
        if name != "time":
            # The body is not Python: it is handed over whole.
            call = "%s.cell(%r, %r, %r)\n" % (_MAGIC_NAME, name, arg.strip(), body)
            return Cell("\n" * first + call, source)
        # %%time: the rest is a cell of its own, timed; the magic's line
        # stays, blank, so that line numbers do not move.
        lines[first] = "\n"
        return Cell(_transform_lines(lines), source, "time")
    if not _MAYBE_MAGIC.search(source):
        return Cell(source, source)
    return Cell(_transform_lines(lines), source)


def _transform_lines(lines):
    out = []
    quote = None  # the open triple quote a line continues, if any
    depth = 0  # open brackets
    continued = False  # the previous line ended in a backslash
    for line in lines:
        starts = quote is None and depth == 0 and not continued
        if starts:
            new = _magic_line(line)
            if new is not None:
                out.append(new)
                continue
        out.append(line)
        quote, depth, continued = _scan(line, quote, depth)
    return "".join(out)


def _magic_line(line):
    """The Python for a line that is a shell escape or a magic, or None."""
    end = "\n" if line.endswith("\n") else ""
    body = line.rstrip("\r\n")
    m = _SHELL_ASSIGN.match(body)
    if m:  # x = !cmd, x = %magic
        indent, target, sigil, rest = m.groups()
        if sigil == "!":
            return "%s%s = %s.getoutput(%r)%s" % (indent, target, _MAGIC_NAME, rest.strip(), end)
        name, _, arg = rest.partition(" ")
        if name and not name.startswith("%"):
            return "%s%s = %s.line(%r, %r)%s" % (indent, target, _MAGIC_NAME, name, arg.strip(), end)
        return None
    m = _MAGIC_LINE.match(body)
    if not m:
        return None
    indent, sigil, rest = m.groups()
    if sigil == "!":
        if rest.startswith("!"):  # !!cmd: its output as a list, as IPython's
            return "%s%s.getoutput(%r)%s" % (indent, _MAGIC_NAME, rest[1:].strip(), end)
        return "%s%s.system(%r)%s" % (indent, _MAGIC_NAME, rest.strip(), end)
    if rest.startswith("%"):
        return "%s%s.misplaced_cell_magic(%r)%s" % (indent, _MAGIC_NAME, rest[1:].split(" ")[0], end)
    name, _, arg = rest.partition(" ")
    if not name:
        return None
    return "%s%s.line(%r, %r)%s" % (indent, _MAGIC_NAME, name, arg.strip(), end)


def _scan(line, quote, depth):
    """Follows a line of Python far enough to know whether the next line
    starts a statement: the triple-quoted string and brackets left open,
    and a trailing backslash. Returns (quote, depth, continued)."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if quote is not None:
            if c == "\\":
                i += 2
                continue
            if line.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
            i += 1
            continue
        if c == "#":
            break
        if c in "\"'":
            if line.startswith(c * 3, i):
                quote = c * 3
                i += 3
                continue
            # A one-line string: skip to its end (or the line's).
            i += 1
            while i < n and line[i] != c and line[i] != "\n":
                i += 2 if line[i] == "\\" else 1
            i += 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(depth - 1, 0)
        i += 1
    stripped = line.rstrip("\r\n")
    continued = quote is None and stripped.endswith("\\") and not stripped.lstrip().startswith("#")
    return quote, depth, continued


def _expand(text, frame):
    """Expands {expression} and $name in a shell command with the cell's
    variables, as IPython does; what does not evaluate stays as written,
    and $$ is a literal $ for the shell."""
    ns = dict(frame.f_globals)
    ns.update(frame.f_locals)

    def brace(m):
        try:
            return str(eval(m.group(1), ns))
        except Exception:
            return m.group(0)

    def dollar(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return str(ns[name]) if name in ns else m.group(0)

    text = re.sub(r"\{([^{}]+)\}", brace, text)
    return re.sub(r"\$\$|\$([A-Za-z_]\w*)", dollar, text)


class SList(list):
    """The lines a command printed (x = !cmd), with IPython's shorthands."""

    @property
    def s(self):
        return " ".join(self)

    @property
    def n(self):
        return "\n".join(self)

    l = property(list)  # noqa: E741  (IPython's name)


def _cpu():
    """(user, system) CPU seconds of the process and its children; None
    on WASI, whose process clock does not count CPU seconds."""
    if sys.platform == "wasi":
        return None
    t = os.times()
    return t.user + t.children_user, t.system + t.children_system


def _fmt_seconds(s):
    for unit, scale in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if s >= 1.0 / scale or unit == "µs":
            return "%.3g %s" % (s * scale, unit)


def _print_times(cpu0, wall0):
    wall = _time.perf_counter() - wall0
    cpu = _cpu()
    if cpu is not None:
        user, sys_ = cpu[0] - cpu0[0], cpu[1] - cpu0[1]
        print("CPU times: user %s, sys: %s, total: %s" % (_fmt_seconds(user), _fmt_seconds(sys_), _fmt_seconds(user + sys_)))
    print("Wall time: %s" % _fmt_seconds(wall))


class _Magics:
    """What the lines of transform_cell call."""

    # Magics that only configure IPython's own display: nothing to do.
    _ACCEPTED = ("matplotlib", "config", "load_ext", "reload_ext", "autoreload")

    def __init__(self, runtime):
        self.runtime = runtime

    def _run_shell(self, cmd, frame, capture, expand=True):
        import subprocess

        if expand:
            cmd = _expand(cmd, frame)
        _flush_std()
        # Its own process group, so that an interrupt ends the command and
        # whatever it started; stderr joins stdout, as in IPython.
        p = subprocess.Popen(["/bin/bash", "-c", cmd], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            out, _ = p.communicate()
        except BaseException:
            import signal

            for sig in (signal.SIGINT, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                    p.wait(timeout=1)
                    break
                except Exception:
                    pass
            raise
        code = p.returncode if p.returncode >= 0 else 128 - p.returncode
        frame.f_globals["_exit_code"] = code
        return out

    def system(self, cmd):
        """!cmd: runs cmd in bash; its output is the cell's."""
        self._run_shell(cmd, sys._getframe(1), False)

    def getoutput(self, cmd, frame=None):
        """x = !cmd: the lines cmd printed."""
        out = self._run_shell(cmd, frame or sys._getframe(1), True)
        return SList(out.decode("utf-8", "replace").splitlines())

    def line(self, name, arg):
        f = getattr(self, "line_" + name, None)
        if f is not None:
            return f(arg, sys._getframe(1))
        if name in self._ACCEPTED:
            return None
        raise UsageError("Line magic function `%%%s` not found. Vivarium has %s; IPython's others are not available." % (
            name, ", ".join("%" + m[5:] for m in sorted(dir(self)) if m.startswith("line_"))))

    def misplaced_cell_magic(self, name):
        raise UsageError("the cell magic `%%%%%s` must be the cell's first line" % name)

    def cell(self, name, arg, body):
        f = getattr(self, "cell_" + name, None)
        if f is None:
            raise UsageError("Cell magic `%%%%%s` not found. Vivarium has %%%%time, %%%%bash, %%%%sh and %%%%writefile." % name)
        return f(arg, body, sys._getframe(1))

    # Line magics. Each takes its argument text and the caller's frame.

    def line_cd(self, arg, frame):
        path = os.path.expanduser(_expand(arg, frame).strip().strip("'\"") or "~")
        try:
            os.chdir(path)
        except OSError as e:
            raise UsageError("%%cd: %s: %s" % (path, e.strerror)) from None
        print(os.getcwd())

    def line_pwd(self, arg, frame):
        return os.getcwd()

    def line_env(self, arg, frame):
        arg = arg.strip()
        if not arg:
            return dict(os.environ)
        if "=" in arg or " " in arg:
            sep = "=" if "=" in arg and (" " not in arg or arg.index("=") < arg.index(" ")) else " "
            k, _, v = arg.partition(sep)
            k, v = k.strip(), _expand(v.strip(), frame)
            os.environ[k] = v
            print("env: %s=%s" % (k, v))
            return None
        return os.environ.get(arg)

    def line_time(self, arg, frame):
        """%time stmt: runs one statement and says how long it took; an
        expression's value is the line's."""
        try:
            code, mode = compile(arg, "<timed>", "eval"), "eval"
        except SyntaxError:
            code, mode = compile(arg, "<timed>", "exec"), "exec"
        cpu0, wall0 = _cpu(), _time.perf_counter()
        try:
            value = eval(code, frame.f_globals, frame.f_locals)
        finally:
            _print_times(cpu0, wall0)
        return value if mode == "eval" else None

    def line_timeit(self, arg, frame):
        import timeit

        t = timeit.Timer(arg, globals=dict(frame.f_globals, **frame.f_locals))
        number, _ = t.autorange()
        runs = [x / number for x in t.repeat(repeat=3, number=number)]
        mean = sum(runs) / len(runs)
        std = (sum((x - mean) ** 2 for x in runs) / len(runs)) ** 0.5
        print("%s ± %s per loop (mean ± std. dev. of %d runs, %d loops each)" % (
            _fmt_seconds(mean), _fmt_seconds(std), len(runs), number))

    def line_sx(self, arg, frame):
        return self.getoutput(arg, frame)

    line_system = line_sx

    def line_pip(self, arg, frame):
        """%pip install NAME...: from the server's package index when this
        sandbox may install packages; there is no other index to reach."""
        import shlex

        args = shlex.split(_expand(arg, frame))
        if not args or args[0] != "install":
            raise UsageError("%pip: only `%pip install NAME[==VERSION] ...` is available here")
        target = _PACKAGES_DIR
        if target not in os.environ.get("PYTHONPATH", "").split(":"):
            raise UsageError("%pip: this sandbox has no package index to install from. Vivarium sandboxes reach no "
                             "network by default; an operator allows packages with --package, and a sandbox created "
                             "with network packages enabled installs them (%pip, or the packages API).")
        cmd = ["/usr/bin/python3", "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
               "--no-cache-dir", "--only-binary=:all:", "--upgrade", "--target", target,
               "--index-url", _PACKAGE_INDEX, "--trusted-host", _PACKAGE_HOST] + args[1:]
        self._run_shell(" ".join(shlex.quote(c) for c in cmd), frame, False, expand=False)
        import importlib

        _forget_missing_path_entries()
        importlib.invalidate_caches()
        print("Note: you may need to restart the kernel to use updated packages.")

    def line_conda(self, arg, frame):
        raise UsageError("%conda: there is no conda in Vivarium sandboxes; %pip installs from the server's package "
                         "index where the sandbox may install packages")

    line_mamba = line_conda

    # Cell magics. Each takes its argument text, the body and the caller's
    # frame.

    def cell_bash(self, arg, body, frame):
        self._run_shell(body, frame, False, expand=False)

    cell_sh = cell_bash

    def cell_writefile(self, arg, body, frame):
        args = arg.split()
        append = "-a" in args or "--append" in args
        names = [a for a in args if not a.startswith("-")]
        if len(names) != 1:
            raise UsageError("%%writefile: give one file name (and -a to append)")
        path = os.path.expanduser(_expand(names[0], frame).strip("'\""))
        exists = os.path.exists(path)
        with open(path, "a" if append else "w", encoding="utf-8") as f:
            f.write(body)
        print("%s %s" % ("Appending to" if append else ("Overwriting" if exists else "Writing"), path))


# Where %pip installs, as the service's package installs do.
_PACKAGES_DIR = "/workspace/.packages"
_PACKAGE_HOST = "packages.vivarium.internal"
_PACKAGE_INDEX = "http://" + _PACKAGE_HOST + "/simple/"


def _prepare_cell(code):
    try:
        return transform_cell(code)
    except Exception:  # never worse than running the code as it came
        return Cell(code, code)


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
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == _RUNNER_FILE:
        tb = tb.tb_next
    try:
        te = traceback.TracebackException(type(e), e, tb)
        # The magics' frames are the runner's: the user's code is what
        # the traceback shows.
        te.stack = traceback.StackSummary.from_list(
            [f for f in te.stack if os.path.abspath(f.filename) != _RUNNER_FILE])
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


def main(mode=None):
    """Serves requests until the supervisor closes the pipe (or, with
    "--oneshot", after one execution); returns the exit code."""
    if mode is None:
        mode = sys.argv[1] if len(sys.argv) > 1 else "--oneshot"
    channel = Channel(3, 4)
    _prepare_interpreter()
    rt = Runtime(channel)
    channel.send({"type": "ready"})
    while True:
        # Under the channel's lock: a thread of the code waiting for a
        # result's ack reads the same pipe.
        with channel.lock:
            req = channel.receive()
        if req is None:
            return 0
        if req.get("type") == "contexts":
            rt.update_contexts(req.get("live"), req.get("reset"))
            continue
        if req.get("type") != "execute":
            continue
        code, err = rt.run_cell(req.get("code", ""), req.get("filename") or "<cell>", req.get("env"),
                                req.get("context") or "", req.get("language") or "python", req.get("cwd") or None)
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

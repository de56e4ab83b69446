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
import struct
import sys
import threading
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

    def _read_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = os.read(self.req, n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def receive(self):
        head = self._read_exact(4)
        if head is None:
            return None
        (n,) = struct.unpack(">I", head)
        body = self._read_exact(n)
        if body is None:
            return None
        return json.loads(body)

    def send(self, event, wait_ack=False):
        body = json.dumps(event, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
        frame = struct.pack(">I", len(body)) + body
        with self.lock:
            view = memoryview(frame)
            while view:
                n = os.write(self.evt, view)
                view = view[n:]
            if wait_ack:
                # The supervisor reads the output pipes up to here before
                # it acknowledges: nothing printed after this result can
                # overtake it.
                while True:
                    req = self.receive()
                    if req is None or req.get("type") == "ack":
                        break


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
                return json.loads(value)
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
    return data


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


def _size(data):
    """The bytes a result takes in its frame: encoded, not counted in
    characters (an emoji is four bytes, a control character six). A value
    JSON cannot encode (a circular one) raises, as sending it would."""
    return len(json.dumps(data, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))


class Runtime:
    """State shared by the cells of one sandbox."""

    def __init__(self, channel):
        self.channel = channel
        self.module = types.ModuleType("__main__")
        self.module.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = self.module
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
                self.emit_result({"text/plain": repr(fig), "image/png": _figure_png(fig)})
            except Exception as e:
                print("vivarium: could not render figure %s: %s" % (num, e), file=sys.stderr)
        try:
            plt.close("all")
        except Exception:
            pass

    def run_cell(self, code, filename, env):
        """Runs one cell and returns (exit_code, error_event or None)."""
        self.execution_count += 1
        saved_env = {}
        for k, v in (env or {}).items():
            saved_env[k] = os.environ.get(k)
            os.environ[k] = v
        try:
            return self._run(code, filename)
        finally:
            self.flush_figures()
            _flush_std()
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def _run(self, code, filename):
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        ns = self.module.__dict__
        if not filename.startswith("<"):
            ns.setdefault("__file__", filename)
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
        text = "".join(traceback.format_exception(type(e), e, tb))
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


def prepare_environment():
    """What must hold before matplotlib is imported: once per interpreter
    (the zygote calls it before preloading)."""
    if _RUNNER_DIR not in sys.path:
        sys.path.append(_RUNNER_DIR)  # last: for the matplotlib backend only
    os.environ.setdefault("MPLBACKEND", "module://vivarium_mpl_backend")
    os.environ.setdefault("MPLCONFIGDIR", "/tmp/matplotlib")


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
    import time as _t; t0=_t.perf_counter()
    channel.send({"type": "ready"})
    getattr(sys, "_ztrace", []).append("ready-send %.2fms" % ((_t.perf_counter()-t0)*1000))
    while True:
        # Under the channel's lock: a thread of the code waiting for a
        # result's ack reads the same pipe.
        with channel.lock:
            req = channel.receive()
        if req is None:
            return 0
        if req.get("type") != "execute":
            continue
        code, err = rt.run_cell(req.get("code", ""), req.get("filename") or "<cell>", req.get("env"))
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

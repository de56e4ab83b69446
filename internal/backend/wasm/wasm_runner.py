"""Vivarium's runner for the wasm backend.

It runs cells with runner.py's Runtime (the same notebook semantics as
every other backend) and speaks the same framed protocol, but over
/dev/vivarium, a device the host provides that can be opened once: this
runner opens it before any user code runs. The code's stdout and stderr
are WASI's own, so nothing printed can look like a frame; and the guest is
single-threaded, so output is delivered before any result that follows
it without an acknowledgement.

CPython on wasm32-wasi has no threads, processes, sockets or native
extensions. This runner turns each into an error that says so, instead of
an obscure one (a missing _socket, "can't start new thread").
"""

import errno
import importlib.abc
import json
import os
import struct
import sys
import types

# Bound now: user code may replace json.dumps, struct.pack or os.write in
# their modules, and must not break the protocol by doing so.
_dumps, _loads, _pack, _unpack = json.dumps, json.loads, struct.pack, struct.unpack
_read, _write = os.read, os.write

CHANNEL = "/dev/vivarium"
WORKSPACE = "/workspace"

_NO_NATIVE = ("the wasm backend runs CPython's standard library only: no native extensions "
              "and no third-party packages such as numpy or pandas (the native backend has them)")
# Standard modules a WASI build lacks, and why.
_MISSING = {
    "_ctypes": "the wasm backend cannot load native code (no ctypes)",
    "_multiprocessing": "the wasm backend cannot start processes",
    "_posixshmem": "the wasm backend cannot start processes or share memory",
    "_posixsubprocess": "the wasm backend cannot start processes",
    "_socket": "the wasm backend has no network (no sockets)",
    "_ssl": "the wasm backend has no network (no sockets, no TLS)",
    "fcntl": "the wasm backend has no file locking or fcntl",
    "mmap": "the wasm backend has no mmap",
    "grp": "the wasm backend has no users or groups",
    "pwd": "the wasm backend has no users or groups",
    "resource": "the wasm backend has no resource limits to query",
    "termios": "the wasm backend has no terminal",
    "readline": "the wasm backend has no terminal",
    "_curses": "the wasm backend has no terminal",
    "_tkinter": "the wasm backend has no display",
    "_sqlite3": "SQLite is not built for the wasm backend",
    "_lzma": "lzma is not built for the wasm backend (zlib is)",
    "_bz2": "bz2 is not built for the wasm backend (zlib is)",
    "_dbm": "dbm is not built for the wasm backend",
    "_gdbm": "dbm is not built for the wasm backend",
}
_NO_PROCESSES = ("the wasm backend cannot start processes: no subprocess, os.system, fork "
                 "or exec (the native backend can)")
_NO_THREADS = "the wasm backend has no threads (WebAssembly without threads; the native backend has them)"
_NO_SOCKETS = "the wasm backend has no network: sockets cannot be created"


class Channel:
    """The framed device to the supervisor, with runner.Channel's API."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)

    def _read_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = _read(self.fd, n - len(buf))
            if not chunk:
                return None
            buf += chunk
        return bytes(buf)

    def receive(self):
        head = self._read_exact(4)
        if head is None:
            return None
        (n,) = _unpack(">I", head)
        body = self._read_exact(n)
        if body is None:
            return None
        return _loads(body)

    def send(self, event, wait_ack=False):
        # No ack: output written before this frame has already reached
        # the host, which handles each write before the guest goes on.
        body = None
        if event.get("type") == "result" and _encoded[0] is event.get("data"):
            # Encoded once already, to be sized (see _size): a big result
            # is not encoded twice. Same bytes as json.dumps would give.
            body = b'{"type": "result", "data": ' + _encoded[1] + b', "is_main_result": ' + \
                (b"true" if event.get("is_main_result") else b"false") + b"}"
        _encoded[0] = _encoded[1] = None
        if body is None:
            body = _dumps(event, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
        view = memoryview(_pack(">I", len(body)) + body)
        while view:
            n = _write(self.fd, view)
            view = view[n:]


# The last result sized, and its encoding: (data, bytes).
_encoded = [None, None]


def _size(data):
    """runner._size, keeping the encoding for Channel.send."""
    body = _dumps(data, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass")
    _encoded[0], _encoded[1] = data, body
    return len(body)


class _MissingFinder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: a top-level module nothing else found gets a
    ModuleNotFoundError that says why the wasm backend lacks it."""

    def find_spec(self, name, path=None, target=None):
        if path is not None or "." in name:
            return None
        why = _MISSING.get(name, _NO_NATIVE)
        raise ModuleNotFoundError("No module named %r: %s" % (name, why), name=name)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: modules that exist but cannot work here are
    loaded as usual, then given clearer errors."""

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _MissingFinder):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        try:
            loader.exec_module = exec_and_patch
        except AttributeError:
            pass
        return spec


def _patch_subprocess(subprocess):
    init = subprocess.Popen.__init__

    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except OSError as e:
            if e.errno == errno.ENOTSUP:
                raise OSError(errno.ENOTSUP, _NO_PROCESSES) from None
            raise

    subprocess.Popen.__init__ = __init__


def _patch_socket(socket):
    init = socket.socket.__init__

    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except OSError as e:
            raise OSError(e.errno, _NO_SOCKETS) from None

    socket.socket.__init__ = __init__


_PATCHES = {"subprocess": _patch_subprocess, "socket": _patch_socket}


def _patch_threading():
    import threading

    start = threading.Thread.start

    def start_thread(self):
        try:
            start(self)
        except RuntimeError as e:
            if "can't start new thread" in str(e):
                raise RuntimeError("can't start new thread: " + _NO_THREADS) from None
            raise

    threading.Thread.start = start_thread


def _import_runner():
    # runner.py imports fcntl, which this build lacks, for the pipes of
    # its own Channel, unused here. A stand-in exists only while runner.py
    # is imported: user code still finds no fcntl.
    stub = "fcntl" not in sys.modules
    if stub:
        sys.modules["fcntl"] = types.ModuleType("fcntl")
    try:
        import runner
    finally:
        if stub:
            del sys.modules["fcntl"]
    return runner


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "--oneshot"
    # The channel first: from here on nothing else can open it.
    channel = Channel(CHANNEL)
    os.chdir(WORKSPACE)
    runner = _import_runner()
    runner._size = _size
    sys.meta_path.insert(0, _PatchingFinder())
    sys.meta_path.append(_MissingFinder())
    _patch_threading()
    runner._prepare_interpreter()
    rt = runner.Runtime(channel)
    channel.send({"type": "ready"})
    while True:
        req = channel.receive()
        if req is None:
            return runner, 0
        if req.get("type") != "execute":
            continue
        code, err = rt.run_cell(req.get("code", ""), req.get("filename") or "<cell>", req.get("env"))
        if err is not None:
            channel.send(err)
        channel.send({"type": "done", "exit_code": code})
        if mode == "--oneshot":
            return runner, code


if __name__ == "__main__":
    _runner, _code = main()
    _runner.exit_now(_code)

"""The client of Vivarium's HTTP API (``vivarium serve``), standard library only.

Objects mirror the API: a :class:`Client` creates :class:`Sandbox` objects,
which execute code (with streaming callbacks), run commands and move files.
"""

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request

from .errors import ConnectionFailed, VivariumError, from_response

DEFAULT_URL = "http://127.0.0.1:8080"

# Seconds allowed beyond an execution's own limit before the client gives
# up on the server's answer.
_GRACE = 30.0


class Result:
    """A rich result: the value of the last expression, a display() call or a
    figure. Binary formats (png, jpeg) are base64 text, as the API sends them;
    chart (a matplotlib figure described as data) and data (a DataFrame's
    columns) are decoded JSON."""

    FIELDS = ("text", "html", "png", "jpeg", "svg", "markdown", "latex", "json", "javascript", "chart", "data")

    def __init__(self, d):
        self.raw = d
        for f in self.FIELDS:
            setattr(self, f, d.get(f))
        self.is_main_result = bool(d.get("is_main_result"))

    def png_bytes(self):
        """The PNG image, decoded; None without one."""
        return base64.b64decode(self.png) if self.png else None

    def formats(self):
        return [f for f in self.FIELDS if getattr(self, f) is not None]

    def __repr__(self):
        return "Result(%s%s)" % (", ".join(self.formats()), ", main" if self.is_main_result else "")


class ExecutionError:
    """Why code failed: an exception with Python's traceback, or a limit."""

    def __init__(self, d):
        self.name = d.get("name", "")
        self.value = d.get("value", "")
        self.traceback = d.get("traceback", "")

    def __repr__(self):
        return "ExecutionError(%s: %s)" % (self.name, self.value)


class Execution:
    """The outcome of running code: what ``POST .../execute`` answers.

    ``status`` is "ok", "error", "timeout", "memory_limit", "killed" or
    "setup_failed"; a failing program is not an exception of the client.
    """

    def __init__(self, d):
        self.raw = d
        self.status = d.get("status")
        self.exit_code = d.get("exit_code")
        self.stdout = d.get("stdout", "")
        self.stderr = d.get("stderr", "")
        self.stdout_truncated = bool(d.get("stdout_truncated"))
        self.stderr_truncated = bool(d.get("stderr_truncated"))
        self.results = [Result(r) for r in d.get("results") or []]
        self.error = ExecutionError(d["error"]) if d.get("error") else None
        self.duration_ms = d.get("duration_ms")
        self.cpu_ms = d.get("cpu_ms")
        self.peak_memory_bytes = d.get("peak_memory_bytes")
        self.files = d.get("files") or []
        self.execution_count = d.get("execution_count")
        self.state_lost = bool(d.get("state_lost"))

    @property
    def ok(self):
        return self.status == "ok"

    @property
    def text(self):
        """The text of the main result (the last expression's value), if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    def __repr__(self):
        return "Execution(status=%r, stdout=%r, results=%r, error=%r)" % (
            self.status, self.stdout[:60], self.results, self.error)


class CommandResult:
    """How a shell command ended and what it printed."""

    def __init__(self, d):
        self.raw = d
        self.status = d.get("status")
        self.exit_code = d.get("exit_code")
        self.stdout = d.get("stdout", "")
        self.stderr = d.get("stderr", "")
        self.stdout_truncated = bool(d.get("stdout_truncated"))
        self.stderr_truncated = bool(d.get("stderr_truncated"))
        self.duration_ms = d.get("duration_ms")
        self.error = d.get("error") or None

    @property
    def ok(self):
        return self.status == "ok"

    def __repr__(self):
        return "CommandResult(exit_code=%r, stdout=%r)" % (self.exit_code, self.stdout[:60])


class Client:
    """A connection to a Vivarium server.

    ``url`` and ``api_key`` default to the environment's ``VIVARIUM_URL`` and
    ``VIVARIUM_API_KEY``; ``timeout`` bounds requests other than executions
    (which wait for their own limit plus a margin).
    """

    def __init__(self, url=None, api_key=None, timeout=60.0):
        self.url = (url or os.environ.get("VIVARIUM_URL") or DEFAULT_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("VIVARIUM_API_KEY", "")
        self.timeout = timeout

    # -- transport --------------------------------------------------------

    def _open(self, method, path, json_body=None, data=None, query=None, stream=False, timeout=None, headers=None):
        url = self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = dict(headers or {}, **{"User-Agent": "vivarium-python"})
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        if json_body is not None:
            data = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        elif data is not None:
            headers["Content-Type"] = "application/octet-stream"
        if stream:
            headers["Accept"] = "application/x-ndjson"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                body = json.loads(raw)
            except ValueError:
                body = {"error": {"message": raw.decode("utf-8", "replace").strip()}}
            raise from_response(e.code, body) from None
        except urllib.error.URLError as e:
            raise ConnectionFailed("cannot reach the Vivarium server at %s: %s (set VIVARIUM_URL)" % (self.url, e.reason)) from None
        except OSError as e:
            raise ConnectionFailed("connection to the Vivarium server at %s failed: %s" % (self.url, e)) from None

    def _call(self, method, path, json_body=None, query=None, timeout=None):
        with self._open(method, path, json_body=json_body, query=query, timeout=timeout) as resp:
            raw = resp.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise VivariumError("unexpected answer from the server: %r" % raw[:200]) from None

    def _stream(self, path, body, callbacks, timeout):
        """Sends body to a streaming endpoint, calls the callbacks for each
        event as it arrives, and returns the summary."""
        on_stdout, on_stderr, on_result, on_error = callbacks
        with self._open("POST", path, json_body=body, stream=True, timeout=timeout) as resp:
            for line in resp:
                line = line.strip()
                if not line:
                    continue
                ev = json.loads(line)
                kind = ev.get("type")
                if kind == "stdout" and on_stdout:
                    on_stdout(ev.get("text", ""))
                elif kind == "stderr" and on_stderr:
                    on_stderr(ev.get("text", ""))
                elif kind == "result" and on_result:
                    on_result(Result(ev.get("result") or {}))
                elif kind == "error" and on_error:
                    on_error(ExecutionError(ev.get("error") or {}))
                elif kind == "end":
                    if ev.get("error"):
                        err = ev["error"]
                        raise from_response(err.get("status", 500), {"error": err})
                    return ev.get("summary") or {}
        raise VivariumError("the server ended the stream without a summary")

    # -- API --------------------------------------------------------------

    def health(self):
        """True when the server answers /healthz."""
        return bool((self._call("GET", "/healthz") or {}).get("ok"))

    def create_sandbox(self, timeout_s=None, max_lifetime_s=None, limits=None, env=None, metadata=None,
                       backend=None, network=None, home=None, volumes=None, on_timeout=None, auto_resume=None,
                       pausable=None, from_snapshot=None, template=None):
        """Creates a stateful sandbox. ``timeout_s`` is its idle timeout;
        ``limits`` a dict of memory, cpu_time_s, timeout_s, pids, disk,
        max_output, cpus; ``backend`` one the server offers (native,
        gvisor, wasm; default: the server's); ``network`` a dict of allow
        (hosts, within the server's allowlist), all (True: all the server
        allows), deny (hosts and ranges refused all the same), except
        (exceptions to deny), packages (True: may install the server's
        allowed packages), max_bytes, rate, max_connections (default: no
        network; see Sandbox.set_network to change it later); ``home`` the
        user's home and working directory: "/workspace" (default) or
        "/home/user" (E2B's layout); ``volumes`` the key's volumes to
        mount, a dict {path in the sandbox: volume name, ID or Volume};
        ``on_timeout`` what the idle timeout does: "kill" (default) or
        "pause" (see Sandbox.pause); ``auto_resume`` True: a call on the
        paused sandbox resumes it first; ``pausable`` True: a sandbox that
        can be paused (native: its own Python, not a fork of the zygote,
        slower to create; on_timeout "pause" implies it); ``from_snapshot``
        a snapshot's id (Sandbox.snapshot): the new sandbox has its
        variables, files, limits and environment (limits, env, backend,
        home, network and volumes are then not given); ``template`` a
        template of the server's (an image of its store, e.g. "python:3"):
        the sandbox has its file system and Python instead of the
        server's."""
        body = {}
        for k, v in (("timeout_s", timeout_s), ("max_lifetime_s", max_lifetime_s), ("limits", limits),
                     ("env", env), ("metadata", metadata), ("backend", backend), ("network", network),
                     ("home", home), ("on_timeout", on_timeout), ("auto_resume", auto_resume),
                     ("pausable", pausable), ("from_snapshot", from_snapshot), ("template", template)):
            if v is not None:
                body[k] = v
        if volumes:
            body["volumes"] = [{"path": p, "name": v.id if isinstance(v, Volume) else v} for p, v in volumes.items()]
        info = self._call("POST", "/v1/sandboxes", body)
        return Sandbox(self, info)

    def sandbox(self, sandbox_id):
        """An existing sandbox of this key."""
        return Sandbox(self, self._call("GET", "/v1/sandboxes/" + _seg(sandbox_id)))

    def list_sandboxes(self):
        """This key's sandboxes, as the server describes them (dicts)."""
        return self._call("GET", "/v1/sandboxes")["sandboxes"]

    def create_volume(self, name, size=None):
        """Creates a persistent volume of ``size`` bytes (default: the
        server's); sandboxes mount it with create_sandbox(volumes=...)."""
        body = {"name": name}
        if size is not None:
            body["size"] = size
        return Volume(self, self._call("POST", "/v1/volumes", body))

    def volume(self, id_or_name):
        """An existing volume of this key, by ID or name."""
        return Volume(self, self._call("GET", "/v1/volumes/" + _seg(id_or_name)))

    def list_snapshots(self):
        """This key's snapshots (Sandbox.snapshot), newest first (dicts)."""
        return self._call("GET", "/v1/snapshots")["snapshots"]

    def delete_snapshot(self, snapshot_id):
        """Deletes one of this key's snapshots; given a name, every
        snapshot of that name."""
        self._call("DELETE", "/v1/snapshots/" + _seg(snapshot_id))

    def list_volumes(self):
        """This key's volumes, as the server describes them (dicts)."""
        return self._call("GET", "/v1/volumes")["volumes"]

    def run(self, code, files=None, limits=None, timeout_s=None, env=None,
            on_stdout=None, on_stderr=None, on_result=None, on_error=None, backend=None, network=None,
            template=None):
        """Runs code in a fresh sandbox destroyed afterwards. ``files`` maps
        workspace paths to bytes or str, placed there first; ``backend`` is
        one the server offers (default: the server's); ``network`` and
        ``template`` as for create_sandbox."""
        body = {"code": code}
        if files:
            body["files"] = {k: base64.b64encode(v.encode() if isinstance(v, str) else v).decode() for k, v in files.items()}
        if limits:
            body["limits"] = limits
        if timeout_s:
            body["timeout_s"] = timeout_s
        if env:
            body["env"] = env
        if backend:
            body["backend"] = backend
        if network:
            body["network"] = network
        if template:
            body["template"] = template
        wait = (timeout_s or (limits or {}).get("timeout_s") or 30) + _GRACE
        callbacks = (on_stdout, on_stderr, on_result, on_error)
        if any(callbacks):
            return Execution(self._stream("/v1/execute", body, callbacks, wait))
        return Execution(self._call("POST", "/v1/execute", body, timeout=wait))


class Sandbox:
    """A stateful sandbox: Python state and files kept between executions,
    like a notebook kernel. Use it as a context manager to close it."""

    def __init__(self, client, info):
        self.client = client
        self.info = info
        self.id = info["id"]
        self.files = Files(self)
        self.commands = Commands(self)

    def _path(self, suffix=""):
        return "/v1/sandboxes/" + _seg(self.id) + suffix

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return "Sandbox(%r)" % self.id

    def refresh(self):
        """Fetches the sandbox's description again (state, expiry, count)."""
        self.info = self.client._call("GET", self._path())
        return self.info

    def metrics(self, start=None, end=None):
        """The sandbox's CPU, memory and disk over time, oldest first (one
        sample every 5 s on the server, the last taken now): a list of dicts
        with time, cpu_count, cpu_used_pct, mem_used, mem_total, disk_used and
        disk_total. start and end, in Unix seconds, bound it."""
        query = {k: int(v) for k, v in (("start", start), ("end", end)) if v is not None}
        return self.client._call("GET", self._path("/metrics"), query=query or None)["samples"]

    def pause(self):
        """Pauses the sandbox: its processes' state (variables, imports,
        open files, background processes) is saved to disk on the server
        and their memory freed; calls on it then raise SandboxPausedError
        until resume(). The native backend (with CRIU) and the gvisor one
        can; others raise ServerUnavailableError. Returns the sandbox's description."""
        self.info = self.client._call("POST", self._path("/pause"))
        return self.info

    def fork(self, count=1, same_random_state=False):
        """Copies of this running sandbox, at this moment: count new
        Sandboxes, each of its own (its variables, files and processes as
        this one's, then apart). Each reseeds Python's and numpy's random
        generators unless same_random_state. Sandboxes that can be paused
        (native, with CRIU; gvisor)."""
        out = self.client._call("POST", self._path("/fork"), {"count": count, "same_random_state": same_random_state})
        return [Sandbox(self.client, info) for info in out["sandboxes"]]

    def snapshot(self, name=None):
        """Saves this running sandbox as a snapshot on the server (its
        variables, files and processes), which outlives the sandbox and a
        restart of the server; the sandbox goes on. Returns the
        snapshot's description (a dict: id, size_bytes ...), for
        create_sandbox(from_snapshot=id). With ``name`` (lowercase
        letters, digits, '.', '_', '-'), from_snapshot takes the name
        too: the newest snapshot of that name. Sandboxes that can be
        paused (native, with CRIU; gvisor)."""
        body = {"name": name} if name is not None else None
        return self.client._call("POST", self._path("/snapshots"), body)

    def resume(self):
        """Resumes a paused sandbox where it was paused."""
        self.info = self.client._call("POST", self._path("/resume"))
        return self.info

    def set_timeout(self, timeout_s):
        """Sets the idle timeout to timeout_s seconds from now."""
        self.info = self.client._call("POST", self._path("/timeout"), {"timeout_s": timeout_s})
        return self.info

    def set_network(self, network):
        """Replaces what this running sandbox may reach: ``network`` is a
        dict as create_sandbox takes (allow, all, deny, except), granted
        anew within the server's allowlist (replaced, not merged: {} takes
        everything away) and applied to its connections at once. Packages
        and limits stay as created. Raises NotAllowedError for more than
        the server allows, or for a sandbox created without network."""
        self.info = self.client._call("PUT", self._path("/network"), network or {})
        return self.info

    def execute(self, code, timeout_s=None, cpu_time_s=None, env=None,
                on_stdout=None, on_stderr=None, on_result=None, on_error=None, context=None):
        """Runs code, keeping state. With any callback the output streams:
        each is called as events arrive (on_stdout(text), on_stderr(text),
        on_result(Result), on_error(ExecutionError)). context is a code
        context's ID, or a language ("javascript", "r" ...) for its default
        context; by default the code is Python. Returns the Execution."""
        body = {"code": code}
        if context:
            body["context"] = context
        if timeout_s:
            body["timeout_s"] = timeout_s
        if cpu_time_s:
            body["cpu_time_s"] = cpu_time_s
        if env:
            body["env"] = env
        limit = timeout_s or (self.info.get("limits") or {}).get("timeout_s") or 30
        callbacks = (on_stdout, on_stderr, on_result, on_error)
        if any(callbacks):
            return Execution(self.client._stream(self._path("/execute"), body, callbacks, limit + _GRACE))
        return Execution(self.client._call("POST", self._path("/execute"), body, timeout=limit + _GRACE))

    def create_context(self, language="python", cwd=None):
        """Creates a code context with state of its own: language is
        python, bash, javascript, typescript, r or java; cwd the directory
        its code starts in. Returns its description (id, language, cwd)."""
        body = {"language": language}
        if cwd:
            body["cwd"] = cwd
        return self.client._call("POST", self._path("/contexts"), body)

    def contexts(self):
        """Lists the code contexts, the default ones first."""
        return self.client._call("GET", self._path("/contexts"))["contexts"]

    def restart_context(self, context_id):
        """Forgets a context's state (its variables, its process)."""
        self.client._call("POST", self._path("/contexts/" + _seg(context_id) + "/restart"))

    def remove_context(self, context_id):
        """Removes a code context."""
        self.client._call("DELETE", self._path("/contexts/" + _seg(context_id)))

    def install(self, name, version=None):
        """Installs one of the server's allowed packages into this sandbox
        (created with network={"packages": True}); importable at once.
        Returns the server's answer (status, output); raises
        NotAllowedError for a package not on the server's list, and
        VivariumError when pip fails."""
        from .errors import VivariumError
        body = {"name": name}
        if version:
            body["version"] = version
        res = self.client._call("POST", self._path("/packages"), body, timeout=300 + _GRACE)
        if res.get("status") != "ok":
            raise VivariumError("installing %s failed: %s" % (name, res.get("error") or res.get("output")))
        return res

    def port(self, port):
        """A token and the URLs that open one port of this sandbox (a
        server its code started) from outside: a dict with ``token``,
        ``path_url`` and, when the server has a --domain, ``host`` and
        ``url`` (a link for a browser). The token opens that port of this
        sandbox only."""
        return self.client._call("POST", self._path("/ports/%d" % int(port)))

    def fetch(self, port, path="/", method="GET", data=None, headers=None, timeout=None):
        """Sends one HTTP request to the sandbox's server on ``port``
        through the API and returns ``(status, headers, body)``: the
        server's answer, whatever its status. Raises the client's errors
        when the request does not reach it (nothing listens on the port:
        VivariumError with code ``port_closed``)."""
        token = self.port(port)["token"]
        url = "%s%s/ports/%d/%s" % (self.client.url, self._path(), int(port), path.lstrip("/"))
        hdrs = dict(headers or {})
        hdrs["Vivarium-Port-Token"] = token
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.client.timeout) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            if e.headers.get("Content-Security-Policy", "").startswith("sandbox"):
                return e.code, dict(e.headers), raw  # the sandbox's own answer
            try:
                body = json.loads(raw)
            except ValueError:
                body = {"error": {"message": raw.decode("utf-8", "replace").strip()}}
            raise from_response(e.code, body) from None

    def interrupt(self):
        """Raises KeyboardInterrupt in the running execution, if any."""
        self.client._call("POST", self._path("/interrupt"))

    def restart(self):
        """A fresh Python process: variables and imports are lost, files kept."""
        self.client._call("POST", self._path("/restart"))

    def close(self):
        """Closes the sandbox; closing one already gone is not an error."""
        from .errors import NotFoundError
        try:
            self.client._call("DELETE", self._path())
        except NotFoundError:
            pass


class Commands:
    """Shell commands in a sandbox, beside its Python state."""

    def __init__(self, sandbox):
        self._sb = sandbox

    def run(self, cmd, cwd=None, env=None, timeout_s=None, on_stdout=None, on_stderr=None, user=None):
        """Runs cmd with /bin/sh -c; streams output to the callbacks if given.
        ``user`` is "user" (default) or "root", the sandbox's own root,
        without any capability."""
        body = {"cmd": cmd}
        if user:
            body["user"] = user
        if cwd:
            body["cwd"] = cwd
        if env:
            body["env"] = env
        if timeout_s:
            body["timeout_s"] = timeout_s
        wait = (timeout_s or 30) + _GRACE
        path = self._sb._path("/commands")
        if on_stdout or on_stderr:
            return CommandResult(self._sb.client._stream(path, body, (on_stdout, on_stderr, None, None), wait))
        return CommandResult(self._sb.client._call("POST", path, body, timeout=wait))


class Volume:
    """A persistent volume: files kept across sandboxes and server restarts,
    mounted by any number of this key's sandboxes at once. ``files`` reads
    and writes them without a sandbox."""

    def __init__(self, client, info):
        self.client = client
        self.info = info
        self.id = info["id"]
        self.name = info["name"]
        self.files = Files(self)

    def _path(self, suffix=""):
        return "/v1/volumes/" + _seg(self.id) + suffix

    def __repr__(self):
        return "Volume(%r, %r)" % (self.id, self.name)

    def delete(self):
        """Deletes the volume and its files (VolumeInUseError while a live
        sandbox mounts it)."""
        self.client._call("DELETE", self._path())


class Files:
    """The sandbox's workspace (or a volume's files). Paths are relative to
    it; the server refuses anything that would leave it."""

    def __init__(self, sandbox):
        self._sb = sandbox

    def _path(self, name):
        return self._sb._path("/files/" + urllib.parse.quote(name, safe="/"))

    def write(self, path, data, metadata=None):
        """Creates or replaces a file (bytes, or str written as UTF-8).
        metadata (a dict of str) is kept with the file, as its extended
        attributes; keys are lower-cased."""
        if isinstance(data, str):
            data = data.encode()
        headers = {"X-Metadata-" + k: v for k, v in (metadata or {}).items()}
        with self._sb.client._open("PUT", self._path(path), data=data, headers=headers) as resp:
            return json.loads(resp.read())

    def read(self, path):
        """The file's content, as bytes."""
        with self._sb.client._open("GET", self._path(path)) as resp:
            return resp.read()

    def metadata(self, path):
        """The file's metadata, a dict (empty: none)."""
        with self._sb.client._open("HEAD", self._path(path)) as resp:
            prefix = "x-metadata-"
            return {k[len(prefix):].lower(): v for k, v in resp.headers.items() if k.lower().startswith(prefix)}

    def read_text(self, path, encoding="utf-8"):
        return self.read(path).decode(encoding)

    def list(self, path=".", depth=1):
        """Entries of a directory (dicts: path, name, size, type, modified)."""
        return self._sb.client._call("GET", self._sb._path("/files"), query={"path": path, "depth": depth})["entries"]

    def remove(self, path):
        """Deletes a file or a directory tree."""
        self._sb.client._call("DELETE", self._path(path))


def _seg(s):
    return urllib.parse.quote(str(s), safe="")

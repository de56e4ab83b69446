"""IPython's cell syntax for Vivarium's runner (runner.py loads this module
the first time a cell may use it, by its path).

code may be indented as a whole (a template string in the caller's
program), and a line may be a shell escape (!cmd, x = !cmd), a line
magic (%cd, %env, %time, %pip ...) or, first in the cell, a cell magic
(%%time, %%bash, %%writefile). Each such line becomes one line of Python
that calls _Magics, so the cell keeps its line numbers, and a magic runs
when its line is reached, as in IPython. Only lines that start a
statement are read this way: never a line inside a string or brackets,
where ! and % are text or operators.
"""

import os
import re
import sys
import time as _time


MAGIC_NAME = "__vivarium_magics__"
_MAGIC_LINE = re.compile(r"^([ \t]*)(!|%)(.*)$")
_SHELL_ASSIGN = re.compile(r"^([ \t]*)([A-Za-z_][\w.]*)[ \t]*=[ \t]*([!%])(.*)$")


class UsageError(Exception):
    """A magic used wrongly, or one Vivarium does not have: IPython's
    name for it."""


def transform_cell(code):
    """Turns a cell written for IPython into Python (see above): the Python
    to compile, the source that tracebacks show, and the cell magic that
    wraps it (None, or "time")."""
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
            call = "%s.cell(%r, %r, %r)\n" % (MAGIC_NAME, name, arg.strip(), body)
            return "\n" * first + call, source, None
        # %%time: the rest is a cell of its own, timed; the magic's line
        # stays, blank, so that line numbers do not move.
        lines[first] = "\n"
        return _transform_lines(lines), source, "time"
    return _transform_lines(lines), source, None


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
            return "%s%s = %s.getoutput(%r)%s" % (indent, target, MAGIC_NAME, rest.strip(), end)
        name, _, arg = rest.partition(" ")
        if name and not name.startswith("%"):
            return "%s%s = %s.line(%r, %r)%s" % (indent, target, MAGIC_NAME, name, arg.strip(), end)
        return None
    m = _MAGIC_LINE.match(body)
    if not m:
        return None
    indent, sigil, rest = m.groups()
    if sigil == "!":
        if rest.startswith("!"):  # !!cmd: its output as a list, as IPython's
            return "%s%s.getoutput(%r)%s" % (indent, MAGIC_NAME, rest[1:].strip(), end)
        return "%s%s.system(%r)%s" % (indent, MAGIC_NAME, rest.strip(), end)
    if rest.startswith("%"):
        return "%s%s.misplaced_cell_magic(%r)%s" % (indent, MAGIC_NAME, rest[1:].split(" ")[0], end)
    name, _, arg = rest.partition(" ")
    if not name:
        return None
    return "%s%s.line(%r, %r)%s" % (indent, MAGIC_NAME, name, arg.strip(), end)


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


def cpu_seconds():
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


def print_times(cpu0, wall0):
    wall = _time.perf_counter() - wall0
    cpu = cpu_seconds()
    if cpu is not None:
        user, sys_ = cpu[0] - cpu0[0], cpu[1] - cpu0[1]
        print("CPU times: user %s, sys: %s, total: %s" % (_fmt_seconds(user), _fmt_seconds(sys_), _fmt_seconds(user + sys_)))
    print("Wall time: %s" % _fmt_seconds(wall))


class Magics:
    """What the lines of transform_cell call."""

    # Magics that only configure IPython's own display: nothing to do.
    _ACCEPTED = ("matplotlib", "config", "load_ext", "reload_ext", "autoreload")

    def __init__(self, flush_std, forget_missing_path_entries):
        # The runner's: flush what the code printed before a command
        # prints; let imports see directories %pip just made.
        self.flush_std = flush_std
        self.forget_missing_path_entries = forget_missing_path_entries

    def _run_shell(self, cmd, frame, capture, expand=True):
        import subprocess

        if expand:
            cmd = _expand(cmd, frame)
        self.flush_std()
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
        cpu0, wall0 = cpu_seconds(), _time.perf_counter()
        try:
            value = eval(code, frame.f_globals, frame.f_locals)
        finally:
            print_times(cpu0, wall0)
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

        self.forget_missing_path_entries()
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

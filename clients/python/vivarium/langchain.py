"""A LangChain tool that runs the model's Python in a Vivarium sandbox.

    from vivarium.langchain import VivariumPythonTool   # imports langchain-core here
    tool = VivariumPythonTool()                         # VIVARIUM_URL, VIVARIUM_API_KEY
    agent = create_react_agent(model, [tool])
    ...
    tool.close()                                        # the sandbox it kept

The tool keeps one sandbox across calls (variables, imports and files stay,
as in a notebook), created on first use. It answers with text for the model
and, as the tool message's artifact, the images the code drew.

langchain-core is imported only when ``VivariumPythonTool`` is first used:
importing this module, or using :class:`PythonCodeInterpreter` (the tool's
logic, framework-free), never needs it.
"""

from .client import Client

NAME = "python_code_interpreter"

DESCRIPTION = (
    "Runs Python 3 code in an isolated sandbox and returns what it printed, the value of its "
    "last line, and any error with its traceback. Use it to compute, analyse data and draw "
    "charts. The input is Python code. print() every value you need to see: nothing else is "
    "shown. Variables, imports and files are kept between calls. Save files under the working "
    "directory /workspace (for example 'results.csv' or 'chart.png'). Charts drawn with "
    "matplotlib are returned as images. numpy, pandas and matplotlib can be imported; there is "
    "no network access and packages cannot be installed."
)

CODE_DESCRIPTION = "Python 3 code to run. print() the values you need to see."

# Bytes of each text section the model gets back; the rest is dropped with
# a note, which tells the model to print less.
MAX_TEXT = 20000


def _truncate(s, limit, what):
    if len(s) <= limit:
        return s
    head, tail = limit // 2, limit - limit // 2
    return "%s\n[... %d characters of %s dropped; print less ...]\n%s" % (s[:head], len(s) - head - tail, what, s[-tail:])


class PythonCodeInterpreter:
    """What the tool does, without LangChain: run code, answer with text for
    the model and a list of image artifacts.

    ``stateful`` keeps one sandbox across calls (created on first use,
    replaced if it expired); otherwise every call runs in a fresh one.
    """

    def __init__(self, client=None, stateful=True, timeout_s=None, sandbox_timeout_s=None, max_text=MAX_TEXT):
        self.client = client or Client()
        self.stateful = stateful
        self.timeout_s = timeout_s
        self.sandbox_timeout_s = sandbox_timeout_s
        self.max_text = max_text
        self.sandbox = None

    def _execute(self, code):
        from .errors import NotFoundError
        if not self.stateful:
            return self.client.run(code, timeout_s=self.timeout_s)
        if self.sandbox is None:
            self.sandbox = self.client.create_sandbox(timeout_s=self.sandbox_timeout_s)
        try:
            return self.sandbox.execute(code, timeout_s=self.timeout_s)
        except NotFoundError:
            # Expired while the model was thinking: a new one, and say so.
            self.sandbox = self.client.create_sandbox(timeout_s=self.sandbox_timeout_s)
            ex = self.sandbox.execute(code, timeout_s=self.timeout_s)
            ex.state_lost = True
            return ex

    def run(self, code):
        """Runs code; returns (content, artifact): the text for the model and
        a list of images as {"type": "image", "mime_type", "data" (base64)}."""
        ex = self._execute(code)
        parts, images = [], []
        if ex.stdout:
            parts.append(_truncate(ex.stdout, self.max_text, "output"))
        if ex.stderr:
            parts.append("stderr:\n" + _truncate(ex.stderr, self.max_text, "stderr"))
        if ex.stdout_truncated or ex.stderr_truncated:
            parts.append("[the sandbox dropped output past its limit]")
        for r in ex.results:
            if r.png or r.jpeg:
                images.append({"type": "image", "mime_type": "image/png" if r.png else "image/jpeg", "data": r.png or r.jpeg})
            elif r.text:
                parts.append(_truncate(r.text, self.max_text, "the result"))
        if images:
            parts.append("[%d image%s returned to the user]" % (len(images), "" if len(images) == 1 else "s"))
        if ex.error is not None and not ex.ok:
            if ex.error.traceback:
                parts.append(_truncate(ex.error.traceback.rstrip("\n"), self.max_text, "the traceback"))
            else:
                parts.append("%s: %s" % (ex.error.name, ex.error.value))
        if ex.state_lost:
            parts.append("[note: the sandbox was restarted: variables and imports from earlier calls are gone]")
        if not parts:
            parts.append("(no output: print() the values you want to see)")
        return "\n".join(parts), images

    def close(self):
        """Closes the sandbox kept across calls."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None


_tool_class = None


def _build_tool_class():
    """Defines VivariumPythonTool as a LangChain BaseTool, importing
    langchain-core (and pydantic, which it depends on) now."""
    try:
        from langchain_core.tools import BaseTool
    except ImportError as e:
        raise ImportError("VivariumPythonTool needs langchain-core: pip install langchain-core "
                          "(vivarium.langchain.PythonCodeInterpreter works without it)") from e
    from typing import Any, Optional

    namespace = {
        "__module__": __name__,
        "__doc__": "LangChain tool: runs the model's Python in a Vivarium sandbox; images come back as the artifact.",
        "__annotations__": {"name": str, "description": str, "response_format": str,
                            "client": Any, "stateful": bool, "timeout_s": Optional[float], "interpreter": Any},
        "name": NAME,
        "description": DESCRIPTION,
        "response_format": "content_and_artifact",
        "client": None,
        "stateful": True,
        "timeout_s": None,
        "interpreter": None,
        "_run": _run,
        "_arun": _arun,
        "close": _close,
    }
    try:
        from pydantic import BaseModel, Field
    except ImportError:  # langchain-core always brings pydantic; only stand-ins lack it
        pass
    else:
        schema = type("PythonCodeInput", (BaseModel,), {
            "__module__": __name__,
            "__annotations__": {"code": str},
            "code": Field(description=CODE_DESCRIPTION),
        })
        namespace["__annotations__"]["args_schema"] = Any
        namespace["args_schema"] = schema
    return type("VivariumPythonTool", (BaseTool,), namespace)


def _interpreter(tool):
    if tool.interpreter is None:
        tool.interpreter = PythonCodeInterpreter(client=tool.client, stateful=tool.stateful, timeout_s=tool.timeout_s)
    return tool.interpreter


def _run(self, code, run_manager=None, **kwargs):
    return _interpreter(self).run(code)


async def _arun(self, code, run_manager=None, **kwargs):
    import asyncio
    return await asyncio.get_running_loop().run_in_executor(None, _interpreter(self).run, code)


def _close(self):
    if self.interpreter is not None:
        self.interpreter.close()


def __getattr__(name):
    # PEP 562: the class (and langchain-core with it) comes into being on
    # first use, so that importing vivarium never needs LangChain.
    global _tool_class
    if name == "VivariumPythonTool":
        if _tool_class is None:
            _tool_class = _build_tool_class()
        return _tool_class
    raise AttributeError("module %r has no attribute %r" % (__name__, name))

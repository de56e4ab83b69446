"""The LangChain tool, tested without LangChain.

langchain-core cannot be installed on the machines that run these tests (no
PyPI), so the tool's behaviour is tested through PythonCodeInterpreter (all
of its logic, against a real server), and the LangChain class is built over
a stand-in BaseTool that calls _run the way BaseTool.run does for a tool
with response_format "content_and_artifact". When langchain-core is
installed, the last test uses the real one instead.
"""

import base64
import importlib
import os
import sys
import types
import unittest

import vivarium
from vivarium import langchain as vlc

SERVER = os.environ.get("VIVARIUM_URL")


def fresh():
    """vivarium.langchain imported anew, so that the tool class is built
    against whatever langchain_core is in sys.modules now."""
    sys.modules.pop("vivarium.langchain", None)
    return importlib.import_module("vivarium.langchain")


def real_langchain():
    try:
        import langchain_core.tools  # noqa: F401
        return True
    except ImportError:
        return False


class FakeBaseTool:
    """What the tool relies on from langchain_core.tools.BaseTool: keyword
    construction of fields, and run() calling _run with the tool's input,
    returning the content and keeping the artifact."""

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)

    def run(self, tool_input):
        args = tool_input if isinstance(tool_input, dict) else {"code": tool_input}
        out = self._run(**args)
        if self.response_format == "content_and_artifact":
            content, self.last_artifact = out
            return content
        return out


class LazyImportTest(unittest.TestCase):

    def test_importing_does_not_import_langchain(self):
        for m in [m for m in sys.modules if m.startswith("langchain_core")]:
            del sys.modules[m]
        fresh()
        self.assertNotIn("langchain_core", sys.modules)

    @unittest.skipIf(real_langchain(), "langchain-core is installed here")
    def test_missing_langchain_is_a_clear_import_error(self):
        mod = fresh()
        with self.assertRaises(ImportError) as cm:
            mod.VivariumPythonTool
        self.assertIn("pip install langchain-core", str(cm.exception))
        self.assertIn("PythonCodeInterpreter", str(cm.exception))

    def test_description_tells_the_model_what_to_do(self):
        d = vlc.DESCRIPTION
        for phrase in ("print()", "/workspace", "kept between calls", "images"):
            self.assertIn(phrase, d)
        self.assertEqual(vlc.NAME, "python_code_interpreter")


@unittest.skipUnless(SERVER, "needs a server: run through go test ./test/pyclient")
class InterpreterTest(unittest.TestCase):

    def setUp(self):
        self.interp = vlc.PythonCodeInterpreter(client=vivarium.Client())
        self.addCleanup(self.interp.close)

    def test_prints_values_and_keeps_state(self):
        content, artifact = self.interp.run("data = [3, 1, 2]\nprint(sorted(data))")
        self.assertEqual(content, "[1, 2, 3]\n")
        self.assertEqual(artifact, [])
        content, _ = self.interp.run("sum(data)")
        self.assertEqual(content, "6")

    def test_chart_is_an_artifact(self):
        content, artifact = self.interp.run(
            "import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [1, 2])\nplt.savefig('chart.png')\nprint('saved')")
        self.assertEqual(len(artifact), 1)
        self.assertEqual(artifact[0]["mime_type"], "image/png")
        self.assertTrue(base64.b64decode(artifact[0]["data"]).startswith(b"\x89PNG"))
        self.assertIn("saved", content)
        self.assertIn("[1 image returned to the user]", content)
        # The file is in the kept sandbox's workspace.
        self.assertTrue(self.interp.sandbox.files.read("chart.png").startswith(b"\x89PNG"))

    def test_error_gives_the_traceback(self):
        content, _ = self.interp.run("print('before')\n{}['missing']")
        self.assertIn("before", content)
        self.assertIn("Traceback (most recent call last):", content)
        self.assertIn("KeyError: 'missing'", content)

    def test_silence_and_long_output(self):
        content, _ = self.interp.run("x = 1")
        self.assertIn("print()", content)
        interp = vlc.PythonCodeInterpreter(client=vivarium.Client(), stateful=False, max_text=100)
        content, _ = interp.run("print('y' * 5000)")
        self.assertLess(len(content), 200)
        self.assertIn("characters of output dropped", content)

    def test_expired_sandbox_is_replaced(self):
        self.interp.run("x = 1")
        self.interp.sandbox.close()
        content, _ = self.interp.run("print('again')")
        self.assertIn("again", content)
        self.assertIn("the sandbox was restarted", content)


@unittest.skipUnless(SERVER, "needs a server: run through go test ./test/pyclient")
class ToolTest(unittest.TestCase):

    def tool_class(self):
        if real_langchain():
            return fresh().VivariumPythonTool
        # A stand-in langchain_core.tools, only for the time of the test.
        fake = types.ModuleType("langchain_core.tools")
        fake.BaseTool = FakeBaseTool
        pkg = types.ModuleType("langchain_core")
        pkg.tools = fake
        saved = {k: sys.modules.get(k) for k in ("langchain_core", "langchain_core.tools")}
        sys.modules.update({"langchain_core": pkg, "langchain_core.tools": fake})

        def restore():
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v
            fresh()
        self.addCleanup(restore)
        return fresh().VivariumPythonTool

    def test_tool(self):
        cls = self.tool_class()
        tool = cls(client=vivarium.Client())
        self.addCleanup(tool.close)
        self.assertEqual(tool.name, "python_code_interpreter")
        self.assertEqual(tool.response_format, "content_and_artifact")
        self.assertIn("print()", tool.description)
        self.assertEqual(tool.run({"code": "answer = 6 * 7\nprint(answer)"}), "42\n")
        self.assertEqual(tool.run({"code": "answer"}), "42")  # one sandbox across calls
        content = tool.run({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"})
        self.assertIn("image", content)
        if not real_langchain():
            self.assertEqual(tool.last_artifact[0]["mime_type"], "image/png")


if __name__ == "__main__":
    unittest.main()

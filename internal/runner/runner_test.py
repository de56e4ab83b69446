"""Tests of runner.py's cell syntax and rich results, run by runner_test.go
(TestRunnerPython) with the host's python3: the Runtime with a channel that
records what it would send."""

import io
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import runner  # noqa: E402


class Recorder:
    def __init__(self):
        self.events = []

    def send(self, event, wait_ack=False):
        self.events.append(json.loads(json.dumps(event, default=str)))


class Base:
    @classmethod
    def setUpClass(cls):
        runner.prepare_environment()
        cls.rec = Recorder()
        cls.rt = runner.Runtime(cls.rec)

    def setUp(self):
        self.rec.events.clear()
        self.cwd = os.getcwd()

    def tearDown(self):
        os.chdir(self.cwd)

    def run_cell(self, code):
        """Runs a cell; returns (exit code, error, results, stdout)."""
        out = io.StringIO()
        saved = sys.stdout
        sys.stdout = out
        try:
            code, err = self.rt.run_cell(code, "<cell>", None)
        finally:
            sys.stdout = saved
        results = [e for e in self.rec.events if e["type"] == "result"]
        self.rec.events.clear()
        return code, err, results, out.getvalue()

    def main_text(self, results):
        return [r["data"]["text/plain"] for r in results if r["is_main_result"]]



class Cells(Base, unittest.TestCase):
    def test_indented_cell(self):
        code, err, results, _ = self.run_cell("\n    x = 1\n    if x:\n        y = 2\n    x + y\n  ")
        self.assertIsNone(err)
        self.assertEqual(self.main_text(results), ["3"])

    def test_line_numbers_kept(self):
        _, err, _, _ = self.run_cell("\n    a = 1\n    !true\n    %env VV_X=1\n    raise ValueError('here')\n")
        self.assertEqual(err["name"], "ValueError")
        self.assertIn('line 5', err["traceback"])
        self.assertIn("raise ValueError('here')", err["traceback"])
        self.assertNotIn("runner.py", err["traceback"])

    def test_magic_text_in_strings_untouched(self):
        src = 's = """\n!not a command\n%not a magic\n"""\nt = (7\n% 2, 0)\ns.count("!") + t[0]'
        code, err, results, _ = self.run_cell(src)
        self.assertIsNone(err)
        self.assertEqual(self.main_text(results), ["2"])

    def test_shell_escape_output_and_variables(self):
        # The command's output goes to the real stdout (fd 1): capture it
        # by running a cell that reads it back.
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "out")
            _, err, results, _ = self.run_cell("name = 'vv'\n!echo hello {name} $name '$$HOME_NOT' > %s\nwith open(%r) as f: out = f.read()\nout" % (f, f))
            self.assertIsNone(err)
            self.assertEqual(self.main_text(results), [repr("hello vv vv $HOME_NOT\n")])

    def test_interrupt_ends_the_command(self):
        import signal

        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "pid")
            # The interrupt comes once the command has started (its pid
            # file exists), as a client's would.
            sent = []

            def interrupt(*_):
                if not sent and os.path.exists(f) and os.path.getsize(f):
                    sent.append(True)
                    raise KeyboardInterrupt
            old = signal.signal(signal.SIGALRM, interrupt)
            signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
            try:
                _, err, _, _ = self.run_cell("!sh -c 'echo $$$$ > %s; exec sleep 60'" % f)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
            self.assertEqual(err["name"], "KeyboardInterrupt")
            with open(f) as r:
                pid = int(r.read())
            with self.assertRaises(ProcessLookupError):
                os.kill(pid, 0)

    def test_shell_assign(self):
        _, err, results, _ = self.run_cell("files = !printf 'a\\nb\\n'\n(files, files.s, _exit_code)")
        self.assertIsNone(err)
        self.assertEqual(self.main_text(results), ["(['a', 'b'], 'a b', 0)"])

    def test_cd_env_pwd(self):
        with tempfile.TemporaryDirectory() as d:
            _, err, results, out = self.run_cell("%%cd %s\n%%env VV_MAGIC=on\nimport os\nhere = %%pwd\n(os.environ['VV_MAGIC'], here)" % d)
            self.assertIsNone(err)
            self.assertEqual(self.main_text(results), [repr(("on", os.path.realpath(d)))])
            self.assertIn("env: VV_MAGIC=on", out)
        os.environ.pop("VV_MAGIC", None)

    def test_time(self):
        _, err, results, out = self.run_cell("%time 6 * 7")
        self.assertIsNone(err)
        self.assertEqual(self.main_text(results), ["42"])
        self.assertIn("Wall time:", out)
        _, err, results, out = self.run_cell("%%time\nz = 5\nz * 2")
        self.assertIsNone(err)
        self.assertEqual(self.main_text(results), ["10"])
        self.assertIn("CPU times:", out)

    def test_unknown_magics_named(self):
        _, err, _, _ = self.run_cell("x = 1\n%frobnicate now")
        self.assertEqual(err["name"], "UsageError")
        self.assertIn("%frobnicate", err["value"])
        _, err, _, _ = self.run_cell("%%frobnicate\nbody")
        self.assertEqual(err["name"], "UsageError")
        self.assertIn("%%frobnicate", err["value"])
        # Notebook display settings are accepted.
        _, err, _, _ = self.run_cell("%matplotlib inline\n1")
        self.assertIsNone(err)

    def test_pip_without_index(self):
        _, err, _, _ = self.run_cell("%pip install requests")
        self.assertEqual(err["name"], "UsageError")
        self.assertIn("no package index", err["value"])

    def test_writefile(self):
        with tempfile.TemporaryDirectory() as d:
            f = os.path.join(d, "w.txt")
            _, err, _, out = self.run_cell("%%%%writefile %s\nline {not expanded}\n" % f)
            self.assertIsNone(err)
            with open(f) as r:
                self.assertEqual(r.read(), "line {not expanded}\n")

    def test_syntax_error_still_reported(self):
        _, err, _, _ = self.run_cell("    x = (\n")
        self.assertEqual(err["name"], "SyntaxError")


def _has(mod):
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


@unittest.skipUnless(_has("pandas") and _has("matplotlib") and _has("PIL"), "needs pandas, matplotlib and PIL")
class Rich(Base, unittest.TestCase):
    def results_of(self, code):
        _, err, results, _ = self.run_cell(code)
        self.assertIsNone(err)
        return results

    def chart(self, code):
        results = self.results_of("import matplotlib.pyplot as plt\n" + code + "\nplt.show()")
        self.assertEqual(len(results), 1)
        self.assertIn("image/png", results[0]["data"])
        return results[0]["data"][runner.CHART_MIME]

    def test_dataframe_data(self):
        results = self.results_of("import pandas as pd\npd.DataFrame({'a': [1, 2, 3], 'b': ['x', None, 'z']})")
        self.assertEqual(results[0]["data"][runner.DATA_MIME], {"a": [1, 2, 3], "b": ["x", None, "z"]})
        self.assertIn("text/html", results[0]["data"])

    def test_pil(self):
        results = self.results_of("from PIL import Image\nim = Image.new('RGB', (4, 4), 'red')\nim.show()\nim")
        self.assertEqual(len(results), 2)
        for r in results:
            self.assertTrue(r["data"]["image/png"])
        # Saved to a file, it is shown too (as E2B's); to a buffer, not.
        with tempfile.TemporaryDirectory() as d:
            results = self.results_of("import io\nim.save(%r)\nim.save(io.BytesIO(), 'PNG')" % os.path.join(d, "a.png"))
            self.assertEqual(len(results), 1)
            self.assertTrue(results[0]["data"]["image/png"])

    def test_line(self):
        c = self.chart("import numpy as np\nx = np.linspace(0, 1, 10)\nplt.plot(x, x, label='id')\nplt.plot(x, x * x)\n"
                       "plt.xlabel('Time (s)')\nplt.ylabel('Amp [Hz]')\nplt.title('T')")
        self.assertEqual((c["type"], c["title"], c["x_unit"], c["y_unit"], c["x_scale"]), ("line", "T", "s", "Hz", "linear"))
        self.assertEqual([e["label"] for e in c["elements"]], ["id", "Line 1"])
        self.assertEqual(len(c["elements"][0]["points"]), 10)
        self.assertTrue(all(isinstance(t, float) for t in c["x_ticks"]))

    def test_scatter_log(self):
        c = self.chart("plt.scatter([1, 10, 100], [1, 2, 3], label='s')\nplt.xscale('log')")
        self.assertEqual((c["type"], c["x_scale"]), ("scatter", "log"))
        self.assertEqual(c["elements"][0]["points"], [[1.0, 1.0], [10.0, 2.0], [100.0, 3.0]])

    def test_bar(self):
        c = self.chart("plt.bar(['a', 'b', 'c'], [3, 1, 2])\nplt.title('B')")
        self.assertEqual(c["type"], "bar")
        self.assertEqual([(e["label"], e["value"]) for e in c["elements"]], [("a", 3), ("b", 1), ("c", 2)])
        c = self.chart("plt.barh(['a', 'b'], [5, 7])\nplt.xlabel('n')")
        self.assertEqual([(e["label"], e["value"]) for e in c["elements"]], [("a", 5), ("b", 7)])
        self.assertEqual(c["y_label"], "n")

    def test_scales(self):
        c = self.chart("import datetime\nd = [datetime.date(2024, 1, 1) + datetime.timedelta(days=i) for i in range(3)]\n"
                       "plt.plot(d, [1, 2, 3])")
        self.assertEqual((c["x_scale"], c["y_scale"]), ("datetime", "linear"))
        self.assertEqual(c["elements"][0]["points"][0], ["2024-01-01", 1.0])
        self.assertTrue(all(isinstance(t, str) and t.startswith("2024-") for t in c["x_ticks"]))
        c = self.chart("plt.plot([1, 2, 3], ['A', 'B', 'C'])")
        self.assertEqual((c["x_scale"], c["y_scale"], c["y_tick_labels"]), ("linear", "categorical", ["A", "B", "C"]))

    def test_stacked_bars_stand(self):
        c = self.chart("plt.bar(['a', 'b'], [4, 5], label='low')\nplt.bar(['a', 'b'], [1, 1], bottom=[4, 5], label='top')")
        self.assertEqual([(e["group"], e["label"], e["value"]) for e in c["elements"]],
                         [("low", "a", 4), ("low", "b", 5), ("top", "a", 1), ("top", "b", 1)])

    def test_pie(self):
        c = self.chart("plt.pie([1, 3], labels=['one', 'three'])")
        self.assertEqual(c["type"], "pie")
        self.assertEqual([(e["label"], e["angle"]) for e in c["elements"]], [("one", 90.0), ("three", 270.0)])

    def test_box(self):
        c = self.chart("fig, ax = plt.subplots()\nax.boxplot([[1, 2, 3, 4, 5, 20], [2, 3, 4]], labels=['p', 'q'], patch_artist=True)")
        self.assertEqual(c["type"], "box_and_whisker")
        p, q = c["elements"]
        self.assertEqual((p["label"], p["min"], p["median"], p["max"], p["outliers"]), ("p", 1.0, 3.5, 5.0, [20.0]))
        self.assertEqual((q["label"], q["first_quartile"], q["third_quartile"]), ("q", 2.5, 3.5))

    def test_superchart_and_unknown(self):
        c = self.chart("fig, axs = plt.subplots(1, 2)\nfig.suptitle('S')\naxs[0].plot([1, 2])\naxs[1].scatter([1], [2])")
        self.assertEqual((c["type"], c["title"]), ("superchart", "S"))
        self.assertEqual([e["type"] for e in c["elements"]], ["line", "scatter"])
        c = self.chart("fig, axs = plt.subplots(2)\naxs[0].plot([1, 2])\naxs[1].bar(['a'], [1])")
        self.assertEqual((c["type"], c["title"]), ("superchart", ""))  # as E2B's get_suptitle()
        self.assertEqual([e["type"] for e in c["elements"]], ["line", "bar"])
        c = self.chart("fig, ax = plt.subplots()\nax.add_artist(plt.Circle((0, 0), 1))\nplt.title('C')")
        self.assertEqual((c["type"], c["title"], c["elements"]), ("unknown", "C", []))


if __name__ == "__main__":
    unittest.main()

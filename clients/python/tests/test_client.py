"""The client against a real server (test/pyclient starts one).

Environment: VIVARIUM_URL, VIVARIUM_API_KEY, and VIVARIUM_API_KEY_2 (a
second key, to check that keys see only their own sandboxes).
"""

import os
import threading
import unittest

import vivarium
from vivarium import (AuthenticationError, Client, ConnectionFailed, InvalidRequestError, NotAllowedError,
                      NotFoundError, SandboxBusyError, VivariumError)


def client(key=None):
    return Client(api_key=key)


@unittest.skipUnless(os.environ.get("VIVARIUM_URL"), "needs a server: run through go test ./test/pyclient")
class ClientTest(unittest.TestCase):

    def setUp(self):
        self.client = client()

    def sandbox(self, **kw):
        sb = self.client.create_sandbox(**kw)
        self.addCleanup(sb.close)
        return sb

    def test_health(self):
        self.assertTrue(self.client.health())

    def test_state_is_kept_and_the_context_manager_closes(self):
        with self.client.create_sandbox(timeout_s=120, metadata={"who": "test"}) as sb:
            self.assertTrue(sb.id.startswith("sb_"))
            self.assertEqual(sb.info["metadata"], {"who": "test"})
            first = sb.execute("import math\nx = 41\nprint('set')")
            self.assertTrue(first.ok, first)
            self.assertEqual(first.stdout, "set\n")
            second = sb.execute("x + 1")
            self.assertEqual(second.text, "42")
            self.assertEqual(second.execution_count, 2)
            self.assertIn(sb.id, [s["id"] for s in self.client.list_sandboxes()])
            self.assertEqual(self.client.sandbox(sb.id).info["execution_count"], 2)
        with self.assertRaises(NotFoundError):
            self.client.sandbox(sb.id)
        sb.close()  # closing twice is fine

    def test_contexts_in_other_languages(self):
        sb = self.sandbox()
        self.assertIn("javascript", [c["id"] for c in sb.contexts()])
        sb.execute("const z = 41", context="js")
        self.assertEqual(sb.execute("z + 1", context="javascript").text, "42")
        ctx = sb.create_context("typescript", cwd="/tmp")
        self.assertEqual(ctx["language"], "typescript")
        ex = sb.execute("const n: number = 2\nprocess.cwd() + ' ' + n", context=ctx["id"])
        self.assertEqual(ex.text, "/tmp 2", ex)
        sb.restart_context(ctx["id"])
        sb.remove_context(ctx["id"])
        self.assertNotIn(ctx["id"], [c["id"] for c in sb.contexts()])
        with self.assertRaises(InvalidRequestError):
            sb.create_context("cobol")

    def test_a_port_of_the_sandbox(self):
        sb = self.sandbox()
        sb.files.write("index.html", b"hello from the sandbox")
        sb.execute("import subprocess\n"
                   "server = subprocess.Popen(['python3', '-m', 'http.server', '8000'], "
                   "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
        access = sb.port(8000)
        self.assertTrue(access["token"].startswith("vp1."))
        self.assertIn("/ports/8000/", access["path_url"])
        for _ in range(300):
            try:
                status, headers, body = sb.fetch(8000, "/index.html")
                break
            except VivariumError as e:
                self.assertEqual(e.code, "port_closed")
                threading.Event().wait(0.1)
        self.assertEqual((status, body), (200, b"hello from the sandbox"))
        status, _, _ = sb.fetch(8000, "/missing")
        self.assertEqual(status, 404)  # the sandbox's server's own answer
        with self.assertRaises(VivariumError) as cm:
            sb.fetch(8001)
        self.assertEqual(cm.exception.code, "port_closed")
        if os.environ.get("VIVARIUM_API_KEY_2"):
            other = client(os.environ["VIVARIUM_API_KEY_2"])
            with self.assertRaises(NotFoundError):
                other._call("POST", "/v1/sandboxes/%s/ports/8000" % sb.id)

    def test_exception_is_a_result_not_a_client_error(self):
        sb = self.sandbox()
        ex = sb.execute("def f():\n    return 1 / 0\nf()")
        self.assertEqual(ex.status, "error")
        self.assertFalse(ex.ok)
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertIn("line 2, in f", ex.error.traceback)
        ex = sb.execute("while True: pass", timeout_s=0.5)
        self.assertEqual(ex.status, "timeout")
        self.assertTrue(ex.state_lost)

    def test_streaming_callbacks_in_order(self):
        sb = self.sandbox()
        events = []
        ex = sb.execute(
            "import sys, time\n"
            "for i in range(3):\n"
            "    print(i, flush=True); time.sleep(0.1)\n"
            "print('warn', file=sys.stderr, flush=True)\n"
            "display(7)\n"
            "raise ValueError('late')",
            on_stdout=lambda s: events.append(("out", s)),
            on_stderr=lambda s: events.append(("err", s)),
            on_result=lambda r: events.append(("result", r.text)),
            on_error=lambda e: events.append(("error", e.name)),
        )
        self.assertEqual(events, [("out", "0\n"), ("out", "1\n"), ("out", "2\n"), ("err", "warn\n"),
                                  ("result", "7"), ("error", "ValueError")])
        self.assertEqual(ex.status, "error")
        self.assertEqual(ex.stdout, "0\n1\n2\n")

    def test_chart(self):
        sb = self.sandbox()
        ex = sb.execute("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        self.assertTrue(ex.ok, ex)
        pngs = [r for r in ex.results if r.png]
        self.assertEqual(len(pngs), 1)
        self.assertTrue(pngs[0].png_bytes().startswith(b"\x89PNG"))
        # The figure described as data, and a DataFrame's columns.
        self.assertEqual(pngs[0].chart["type"], "line")
        self.assertEqual(len(pngs[0].chart["elements"][0]["points"]), 3)
        ex = sb.execute("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        self.assertEqual(ex.results[0].data, {"a": [1, 2]})
        self.assertIn("data", ex.results[0].formats())

    def test_interrupt_keeps_state(self):
        sb = self.sandbox()
        sb.execute("n = 0")
        started = threading.Event()
        box = {}

        def long_run():
            box["ex"] = sb.execute(
                "import time\nwhile True:\n    n += 1\n    print('tick', flush=True)\n    time.sleep(0.05)",
                on_stdout=lambda s: started.set())

        t = threading.Thread(target=long_run)
        t.start()
        self.assertTrue(started.wait(20))
        with self.assertRaises(SandboxBusyError):
            sb.execute("1")
        sb.interrupt()
        t.join(20)
        self.assertEqual(box["ex"].error.name, "KeyboardInterrupt")
        self.assertGreater(int(sb.execute("n").text), 0)

    def test_restart_keeps_files(self):
        sb = self.sandbox()
        sb.execute("x = 1\nopen('kept.txt', 'w').write('yes')")
        sb.restart()
        ex = sb.execute("print(open('kept.txt').read())\n'x' in globals()")
        self.assertEqual(ex.stdout, "yes\n")
        self.assertEqual(ex.text, "False")

    def test_files(self):
        sb = self.sandbox()
        self.assertEqual(sb.files.write("data/in.csv", "a,b\n1,2\n")["size"], 8)
        sb.files.write("bin.dat", bytes(range(256)))
        self.assertEqual(sb.files.read("bin.dat"), bytes(range(256)))
        self.assertEqual(sb.files.read_text("data/in.csv"), "a,b\n1,2\n")
        sb.files.write("name with spaces é.txt", "odd")
        self.assertEqual(sb.files.read_text("name with spaces é.txt"), "odd")
        names = {e["path"]: e["type"] for e in sb.files.list(depth=2)}
        self.assertEqual(names["data"], "dir")
        self.assertEqual(names["data/in.csv"], "file")
        self.assertIn("name with spaces é.txt", names)
        self.assertEqual(sb.execute("print(open('data/in.csv').read().split()[1])").stdout, "1,2\n")
        self.assertEqual(sb.files.write("m.txt", "x", metadata={"Author": "mish"})["metadata"], {"author": "mish"})
        self.assertEqual(sb.files.metadata("m.txt"), {"author": "mish"})
        self.assertEqual(sb.files.metadata("bin.dat"), {})
        sb.files.remove("data")
        with self.assertRaises(NotFoundError):
            sb.files.read("data/in.csv")
        for bad in ("../../etc/passwd", "/etc/passwd"):
            with self.assertRaises((InvalidRequestError, NotFoundError)):
                sb.files.read(bad)

    def test_commands(self):
        sb = self.sandbox()
        sb.files.write("f.txt", "hello")
        res = sb.commands.run("cat f.txt; echo; id -u; exit 3")
        self.assertEqual(res.exit_code, 3)
        self.assertEqual(res.stdout, "hello\n1000\n")
        self.assertFalse(res.ok)
        chunks = []
        res = sb.commands.run("for i in 1 2; do echo $i; sleep 0.1; done", on_stdout=chunks.append)
        self.assertEqual("".join(chunks), "1\n2\n")
        self.assertTrue(res.ok)
        res = sb.commands.run("id -u; echo conf > /etc/app.conf && cat /etc/app.conf", user="root")
        self.assertEqual(res.stdout, "0\nconf\n")

    def test_home_user(self):
        sb = self.sandbox(home="/home/user")
        self.assertEqual(sb.commands.run("pwd; whoami").stdout, "/home/user\nuser\n")
        self.assertEqual(sb.execute("import os; os.getcwd()").text, "'/home/user'")

    def test_one_shot_run(self):
        ex = self.client.run("print(open('in.txt').read())\n2 ** 10", files={"in.txt": "from the client"})
        self.assertEqual(ex.stdout, "from the client\n")
        self.assertEqual(ex.text, "1024")
        out = []
        ex = self.client.run("print('streamed')", on_stdout=out.append)
        self.assertEqual(out, ["streamed\n"])
        self.assertTrue(ex.ok)

    def test_set_timeout(self):
        sb = self.sandbox(timeout_s=60)
        info = sb.set_timeout(300)
        self.assertEqual(info["timeout_s"], 300)

    def test_metrics(self):
        sb = self.sandbox()
        sb.execute("x = bytearray(32 << 20)")
        samples = sb.metrics()
        self.assertGreaterEqual(len(samples), 1)
        now = samples[-1]
        self.assertGreaterEqual(now["mem_used"], 32 << 20)
        self.assertLessEqual(now["mem_used"], now["mem_total"])
        self.assertEqual(sb.metrics(start=0, end=1), [])

    def test_errors_are_mapped(self):
        with self.assertRaises(AuthenticationError) as cm:
            client("viv_forged").list_sandboxes()
        self.assertEqual(cm.exception.status, 401)
        self.assertIn("API key", cm.exception.message)

        sb = self.sandbox()
        other = os.environ.get("VIVARIUM_API_KEY_2")
        if other:
            # Another key sees nothing of this one's sandboxes.
            with self.assertRaises(NotFoundError):
                client(other).sandbox(sb.id)
            with self.assertRaises(NotFoundError):
                vivarium.Sandbox(client(other), {"id": sb.id}).execute("1")

        with self.assertRaises(InvalidRequestError) as cm:
            self.client.create_sandbox(limits={"memory": 1024})
        self.assertEqual(cm.exception.code, "invalid_request")
        self.assertIn("memory", str(cm.exception))

        with self.assertRaises(InvalidRequestError) as cm:
            self.client.run("1", backend="no-such-backend")
        self.assertIn("not offered here", str(cm.exception))
        with self.client.create_sandbox(backend="native") as chosen:
            self.assertEqual(chosen.info["backend"], "native")

        with self.assertRaises(ConnectionFailed):
            Client(url="http://127.0.0.1:9", timeout=2).health()
        self.assertTrue(issubclass(ConnectionFailed, VivariumError))


    @unittest.skipUnless(os.environ.get("VIVARIUM_TEST_PACKAGE"), "the server offers no test package")
    def test_network_and_packages(self):
        pkg = os.environ["VIVARIUM_TEST_PACKAGE"]
        with self.assertRaises(NotAllowedError) as cm:
            self.client.create_sandbox(network={"allow": ["evil.test"]})
        self.assertIn("not within the server's allowlist", str(cm.exception))
        sb = self.sandbox(network={"packages": True})
        self.assertTrue(sb.info["network"]["packages"])
        with self.assertRaises(NotAllowedError) as cm:
            sb.install("requests")
        self.assertIn("not on this server's package allowlist", str(cm.exception))
        res = sb.install(pkg)
        self.assertIn("Successfully installed", res["output"])
        ex = sb.execute("import %s; print(%s.ANSWER)" % (pkg, pkg))
        self.assertEqual(ex.stdout, "42\n", ex)
        plain = self.sandbox()
        self.assertIsNone(plain.info["network"])
        with self.assertRaises(NotAllowedError):
            plain.install(pkg)

    @unittest.skipUnless(os.environ.get("VIVARIUM_TEST_PACKAGE"), "the server offers no test package")
    def test_set_network(self):
        # The server allows packages and no host: a sandbox may narrow
        # its access, never widen it.
        sb = self.sandbox(network={"packages": True})
        info = sb.set_network({"deny": ["0.0.0.0/0", "[::/0]"]})
        self.assertEqual(info["network"]["deny"], ["0.0.0.0/0:*", "[::/0]:*"])
        self.assertTrue(info["network"]["packages"])
        with self.assertRaises(NotAllowedError) as cm:
            sb.set_network({"allow": ["evil.test"]})
        self.assertIn("not within the server's allowlist", str(cm.exception))
        self.assertEqual(sb.refresh()["network"]["deny"], ["0.0.0.0/0:*", "[::/0]:*"])
        self.assertEqual(sb.set_network({})["network"]["allow"], [])
        with self.assertRaises(NotAllowedError) as cm:
            self.sandbox().set_network({"allow": ["evil.test"]})
        # Another key's request is answered as for no such sandbox.
        theirs = vivarium.Sandbox(Client(api_key=os.environ["VIVARIUM_API_KEY_2"]), {"id": sb.id})
        with self.assertRaises(NotFoundError):
            theirs.set_network({"all": True})

    def test_volumes(self):
        name = "vol-%d" % os.getpid()
        vol = self.client.create_volume(name, size=32 << 20)
        self.assertTrue(vol.id.startswith("vol_"))
        self.assertEqual(vol.info["size"], 32 << 20)
        self.assertIn(name, [v["name"] for v in self.client.list_volumes()])
        vol.files.write("in/hello.txt", "from the client", metadata={"Kind": "greeting"})
        self.assertEqual(vol.files.metadata("in/hello.txt"), {"kind": "greeting"})
        sb = self.sandbox(volumes={"/home/user/data": vol})
        self.assertEqual(sb.info["volumes"][0]["path"], "/home/user/data")
        res = sb.execute("print(open('/home/user/data/in/hello.txt').read())\n"
                         "open('/workspace/data/out.txt', 'w').write('from the sandbox')")
        self.assertTrue(res.ok, res)
        self.assertEqual(res.stdout, "from the client\n")
        self.assertEqual(sb.files.read_text("data/out.txt"), "from the sandbox")
        with self.assertRaises(vivarium.VolumeInUseError):
            vol.delete()
        sb.close()
        self.assertEqual(self.client.volume(name).files.read_text("out.txt"), "from the sandbox")
        # Another key: not found, cannot be mounted.
        other = Client(api_key=os.environ["VIVARIUM_API_KEY_2"])
        with self.assertRaises(NotFoundError):
            other.volume(vol.id)
        with self.assertRaises(NotFoundError):
            other.create_sandbox(volumes={"/mnt/x": name})
        vol.delete()
        with self.assertRaises(NotFoundError):
            self.client.volume(name)

    def test_pause(self):
        sb = self.sandbox()
        sb.execute("x = 41")
        if os.environ.get("VIVARIUM_PAUSE") != "1":
            # A server without CRIU cannot pause a sandbox, and says why.
            with self.assertRaisesRegex(vivarium.ServerUnavailableError, "CRIU"):
                sb.pause()
            return
        self.assertTrue(sb.info["pausable"])
        info = sb.pause()
        self.assertEqual(info["state"], "paused")
        with self.assertRaises(vivarium.SandboxPausedError):
            sb.execute("x")
        with self.assertRaises(vivarium.SandboxPausedError):
            sb.pause()
        self.assertEqual(sb.resume()["state"], "idle")
        self.assertEqual(sb.execute("x + 1").text, "42")
        copies = sb.fork(count=2)
        for c in copies:
            self.addCleanup(c.close)
        copies[0].execute("x = 0")
        self.assertEqual(copies[1].execute("print(x)").stdout, "41\n")
        self.assertEqual(sb.execute("print(x)").stdout, "41\n")
        snap = sb.snapshot(name="pyclient-x")
        self.assertTrue(snap["id"].startswith("snap_"), snap)
        self.assertEqual(snap["name"], "pyclient-x")
        self.assertIn(snap["id"], [s["id"] for s in self.client.list_snapshots()])
        sb.execute("x = 7")
        made = self.client.create_sandbox(from_snapshot=snap["id"])
        self.addCleanup(made.close)
        self.assertEqual(made.execute("print(x)").stdout, "41\n")
        by_name = self.client.create_sandbox(from_snapshot="pyclient-x")
        self.addCleanup(by_name.close)
        self.assertEqual(by_name.execute("print(x)").stdout, "41\n")
        self.client.delete_snapshot(snap["id"])
        self.assertNotIn(snap["id"], [s["id"] for s in self.client.list_snapshots()])
        with self.assertRaises(NotFoundError):
            self.client.create_sandbox(from_snapshot=snap["id"])
        auto = self.sandbox(auto_resume=True, pausable=True)
        auto.execute("y = 'kept'")
        auto.pause()
        self.assertEqual(auto.execute("print(y)").stdout, "kept\n")


class StandardLibraryOnlyTest(unittest.TestCase):

    def test_no_third_party_imports(self):
        import ast
        import sys
        pkg = os.path.dirname(vivarium.__file__)
        stdlib = set(getattr(sys, "stdlib_module_names", ())) or {"base64", "json", "os", "urllib", "typing", "asyncio"}
        for name in os.listdir(pkg):
            if not name.endswith(".py") or name == "langchain.py":
                continue
            with open(os.path.join(pkg, name)) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    mods = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    mods = [node.module]
                else:
                    continue
                for m in mods:
                    self.assertIn(m.split(".")[0], stdlib, "%s imports %s" % (name, m))


if __name__ == "__main__":
    unittest.main()

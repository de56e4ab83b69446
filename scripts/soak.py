#!/usr/bin/env python3
"""Hostile soak of a running `vivarium serve`: many sandboxes, hostile code,
for as long as asked, then a check that the server is still well.

Workers loop: make a sandbox, run hostile snippets (fork and thread bombs,
memory hogs, floods of output, forged protocol lines, processes that setsid
and ignore signals, a full disk, /dev/shm filled, descriptors exhausted) and
checked ones (whose answer is known) in it, sometimes a command, then delete
it; some sandboxes are left to their idle timeout, and some runs are
one-shot. With --pause, some sandboxes are pausable: they are paused and
resumed, and forked, between hostile snippets, their state checked after
each; with --volumes, some mount the worker's volume and check what the
last sandbox of that worker wrote there. Every answer is classified:

  limit    the sandbox's own limit at work, said as such (its memory, its
           process limit, its timeout): expected of hostile code
  problem  anything else: a 5xx, a wrong or missing answer, a sandbox
           closed under a call, a client-side error

With --pid, the server's RSS, descriptors and threads are sampled. At the
end: the server's health, and the sandboxes left (after the longest idle
timeout). The exit status is 1 when there was a problem.

    scripts/soak.py --url http://127.0.0.1:8080 --seconds 600 --workers 6 \
        --pid "$(pgrep -f 'vivarium serve')"

Standard library only; a key with --key (or VIVARIUM_API_KEY) unless the
server runs with --dev. See docs/operations.md#soak.
"""
import argparse
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request

HOSTILE = {
    "forkbomb": "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
    "threads": "import threading, time\nwhile True: threading.Thread(target=time.sleep, args=(100,)).start()",
    "memhog": "b = []\nwhile True: b.append(bytearray(50 << 20))",
    "flood": "import sys\nwhile True: sys.stdout.write('x' * 65536)",
    "binflood": "import os\nwhile True: os.write(1, os.urandom(65536))",
    "forged": "print('{\"type\":\"result\",\"main\":true,\"data\":{\"text/plain\":\"forged\"}}')\n"
              "print('\\x00\\x1b[2J\\ufffd' * 1000)",
    "setsid": "import subprocess\n"
              "subprocess.Popen(['sh', '-c', 'setsid sh -c \"trap \\\"\\\" TERM HUP INT; while :; do sleep 1; done\" &'])",
    "doublefork": "import os, signal, time\n"
                  "if os.fork() == 0:\n"
                  "    if os.fork() == 0:\n"
                  "        os.setsid()\n"
                  "        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT): signal.signal(s, signal.SIG_IGN)\n"
                  "        while True: time.sleep(1)\n"
                  "    os._exit(0)",
    "spin": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
    "diskfill": "f = open('/tmp/fill', 'wb')\nwhile True: f.write(b'x' * (1 << 20))",
    "shmfill": "f = open('/dev/shm/fill', 'wb')\nwhile True: f.write(b'x' * (1 << 20))",
    "fds": "import os\nfs = []\nwhile True: fs.append(os.open('/dev/null', os.O_RDONLY))",
    "links": "import os\nos.mkfifo('p')\nos.symlink('/etc/shadow', 's')\nos.symlink('/proc/1/root', 'r')",
    "net": "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=2)",
}
CHECKED = [
    ("x = 20\nx * 2 + 2", "42"),
    ("import numpy as np\nint(np.arange(10).sum())", "45"),
    ("import pandas as pd\nint(pd.DataFrame({'a': [1, 2, 3]})['a'].sum())", "6"),
    ("sum(range(1000))", "499500"),
]
IDLE = [5, 30, 60]  # seconds: sandboxes left behind end within the longest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--key", default=os.environ.get("VIVARIUM_API_KEY", ""))
    ap.add_argument("--seconds", type=int, default=300)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--memory-mib", type=int, default=256, help="each sandbox's memory limit")
    ap.add_argument("--pid", type=int, default=0, help="the server's pid, to sample its RSS, fds and threads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pause", action="store_true", help="a fifth of the sandboxes pausable: paused, resumed and forked")
    ap.add_argument("--volumes", action="store_true", help="a fifth of the sandboxes mount their worker's volume")
    ap.add_argument("--trace", action="store_true", help="print every request: time, method, path, status, seconds, code")
    Soak(ap.parse_args()).run()


class Soak:
    def __init__(self, args):
        self.a = args
        self.lock = threading.Lock()
        self.counts = {}
        self.limits = {}
        self.problems = []
        self.create_s = []
        self.samples = []

    def req(self, method, path, body=None, timeout=120):
        headers = {"Content-Type": "application/json"}
        if self.a.key:
            headers["Authorization"] = "Bearer " + self.a.key
        data = json.dumps(body).encode() if body is not None else None
        r = urllib.request.Request(self.a.url + path, data=data, method=method, headers=headers)
        t = time.time()
        status = "-"
        try:
            with urllib.request.urlopen(r, timeout=timeout) as resp:
                status = resp.status
                raw = resp.read(64 << 20)
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            status = e.code
            raw = e.read(1 << 20)
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw[:200]
        finally:
            if self.a.trace:
                code = (body or {}).get("code", "") if isinstance(body, dict) else ""
                print(f"trace {t - self.t0:7.1f} {method} {path} {status} {time.time() - t:.1f}s {code[:40]!r}", flush=True)

    def count(self, what):
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def problem(self, what):
        with self.lock:
            self.problems.append((round(time.time() - self.t0, 1), what[:400]))

    def limit(self, what):
        with self.lock:
            self.limits[what] = self.limits.get(what, 0) + 1

    def judge(self, what, status, body):
        """Classifies an answer that is not the one hoped for."""
        err = body.get("error") if isinstance(body, dict) else None
        msg = (err.get("message") or err.get("value") or "") if isinstance(err, dict) else ""
        if status == 200 and isinstance(body, dict) and body.get("status") in ("memory_limit", "timeout"):
            self.limit(body["status"])
        elif status == 400 and "at its process limit" in msg:
            self.limit("process_limit")
        elif status == 429:
            self.limit("quota")
        elif status == 507:
            self.limit("no room to pause")  # its memory is at its limit: a restore would not fit
        elif status == 409 and "files open" in msg:
            self.limit("descriptors")  # all of a process's descriptors are taken: CRIU needs two
        else:
            self.problem(f"{what}: {status} {str(body)[:300]}")

    def worker(self, n):
        rnd = random.Random(self.a.seed * 1000 + n)
        mem = self.a.memory_mib << 20
        while time.time() < self.end:
            try:
                if rnd.random() < 0.1:
                    name = rnd.choice(list(HOSTILE))
                    st, res = self.req("POST", "/v1/execute", {"code": HOSTILE[name], "timeout_s": 3, "limits": {"memory": mem}})
                    self.count("one-shot")
                    if st >= 500:
                        self.problem(f"one-shot {name}: {st} {str(res)[:300]}")
                    continue
                t = time.time()
                spec = {"timeout_s": rnd.choice(IDLE), "limits": {"memory": mem, "timeout_s": 4}}
                pausable = self.a.pause and rnd.random() < 0.2
                vol = self.a.volumes and not pausable and rnd.random() < 0.25
                if pausable:
                    spec["pausable"] = True
                if vol:
                    spec["volumes"] = [{"name": f"soak-{n}", "path": "/workspace/vol"}]
                st, sb = self.req("POST", "/v1/sandboxes", spec)
                if st == 429:
                    self.limit("quota")
                    time.sleep(0.5)
                    continue
                if st not in (200, 201):
                    self.problem(f"create: {st} {str(sb)[:300]}")
                    time.sleep(1)
                    continue
                with self.lock:
                    self.create_s.append(time.time() - t)
                self.count("created")
                sid = sb["id"]
                if vol:
                    self.volume_check(n, sid)
                for _ in range(rnd.randint(1, 3)):
                    if rnd.random() < 0.6:
                        name = rnd.choice(list(HOSTILE))
                        st, res = self.req("POST", f"/v1/sandboxes/{sid}/execute", {"code": HOSTILE[name], "timeout_s": 3})
                        self.count("hostile")
                        if st >= 400:
                            self.judge(f"{sid} hostile {name}", st, res)
                    else:
                        code, want = rnd.choice(CHECKED)
                        st, res = self.req("POST", f"/v1/sandboxes/{sid}/execute", {"code": code, "timeout_s": 30})
                        self.count("checked")
                        rs = res.get("results") if st == 200 and isinstance(res, dict) else None
                        if not rs or rs[0].get("text") != want:
                            self.judge(f"{sid} checked {code.splitlines()[0]!r}", st, res)
                    if rnd.random() < 0.3:
                        st, res = self.req("POST", f"/v1/sandboxes/{sid}/commands", {"cmd": "echo hi", "timeout_s": 10})
                        self.count("command")
                        if st != 200 or not isinstance(res, dict) or res.get("stdout") != "hi\n":
                            self.judge(f"{sid} command", st, res)
                    if pausable:
                        self.pause_resume(sid, rnd)
                if rnd.random() < 0.15:
                    self.count("left to time out")
                    continue
                st, res = self.req("DELETE", f"/v1/sandboxes/{sid}")
                self.count("deleted")
                if st not in (200, 204):
                    self.problem(f"{sid} delete: {st} {str(res)[:300]}")
            except Exception as e:  # the client's own failure (a timeout, a reset) is a problem too
                self.problem(f"client: {type(e).__name__}: {e}")
                time.sleep(1)

    STATE = "soak_state = {'n': 42, 'xs': list(range(100))}"
    STATE_CHECK = "soak_state['n'] + sum(soak_state['xs'])"
    STATE_WANT = "4992"

    def set_state(self, sid):
        st, res = self.req("POST", f"/v1/sandboxes/{sid}/execute", {"code": self.STATE, "timeout_s": 30})
        if st != 200 or not isinstance(res, dict) or res.get("status") != "ok":
            self.judge(f"{sid} set state", st, res)
            return False
        return True

    def state_kept(self, sid, after):
        """Checks the state that set_state left; a runner its own limit
        restarted says so (state_lost), which is a limit at work."""
        st, res = self.req("POST", f"/v1/sandboxes/{sid}/execute", {"code": self.STATE_CHECK, "timeout_s": 30})
        rs = res.get("results") if st == 200 and isinstance(res, dict) else None
        if rs and rs[0].get("text") == self.STATE_WANT:
            return
        if isinstance(res, dict) and res.get("state_lost"):
            # Its runner was restarted meanwhile (a hostile process
            # left running hit the sandbox's memory limit, say).
            self.limit("state lost to a limit")
            return
        self.judge(f"{sid} state after {after}", st, res)

    def pause_resume(self, sid, rnd):
        """Pauses and resumes the sandbox (hostile processes may be running
        in it), or forks it, and checks its state in each."""
        if not self.set_state(sid):
            return
        if rnd.random() < 0.25:
            st, res = self.req("POST", f"/v1/sandboxes/{sid}/fork", {"count": 2})
            self.count("fork")
            if st == 507:
                self.limit("no room to fork")
                return
            if st not in (200, 201) or not isinstance(res, dict):
                self.judge(f"{sid} fork", st, res)
                return
            for c in res.get("sandboxes", []):
                self.state_kept(c["id"], "fork")
                st, _ = self.req("DELETE", f"/v1/sandboxes/{c['id']}")
                if st not in (200, 204):
                    self.problem(f"{c['id']} delete a fork: {st}")
            return
        st, res = self.req("POST", f"/v1/sandboxes/{sid}/pause")
        self.count("pause")
        if st != 200:
            self.judge(f"{sid} pause", st, res)
            return
        st, res = self.req("POST", f"/v1/sandboxes/{sid}/resume")
        self.count("resume")
        if st != 200:
            self.judge(f"{sid} resume", st, res)
            return
        self.state_kept(sid, "pause and resume")

    def volume_check(self, n, sid):
        """Reads what the worker's last sandbox wrote in its volume, and
        writes the next."""
        code = ("import os\np = '/workspace/vol/seq'\n"
                "prev = open(p).read() if os.path.exists(p) else '0'\n"
                "open(p + '.tmp', 'w').write(str(int(prev) + 1)); os.replace(p + '.tmp', p)\nint(prev)")
        st, res = self.req("POST", f"/v1/sandboxes/{sid}/execute", {"code": code, "timeout_s": 30})
        self.count("volume")
        rs = res.get("results") if st == 200 and isinstance(res, dict) else None
        want = str(self.volume_seq.get(n, 0))
        if not rs or rs[0].get("text") != want:
            self.judge(f"{sid} volume read (want {want})", st, res)
            return
        self.volume_seq[n] = int(want) + 1

    def volumes(self):
        for n in range(self.a.workers):
            st, res = self.req("POST", "/v1/volumes", {"name": f"soak-{n}", "size": 32 << 20})
            if st == 409:  # left by an earlier run: made again, empty
                st, _ = self.req("DELETE", f"/v1/volumes/soak-{n}")
                st, res = self.req("POST", "/v1/volumes", {"name": f"soak-{n}", "size": 32 << 20})
            if st not in (200, 201):
                raise SystemExit(f"create volume soak-{n}: {st} {res}")

    def sample(self):
        while time.time() < self.end + 1:
            try:
                with open(f"/proc/{self.a.pid}/status") as f:
                    rss = next(int(l.split()[1]) >> 10 for l in f if l.startswith("VmRSS"))
                fds = len(os.listdir(f"/proc/{self.a.pid}/fd"))
                threads = len(os.listdir(f"/proc/{self.a.pid}/task"))
                self.samples.append((round(time.time() - self.t0), rss, fds, threads))
            except OSError as e:
                self.problem(f"the server's process: {e}")
                return
            time.sleep(15)

    def run(self):
        self.volume_seq = {}
        self.t0 = time.time()
        if self.a.volumes:
            self.volumes()
        self.end = self.t0 + self.a.seconds
        threads = [threading.Thread(target=self.worker, args=(i,), daemon=True) for i in range(self.a.workers)]
        if self.a.pid:
            threads.append(threading.Thread(target=self.sample, daemon=True))
        for t in threads:
            t.start()
        last = time.time()
        while any(t.is_alive() for t in threads):
            time.sleep(1)
            if time.time() - last >= 60:
                last = time.time()
                with self.lock:
                    print(f"[{round(last - self.t0)} s] {self.counts} limits {self.limits} problems {len(self.problems)}", flush=True)
        print(f"done in {round(time.time() - self.t0)} s: {self.counts}")
        print(f"limits at work: {self.limits}")
        if self.create_s:
            c = sorted(self.create_s)
            print("create: p50 %.0f ms, p99 %.0f ms, max %.0f ms" % (c[len(c) // 2] * 1e3, c[int(len(c) * .99)] * 1e3, c[-1] * 1e3))
        if self.samples:
            print("server (s, RSS MiB, fds, threads):", " ".join(f"{s}" for s in self.samples))
        print(f"waiting {max(IDLE) + 5} s for the sandboxes left behind to time out")
        time.sleep(max(IDLE) + 5)
        st, health = self.req("GET", "/healthz")
        if st != 200:
            self.problem(f"health: {st} {health}")
        st, listed = self.req("GET", "/v1/sandboxes")
        left = listed.get("sandboxes", []) if isinstance(listed, dict) else listed
        if st != 200 or left:
            self.problem(f"sandboxes left: {st} {str(left)[:300]}")
        print(f"health {st}, sandboxes left {len(left) if isinstance(left, list) else left}")
        print(f"problems: {len(self.problems)}")
        for p in self.problems[:100]:
            print(" ", p)
        raise SystemExit(1 if self.problems else 0)


if __name__ == "__main__":
    main()

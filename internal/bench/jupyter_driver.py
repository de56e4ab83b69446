"""Drives Jupyter kernels for `vivarium bench`, one request per line.

Requests on stdin, one JSON object a line:
  {"op": "once", "code": C}   start a kernel, execute C, shut the kernel down
  {"op": "start", "code": C}  start the kernel kept warm, execute C in it
  {"op": "exec", "code": C}   execute C in the warm kernel
  {"op": "stop"}              shut the warm kernel down
Replies on stdout, one JSON object a line: {"ok": true, "stdout": "..."} or
{"ok": false, "error": "..."}. The driver imports jupyter_client once, so a
request measures kernel work only, as a server that keeps the client
library loaded would.
"""

import json
import os
import sys

from jupyter_client.manager import KernelManager

TIMEOUT = 60


def execute(kc, code):
    """Runs code in the kernel behind kc and returns what it printed."""
    msg_id = kc.execute(code, store_history=False)
    out = []
    while True:
        msg = kc.get_iopub_msg(timeout=TIMEOUT)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            out.append(content["text"])
        elif kind == "error":
            raise RuntimeError("%s: %s" % (content["ename"], content["evalue"]))
        elif kind == "status" and content["execution_state"] == "idle":
            return "".join(out)


def start():
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=TIMEOUT)
    return km, kc


def stop(km, kc):
    kc.stop_channels()
    # Killed, not asked to quit: a one-shot sandbox is killed at the end of
    # its run too.
    km.shutdown_kernel(now=True)


def main():
    # Replies go to a descriptor of their own; kernels inherit file
    # descriptor 1, which now points to stderr, so nothing they print can
    # be mistaken for a reply.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    warm = None
    for line in sys.stdin:
        req = json.loads(line)
        try:
            op = req["op"]
            if op == "once":
                km, kc = start()
                try:
                    out = execute(kc, req["code"])
                finally:
                    stop(km, kc)
            elif op == "start":
                if warm is None:
                    warm = start()
                out = execute(warm[1], req["code"])
            elif op == "exec":
                if warm is None:
                    raise RuntimeError("no warm kernel: send start first")
                out = execute(warm[1], req["code"])
            elif op == "stop":
                if warm is not None:
                    stop(*warm)
                    warm = None
                out = ""
            else:
                raise ValueError("unknown op %r" % op)
            reply = {"ok": True, "stdout": out}
        except Exception as e:  # reported to the Go side, which counts it
            reply = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    if warm is not None:
        stop(*warm)


if __name__ == "__main__":
    main()

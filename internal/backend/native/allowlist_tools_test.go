package native_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// toolBattery exercises, in one sandbox, what the seccomp allowlist must
// keep working: the scientific Python stack, multiprocessing, subprocess,
// threads, asyncio, sockets, much of the standard library, shells, and
// the common command-line tools. It prints one line per check: "name ok",
// "name FAILED <why>" or "name skipped <why>" (a tool not installed).
const toolBattery = `import os, shutil, subprocess, tempfile, traceback
from operator import neg

def check(name, fn):
    try:
        fn()
    except BaseException as e:
        why = "".join(traceback.format_exception_only(type(e), e)).strip().replace("\n", " | ")
        print(name, "FAILED", why, flush=True)
    else:
        print(name, "ok", flush=True)

def sh(name, cmd, needs=(), shell="/bin/sh"):
    missing = [n for n in needs if shutil.which(n) is None]
    if missing:
        print(name, "skipped (not installed: %s)" % " ".join(missing), flush=True)
        return
    def go():
        p = subprocess.run([shell, "-c", cmd], capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError("exit %d: %s %s" % (p.returncode, p.stdout[-300:], p.stderr[-600:]))
    check(name, go)

os.chdir(tempfile.mkdtemp(prefix="battery-"))

def t_numpy():
    import numpy as np
    a = np.random.default_rng(1).random((200, 200))
    u, s, vt = np.linalg.svd(a)
    assert np.allclose(u @ np.diag(s) @ vt, a)
    assert abs(np.fft.ifft(np.fft.fft(np.arange(8.0))).real[3] - 3) < 1e-9
check("numpy", t_numpy)

def t_pandas():
    import pandas as pd
    df = pd.DataFrame({"k": list("abcabc"), "v": range(6)})
    assert df.groupby("k")["v"].sum()["a"] == 3
    df.to_csv("df.csv", index=False)
    assert len(pd.read_csv("df.csv")) == 6
    pd.date_range("2024-01-01", periods=3, tz="Europe/Paris")
check("pandas", t_pandas)

def t_matplotlib():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [1, 4, 9], label="x")
    ax.legend()
    fig.savefig("plot.png")
    with open("plot.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    fig.savefig("plot.svg")
check("matplotlib", t_matplotlib)

def t_scipy():
    import numpy as np
    from scipy import optimize, linalg, sparse, stats, integrate, signal
    r = optimize.minimize(lambda x: (x[0] - 2) ** 2 + (x[1] + 1) ** 2, [0, 0])
    assert abs(r.x[0] - 2) < 1e-3
    linalg.inv(np.eye(3) * 2)
    sparse.csr_matrix(np.eye(4)).dot(np.ones(4))
    stats.norm.cdf(0)
    integrate.quad(lambda x: x * x, 0, 1)
    signal.butter(4, 0.2)
check("scipy", t_scipy)

def t_pool():
    import multiprocessing as mp
    with mp.Pool(2) as p:
        assert p.map(neg, range(10)) == [-x for x in range(10)]
check("multiprocessing_pool", t_pool)

def t_mp_more():
    import multiprocessing as mp
    for method in ("spawn", "forkserver"):
        with mp.get_context(method).Pool(1) as p:
            assert p.map(neg, [3]) == [-3], method
    q = mp.Queue()
    pr = mp.Process(target=q.put, args=(42,))
    pr.start()
    assert q.get(timeout=60) == 42
    pr.join()
    from multiprocessing import shared_memory
    shm = shared_memory.SharedMemory(create=True, size=4096)
    shm.buf[0] = 7
    shm.close()
    shm.unlink()
check("multiprocessing_spawn_forkserver_queue_shm", t_mp_more)

def t_futures():
    from concurrent.futures import ThreadPoolExecutor, ProcessPoolExecutor
    with ThreadPoolExecutor(4) as ex:
        assert list(ex.map(neg, range(5))) == [0, -1, -2, -3, -4]
    with ProcessPoolExecutor(2) as ex:
        assert list(ex.map(neg, range(3))) == [0, -1, -2]
check("concurrent_futures", t_futures)

def t_subprocess():
    assert subprocess.run(["echo", "hi"], capture_output=True, text=True).stdout == "hi\n"
    assert subprocess.check_output("echo $((1+2))", shell=True, text=True) == "3\n"
    p = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.communicate(b"x")[0] == b"x"
    assert os.system("true") == 0
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    assert os.waitpid(pid, 0)[1] >> 8 == 3
    pid = os.posix_spawn("/bin/true", ["true"], os.environ)
    assert os.waitpid(pid, 0)[1] == 0
check("subprocess_fork_spawn", t_subprocess)

def t_threads():
    import threading, queue
    q = queue.Queue()
    ts = [threading.Thread(target=lambda i=i: q.put(i)) for i in range(16)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert sorted(q.get() for _ in range(16)) == list(range(16))
    ev = threading.Event()
    threading.Timer(0.05, ev.set).start()
    assert ev.wait(10)
check("threading", t_threads)

def t_asyncio():
    import asyncio
    async def main():
        p = await asyncio.create_subprocess_exec("echo", "a", stdout=asyncio.subprocess.PIPE)
        out, _ = await p.communicate()
        assert out == b"a\n"
        async def handle(r, w):
            w.write(await r.read(5)); await w.drain(); w.close()
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        r, w = await asyncio.open_connection("127.0.0.1", srv.sockets[0].getsockname()[1])
        w.write(b"hello"); await w.drain()
        assert await r.read(5) == b"hello"
        w.close(); srv.close()
    asyncio.run(main())
check("asyncio", t_asyncio)

def t_sockets():
    import socket
    a, b = socket.socketpair()
    a.sendall(b"x"); assert b.recv(1) == b"x"
    socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
    c = socket.create_connection(s.getsockname()); conn, _ = s.accept()
    c.setblocking(False); c.setblocking(True); c.settimeout(1.0)
    conn.sendall(b"y"); assert c.recv(1) == b"y"
    s6 = socket.socket(socket.AF_INET6); s6.bind(("::1", 0)); s6.close()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0)); u.close()
    socket.getaddrinfo("localhost", 80)
    socket.gethostname()
    socket.if_nameindex()
    socket.send_fds(a, [b"f"], [0]); socket.recv_fds(b, 1, 1)
check("sockets", t_sockets)

def t_stdlib():
    import sqlite3, ssl, zlib, lzma, bz2, hashlib, uuid, mmap, resource, signal, ctypes, time, locale, tarfile, zipfile, select
    db = sqlite3.connect("t.db"); db.execute("create table t(x)"); db.execute("insert into t values (1)"); db.commit()
    assert db.execute("select x from t").fetchone() == (1,)
    ssl.create_default_context()
    data = os.urandom(4096) * 4
    for m in (zlib, lzma, bz2):
        assert m.decompress(m.compress(data)) == data
    hashlib.sha256(data).hexdigest(); uuid.uuid4(); uuid.uuid1()
    with open("m.bin", "wb") as f: f.write(b"\0" * 8192)
    with open("m.bin", "r+b") as f:
        m = mmap.mmap(f.fileno(), 0); m[0] = 1; m.flush(); m.close()
    resource.getrlimit(resource.RLIMIT_CORE)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 64), hard))
    resource.getrusage(resource.RUSAGE_SELF)
    signal.signal(signal.SIGALRM, lambda *a: None); signal.setitimer(signal.ITIMER_REAL, 0.01); time.sleep(0.05)
    ctypes.CDLL(None).getpid()
    os.cpu_count(); os.sched_getaffinity(0); os.getloadavg(); os.uname(); os.times()
    fd = os.open("m.bin", os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    os.pread(fd, 10, 0); os.preadv(fd, [bytearray(4)], 0); os.close(fd)
    os.set_inheritable(1, False); os.set_inheritable(1, True)
    shutil.get_terminal_size()
    with tarfile.open("x.tar.gz", "w:gz") as tf: tf.add("m.bin")
    with zipfile.ZipFile("x.zip", "w") as zf: zf.write("m.bin")
    shutil.copytree(".", "/tmp/battery-copy", dirs_exist_ok=True); shutil.rmtree("/tmp/battery-copy")
    locale.setlocale(locale.LC_ALL, "")
    os.nice(1); os.sched_yield()
    r, w = os.pipe2(os.O_CLOEXEC); os.write(w, b"a"); os.read(r, 1)
    os.close(os.memfd_create("x"))
    ev = os.eventfd(0); os.eventfd_write(ev, 1); os.close(ev)
    os.statvfs("/"); os.stat("/usr/bin/env"); os.listdir("/usr/lib")
    ep = select.epoll(); ep.register(r, select.EPOLLIN); ep.poll(0); ep.close()
    select.select([r], [], [], 0); p = select.poll(); p.register(r); p.poll(0)
    import faulthandler; faulthandler.enable()
    os.getrandom(8)
check("stdlib", t_stdlib)

sh("sh_pipeline", "echo hello world | tr a-z A-Z | sed s/HELLO/JELLO/ | grep -q JELLO && echo ok | wc -l | grep -q 1")
sh("dash", "x=$(echo 3); [ $x -eq 3 ] && for i in 1 2 3; do :; done; (sleep 0.05 &) ; wait", needs=["dash"], shell="/bin/dash")
sh("bash", "set -euo pipefail; a=(1 2 3); [[ ${#a[@]} == 3 ]]; diff <(echo a) <(echo a); cat <<E >/dev/null\nx\nE\n"
   "sleep 0.1 & wait $!; ulimit -a >/dev/null; kill -0 $$; read -r v <<< 'z'; [[ $v == z ]]; type ls >/dev/null; "
   "shopt -s globstar; echo ** >/dev/null; trap 'true' EXIT", needs=["bash"], shell="/bin/bash")
sh("coreutils", """set -e
mkdir -p d/e; echo b > d/f; echo a >> d/f; cp d/f d/g; cp -a d d2; mv d/g d/h; rm d/h; rm -r d2
sort d/f | uniq | wc -l | grep -q 2; head -1 d/f; tail -1 d/f; tail -n +1 d/f >/dev/null
echo a:b:c | cut -d: -f2 | grep -q b; echo abc | tr a-c A-C | grep -q ABC
date; date -u +%s; env >/dev/null; id; whoami; stat d/f; du -sh d; df -h / /tmp; df
ls -la /; ls -l --color=always /usr/bin >/dev/null; touch d/t; ln -s f d/l; readlink d/l; basename /a/b; dirname /a/b
seq 1 10 | tee d/seq | tail -1 | grep -q 10; yes | head -3 >/dev/null; sleep 0.1; printf '%d\n' 5; cat d/f >/dev/null
md5sum d/f; sha256sum d/f; base64 d/f | base64 -d >/dev/null; od -c d/f >/dev/null; split -l 1 d/f d/part; chmod 600 d/f
timeout 5 true; nice -n 5 true; nohup true 2>/dev/null; realpath d; mktemp; mktemp -d; sync; dd if=/dev/zero of=d/z bs=4k count=16 2>/dev/null
truncate -s 1M d/big; install -m 644 d/f d/inst; nproc; uname -a; hostname; cat /proc/self/status >/dev/null; comm d/f d/f >/dev/null
shuf -n1 d/f; fold -w2 d/f; expand d/f; nl d/f; paste d/f d/f; tac d/f; sha1sum d/f; cksum d/f
fmt d/f; pr d/f >/dev/null; numfmt --to=iec 2048; factor 12; expr 1 + 1; test -d d; true; ! false; pwd; tty -s || true
chgrp $(id -g) d/f; ls -i d/f; sum d/f; mkfifo d/fifo; rm d/fifo; dd if=d/f of=d/dd conv=fsync 2>/dev/null
cp --reflink=auto d/big d/big2; cp /usr/bin/env d/env; cmp d/env /usr/bin/env
""")
sh("grep", "printf 'a\\nb\\nab\\n' > g; grep -c a g | grep -q 2; grep -rn ab . >/dev/null; grep -E 'a|b' g >/dev/null; grep -P 'a(?=b)' g >/dev/null; grep -F -q ab g", needs=["grep"])
sh("sed", "printf 'a\\nb\\n' > s; sed -i 's/a/x/' s; grep -q x s; sed -n 2p s | grep -q b; sed -E 's/(x)/\\1\\1/' s >/dev/null", needs=["sed"])
sh("awk", "printf '1 2\\n3 4\\n' | awk '{s+=$1*$2} END {print s}' | grep -q 14; awk 'BEGIN{srand(); print (rand() >= 0)}' | grep -q 1", needs=["awk"])
sh("find_xargs", "mkdir -p f1/f2; touch f1/a f1/f2/b; find . -name b | grep -q b; find f1 -type f -exec ls {} +; find / -maxdepth 1 >/dev/null; find f1 -print0 | xargs -0 ls >/dev/null", needs=["find", "xargs"])
sh("tar_gzip", "mkdir -p tt; echo x > tt/a; tar czf tt.tgz tt; rm -r tt; tar xzf tt.tgz; grep -q x tt/a; tar tvf tt.tgz >/dev/null; gzip -9 -k tt/a; gunzip -f tt/a.gz; zcat tt.tgz >/dev/null", needs=["tar", "gzip"])
sh("xz", "echo x > xx; xz -T2 xx; xz -d xx.xz; tar cJf t.txz xx; tar xJf t.txz", needs=["xz"])
sh("bzip2", "echo x > bb; bzip2 bb; bunzip2 bb.bz2; tar cjf t.tbz bb; tar xjf t.tbz", needs=["bzip2"])
sh("zstd", "echo x > zz; zstd -q zz; zstd -qdf zz.zst", needs=["zstd"])
sh("git", "export HOME=$PWD; mkdir repo; cd repo; git init -q; echo a > a; git add a; git -c user.name=t -c user.email=t@t commit -qm one; git log --oneline | grep -q one; echo b >> a; git diff --stat >/dev/null; git status --short >/dev/null; git checkout -qb x; git -c user.name=t -c user.email=t@t commit -qam two; git gc -q; git log -p >/dev/null", needs=["git"])
sh("procps", "ps aux >/dev/null; ps -ef >/dev/null; top -bn1 >/dev/null; free -m; uptime; nproc; pgrep -f nothing-at-all || true", needs=["ps", "top", "free", "uptime"])
sh("curl", "echo hi > c; curl -sS file://$PWD/c | grep -q hi", needs=["curl"])
sh("perl", "perl -e 'print 1+1' | grep -q 2; perl -MPOSIX -e 'print floor(1.5)' >/dev/null", needs=["perl"])
sh("file_less_diff", "echo a > l1; echo b > l2; file l1 >/dev/null; less -F l1 </dev/null >/dev/null; diff l1 l2 >/dev/null || [ $? -eq 1 ]", needs=["file", "less", "diff"])
sh("iproute_getent", "ip addr show lo >/dev/null; ip -s link >/dev/null; getent hosts localhost >/dev/null", needs=["ip", "getent"])
sh("util_linux", "touch lk; flock lk true; flock -n lk true; setsid true; getopt -o a -- -a >/dev/null", needs=["flock", "setsid", "getopt"])
sh("python_cli", "echo 'print(1)' | python3 - | grep -q 1; python3 -c 'import json, sys; json.dump({}, sys.stdout)' >/dev/null")
print("battery done", flush=True)
`

// batteryChecks are the lines the battery must print, one per check.
var batteryChecks = []string{
	"numpy", "pandas", "matplotlib", "scipy", "multiprocessing_pool",
	"multiprocessing_spawn_forkserver_queue_shm", "concurrent_futures", "subprocess_fork_spawn",
	"threading", "asyncio", "sockets", "stdlib", "sh_pipeline", "dash", "bash", "coreutils", "grep",
	"sed", "awk", "find_xargs", "tar_gzip", "xz", "bzip2", "zstd", "git", "procps", "curl", "perl",
	"file_less_diff", "iproute_getent", "util_linux", "python_cli",
}

// Programs keep working under the seccomp allowlist: the battery, in a
// real sandbox (and, in the zygote run, one forked from the zygote).
func TestAllowlistTools(t *testing.T) {
	testutil.RequirePythonModules(t, "numpy", "pandas", "matplotlib", "scipy")
	res := run(t, toolBattery, func(j *sandbox.OneShot) {
		j.Spec.Limits = sandbox.Limits{Timeout: 5 * time.Minute, Memory: 1 << 30, Pids: 256}
	})
	outcome := map[string]string{}
	for _, line := range strings.Split(res.Stdout, "\n") {
		name, rest, _ := strings.Cut(line, " ")
		outcome[name] = rest
	}
	if res.Status != sandbox.StatusOK || outcome["battery"] != "done" {
		t.Errorf("the battery did not finish: status %s exit %d\nstdout: %s\nstderr: %s\nerror: %+v",
			res.Status, res.ExitCode, res.Stdout, res.Stderr, res.Error)
	}
	for _, name := range batteryChecks {
		t.Run(name, func(t *testing.T) {
			switch got, ok := outcome[name]; {
			case !ok:
				t.Errorf("no outcome")
			case strings.HasPrefix(got, "skipped"):
				t.Skip(got)
			case got != "ok":
				t.Error(got)
			}
		})
	}
}

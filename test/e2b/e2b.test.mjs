// The unmodified E2B SDKs (e2b and @e2b/code-interpreter, pinned in
// package.json) against a real `vivarium serve`, configured only by the
// environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY. Run by
// e2b_test.go, which starts the server and gives a second key in
// VIVARIUM_OTHER_KEY.
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox } from '@e2b/code-interpreter'
import {
  Sandbox as BaseSandbox,
  AuthenticationError,
  CommandExitError,
  FileNotFoundError,
  InvalidArgumentError,
  NotFoundError,
  SandboxError,
  TimeoutError,
} from 'e2b'

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'VIVARIUM_OTHER_KEY']) {
  if (!process.env[v]) throw new Error(`${v} is not set: run this suite with go test ./test/e2b/`)
}
const otherKey = process.env.VIVARIUM_OTHER_KEY

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// Every test gets a fresh sandbox, killed afterwards.
async function withSandbox(opts, fn) {
  if (typeof opts === 'function') [opts, fn] = [{}, opts]
  const sbx = await Sandbox.create(opts)
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

describe('control plane', () => {
  test('create with timeout, envs and metadata; getInfo; isRunning; kill', async () => {
    const sbx = await Sandbox.create({ timeoutMs: 120_000, envs: { GREETING: 'hi' }, metadata: { job: 'e2b-test', n: '1' } })
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, 'code-interpreter-v1')
    assert.deepEqual(info.metadata, { job: 'e2b-test', n: '1' })
    assert.equal(info.state, 'running')
    assert.ok(info.endAt > info.startedAt)
    assert.ok(Math.abs(info.endAt - info.startedAt - 120_000) < 5_000, `endAt ${info.endAt} startedAt ${info.startedAt}`)
    assert.ok(info.memoryMB > 0 && info.cpuCount > 0)
    assert.equal(await sbx.isRunning(), true)
    // The sandbox's environment reaches code and commands.
    assert.equal((await sbx.runCode('import os; os.environ["GREETING"]')).text, 'hi')
    assert.equal((await sbx.commands.run('echo $GREETING')).stdout, 'hi\n')
    // As envd does: E2B_SANDBOX and E2B_SANDBOX_ID, in the environment
    // and in /run/e2b.
    const id = sbx.sandboxId.split('-')[0]
    assert.equal((await sbx.commands.run('echo "$E2B_SANDBOX $E2B_SANDBOX_ID"')).stdout, `true ${id}\n`)
    assert.equal((await sbx.commands.run('cat /run/e2b/.E2B_SANDBOX /run/e2b/.E2B_SANDBOX_ID')).stdout, `true${id}`)
    assert.equal((await sbx.runCode('os.environ["E2B_SANDBOX_ID"]')).text, id)

    assert.equal(await sbx.kill(), true)
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(sbx.getInfo(), NotFoundError)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  })

  test('connect, list with a metadata filter, setTimeout, Sandbox.kill(id)', async () => {
    const tag = `run-${Date.now()}`
    const a = await Sandbox.create({ metadata: { tag } })
    const b = await BaseSandbox.create({ metadata: { tag, which: 'b' } })
    try {
      await a.runCode('shared = 7')
      const again = await Sandbox.connect(a.sandboxId)
      assert.equal((await again.runCode('shared * 6')).text, '42')

      const listed = await Sandbox.list({ query: { metadata: { tag } } }).nextItems()
      assert.deepEqual(listed.map((s) => s.sandboxId).sort(), [a.sandboxId, b.sandboxId].sort())
      const onlyB = await Sandbox.list({ query: { metadata: { tag, which: 'b' } } }).nextItems()
      assert.deepEqual(onlyB.map((s) => s.sandboxId), [b.sandboxId])
      assert.equal(onlyB[0].templateId, 'base')
      assert.equal(onlyB[0].state, 'running')
      // Neither is paused.
      assert.deepEqual(await Sandbox.list({ query: { metadata: { tag }, state: ['paused'] } }).nextItems(), [])
      // Pages.
      const pager = Sandbox.list({ query: { metadata: { tag } }, limit: 1 })
      const first = await pager.nextItems()
      assert.equal(first.length, 1)
      assert.equal(pager.hasNext, true)
      const second = await pager.nextItems()
      assert.equal(second.length, 1)
      assert.notEqual(first[0].sandboxId, second[0].sandboxId)
      assert.equal(pager.hasNext, false)

      await a.setTimeout(600_000)
      const info = await a.getInfo()
      assert.ok(info.endAt - Date.now() > 590_000, `endAt ${info.endAt}`)

      assert.equal(await Sandbox.kill(b.sandboxId), true)
      assert.equal(await b.isRunning(), false)
    } finally {
      await a.kill().catch(() => {})
      await b.kill().catch(() => {})
    }
  })

  test('sandboxes expire on their timeout', async () => {
    const sbx = await Sandbox.create({ timeoutMs: 2_000 })
    assert.equal(await sbx.isRunning(), true)
    await sleep(3_500)
    assert.equal(await sbx.isRunning(), false)
    await assert.rejects(Sandbox.connect(sbx.sandboxId), NotFoundError)
    await assert.rejects(sbx.runCode('1'), TimeoutError)
  })

  test('another key sees nothing of a sandbox; a bad key is refused', async () => {
    await withSandbox(async (sbx) => {
      await assert.rejects(Sandbox.connect(sbx.sandboxId, { apiKey: otherKey }), NotFoundError)
      await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: otherKey }), NotFoundError)
      assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: otherKey }), false)
      const theirs = await Sandbox.list({ apiKey: otherKey }).nextItems()
      assert.ok(!theirs.some((s) => s.sandboxId === sbx.sandboxId))
      assert.equal(await sbx.isRunning(), true)

      await assert.rejects(Sandbox.create({ apiKey: 'not-a-key' }), AuthenticationError)
      await assert.rejects(Sandbox.list({ apiKey: 'not-a-key' }).nextItems(), AuthenticationError)

      // The data plane needs the sandbox's own access token.
      const url = `${process.env.E2B_SANDBOX_URL}/files?path=/home/user/x`
      const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' }
      for (const token of [undefined, 'forged.token']) {
        const res = await fetch(url, { headers: token ? { ...headers, 'X-Access-Token': token } : headers })
        assert.equal(res.status, 401)
      }
      // A token opens its own sandbox only.
      const other = await Sandbox.create({ apiKey: otherKey })
      try {
        const res = await fetch(url, { headers: { ...headers, 'X-Access-Token': other.envdAccessToken } })
        assert.equal(res.status, 401)
      } finally {
        await other.kill()
      }
    })
  })

  test('any sandbox pauses, as E2B\'s do, on a server with a zygote too (--e2b-pausable)', async () => {
    for (const opts of [{}, { lifecycle: { onTimeout: 'pause' } }]) {
      const sbx = await Sandbox.create(opts)
      try {
        await sbx.commands.run('echo kept > /home/user/f')
        // Preloaded, as in a sandbox forked from the zygote.
        assert.equal((await sbx.runCode("import sys\n'pandas' in sys.modules")).text, 'True')
        assert.equal(await sbx.pause(), true)
        assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
        assert.equal(await sbx.isRunning(), false)
        const back = await Sandbox.connect(sbx.sandboxId)
        assert.equal(await back.files.read('/home/user/f'), 'kept\n')
      } finally {
        await sbx.kill()
      }
    }
  })

  test("pause({ keepMemory: false }): the files are kept, everything else starts afresh, as E2B's filesystem-only pause", async () => {
    const sbx = await Sandbox.create()
    try {
      await sbx.files.write('/home/user/fs_only.txt', 'kept', { metadata: { k: 'v' } })
      await sbx.commands.run('chmod 600 fs_only.txt && ln -s fs_only.txt link && mkdir -p /tmp/t && echo tmp > /tmp/t/x')
      await sbx.commands.run('echo mine > /root/r && mkdir /opt/app', { user: 'root' })
      await sbx.runCode('x = 41')
      await sbx.commands.run('sleep 600', { background: true })
      const boot = (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()

      assert.equal(await sbx.pause({ keepMemory: false }), true)
      assert.equal(await sbx.isRunning(), false)
      assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
      assert.equal(await sbx.pause({ keepMemory: false }), false) // paused already

      const back = await sbx.connect()
      assert.equal(back.sandboxId, sbx.sandboxId)
      assert.equal(await back.isRunning(), true)
      assert.equal(await back.files.read('/home/user/fs_only.txt'), 'kept')
      assert.deepEqual((await back.files.getInfo('/home/user/fs_only.txt')).metadata, { k: 'v' })
      const ls = await back.commands.run("stat -c '%n %a %U' fs_only.txt link /tmp/t/x /opt/app && readlink link", { user: 'root', cwd: '/home/user' })
      assert.equal(ls.stdout, 'fs_only.txt 600 user\nlink 777 user\n/tmp/t/x 644 user\n/opt/app 755 root\nfs_only.txt\n')
      assert.equal((await back.commands.run('cat /root/r', { user: 'root' })).stdout, 'mine\n')
      // A fresh start: a new boot id, no process of before, a new kernel.
      assert.notEqual((await back.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim(), boot)
      assert.doesNotMatch((await back.commands.run('pgrep -a sleep || true')).stdout, /sleep 600/)
      assert.equal((await back.runCode('x')).error?.name, 'NameError')
      assert.equal((await back.runCode('41 + 1')).text, '42')
    } finally {
      await sbx.kill()
    }
  })

  test("lifecycle onTimeout { action: 'pause', keepMemory: false }: the timeout keeps the files alone, connect starts it afresh", async () => {
    const sbx = await Sandbox.create({ timeoutMs: 2000, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
    try {
      await sbx.files.write('/home/user/marker.txt', 'auto-paused')
      let state = 'running'
      for (let i = 0; i < 50 && state !== 'paused'; i++) {
        await sleep(200)
        state = (await Sandbox.getInfo(sbx.sandboxId)).state
      }
      assert.equal(state, 'paused', 'the timeout did not pause the sandbox')
      await sbx.connect()
      assert.equal(await sbx.files.read('/home/user/marker.txt'), 'auto-paused')
    } finally {
      await sbx.kill()
    }
  })

  test('what vivarium cannot do is a clear error, never a hang', async () => {
    await assert.rejects(Sandbox.create('my-custom-template'), /template "my-custom-template" not found/)
    await assert.rejects(Sandbox.create({ network: { allowOut: ['example.com'] } }), /no network/)
    await withSandbox(async (sbx) => {
      await assert.rejects(sbx.updateNetwork({ allowOut: ['1.1.1.1'] }), /no network/)
      await assert.rejects(sbx.commands.run('id', { user: 'admin' }), /unknown user/)
      // Services on other ports: the sandbox has no network.
      const res = await fetch(`${process.env.E2B_SANDBOX_URL}/`, {
        headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '3000', 'X-Access-Token': sbx.envdAccessToken },
      })
      assert.equal(res.status, 502)
      assert.match(await res.text(), /no network/)
      assert.equal(await sbx.isRunning(), true)
    })
  })
})

describe('code interpreter', () => {
  test('results in every format, logs, errors, execution count', async () => {
    await withSandbox(async (sbx) => {
      const first = await sbx.runCode('x = 41\nprint("out")\nimport sys; print("err", file=sys.stderr)\nx + 1')
      assert.equal(first.text, '42')
      assert.deepEqual(first.logs, { stdout: ['out\n'], stderr: ['err\n'] })
      assert.equal(first.error, undefined)
      assert.equal(first.results.length, 1)
      assert.equal(first.results[0].isMainResult, true)
      const count = first.executionCount
      assert.ok(count >= 1)

      // State is kept between calls.
      assert.equal((await sbx.runCode('x + 2')).text, '43')
      assert.equal((await sbx.runCode('"a string"')).text, 'a string')

      const rich = await sbx.runCode(`
import pandas as pd
import matplotlib.pyplot as plt
class Rich:
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"><circle r="4"/></svg>'
    def _repr_markdown_(self): return '**bold**'
    def _repr_json_(self): return {"k": [1, 2]}
    def _repr_latex_(self): return r'$x^2$'
display(Rich())
plt.plot([1, 2, 3], [3, 1, 2])
plt.show()
pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})`)
      assert.equal(rich.error, undefined, JSON.stringify(rich.error))
      const [disp, fig, df] = rich.results
      assert.equal(rich.results.length, 3)
      assert.equal(disp.isMainResult, false)
      assert.match(disp.svg, /<svg/)
      assert.equal(disp.markdown, '**bold**')
      assert.deepEqual(disp.json, { k: [1, 2] })
      assert.equal(disp.latex, '$x^2$')
      assert.equal(fig.isMainResult, false)
      assert.ok(Buffer.from(fig.png, 'base64').subarray(1, 4).toString() === 'PNG', 'a PNG')
      assert.equal(df.isMainResult, true)
      assert.match(df.html, /<table/)
      assert.match(df.text, /a\s+b/)
      assert.deepEqual(df.formats().sort(), ['data', 'html']) // data: the frame's columns, as E2B's
      assert.ok(rich.executionCount > count)

      const failed = await sbx.runCode('def f():\n    return 1 / 0\nf()')
      assert.equal(failed.error.name, 'ZeroDivisionError')
      assert.equal(failed.error.value, 'division by zero')
      assert.match(failed.error.traceback, /File "<cell>", line 2, in f/)
      assert.equal(failed.results.length, 0)
    })
  })

  test('callbacks are called while the code runs', async () => {
    await withSandbox(async (sbx) => {
      const seen = []
      const t0 = Date.now()
      const ex = await sbx.runCode(
        'import sys, time\nprint("one", flush=True)\ntime.sleep(1.5)\nprint("two", file=sys.stderr, flush=True)\ndisplay(42)\nraise ValueError("boom")',
        {
          onStdout: (m) => seen.push(['stdout', m.line, Date.now() - t0, m.error]),
          onStderr: (m) => seen.push(['stderr', m.line, Date.now() - t0, m.error]),
          onResult: (r) => seen.push(['result', r.text, Date.now() - t0]),
          onError: (e) => seen.push(['error', e.name, Date.now() - t0]),
        },
      )
      const done = Date.now() - t0
      assert.deepEqual(seen.map((s) => s.slice(0, 2)), [['stdout', 'one\n'], ['stderr', 'two\n'], ['result', '42'], ['error', 'ValueError']])
      // The first line arrived while the code still slept.
      assert.ok(seen[0][2] < done - 1000, `first output at ${seen[0][2]} ms, done at ${done} ms`)
      assert.equal(seen[0][3], false)
      assert.equal(seen[1][3], true)
      assert.equal(ex.error.value, 'boom')
    })
  })

  test('timeoutMs, envs, and the state after a timeout', async () => {
    await withSandbox(async (sbx) => {
      assert.equal((await sbx.runCode('import os; os.environ.get("ONLY_NOW")', { envs: { ONLY_NOW: 'yes' } })).text, 'yes')
      assert.equal((await sbx.runCode('import os; os.environ.get("ONLY_NOW")')).results.length, 0)

      await sbx.runCode('n = 0')
      const t0 = Date.now()
      await assert.rejects(sbx.runCode('import time\nwhile True:\n    n += 1\n    time.sleep(0.01)', { timeoutMs: 1_000 }), TimeoutError)
      assert.ok(Date.now() - t0 < 5_000)
      // The timeout interrupted the code; the state survived.
      assert.equal((await sbx.runCode('n > 0')).text, 'True')

      // Code that ignores the interrupt is ended a few seconds later; the
      // next cell waits its turn and finds a fresh Python.
      await assert.rejects(sbx.runCode('import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass', { timeoutMs: 1_000 }), TimeoutError)
      assert.equal((await sbx.runCode('n')).error.name, 'NameError')
    })
  })

  test('code contexts each keep their own state', async () => {
    await withSandbox(async (sbx) => {
      const ctxA = await sbx.createCodeContext()
      const ctxB = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
      assert.equal(ctxA.language, 'python')
      assert.equal(ctxA.cwd, '/home/user')
      assert.equal(ctxB.cwd, '/tmp')
      const ids = (await sbx.listCodeContexts()).map((c) => c.id)
      assert.ok(ids.includes(ctxA.id) && ids.includes(ctxB.id), ids.join(','))

      await sbx.runCode('v = "default"')
      await sbx.runCode('v = "a"', { context: ctxA })
      await sbx.runCode('v = "b"', { context: ctxB })
      assert.equal((await sbx.runCode('v')).text, 'default')
      assert.equal((await sbx.runCode('v', { context: ctxA })).text, 'a')
      assert.equal((await sbx.runCode('import os; v, os.getcwd()', { context: ctxB })).text, "('b', '/tmp')")

      await sbx.restartCodeContext(ctxA)
      assert.equal((await sbx.runCode('v', { context: ctxA })).error.name, 'NameError')
      assert.equal((await sbx.runCode('v', { context: ctxB })).text, 'b')

      await sbx.removeCodeContext(ctxB.id)
      assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctxB.id))
      await assert.rejects(sbx.runCode('v', { context: ctxB }), NotFoundError)
      await assert.rejects(sbx.runCode('1', { context: ctxA, language: 'python' }), InvalidArgumentError)
    })
  })

  test("language 'bash' keeps its shell; unknown languages are refused", async () => {
    await withSandbox(async (sbx) => {
      const r = await sbx.runCode('COUNT=3; cd /tmp; echo "$((COUNT * 2))"', { language: 'bash' })
      assert.deepEqual(r.logs.stdout, ['6\n'])
      assert.equal(r.error, undefined)
      const again = await sbx.runCode('echo "$COUNT $(pwd)"; ls /nope', { language: 'bash' })
      assert.deepEqual(again.logs.stdout, ['3 /tmp\n'])
      assert.equal(again.error.value, '2')

      const ctx = await sbx.createCodeContext({ language: 'bash' })
      assert.equal(ctx.language, 'bash')
      assert.deepEqual((await sbx.runCode('echo "[${COUNT-}]" $(pwd)', { context: ctx })).logs.stdout, ['[] /home/user\n'])

      await assert.rejects(sbx.runCode('DISPLAY 1', { language: 'cobol' }), /cobol.*not available/)
      await assert.rejects(sbx.createCodeContext({ language: 'deno' }), /not available/)
    })
  })
})

describe('filesystem', () => {
  test('write, read, list, exists, getInfo, makeDir, rename, remove', async () => {
    await withSandbox(async (sbx) => {
      const w = await sbx.files.write('/home/user/notes/a.txt', 'hello')
      assert.deepEqual([w.name, w.type, w.path], ['a.txt', 'file', '/home/user/notes/a.txt'])
      const bytes = new Uint8Array([0, 1, 2, 250, 255])
      await sbx.files.write('bin.dat', bytes.buffer) // relative to the home
      const many = await sbx.files.write([
        { path: '/home/user/many/1.txt', data: 'one' },
        { path: '/home/user/many/2.txt', data: new Blob(['two']) },
        { path: '/workspace/many/3.txt', data: 'three' },
      ])
      assert.deepEqual(many.map((f) => f.path), ['/home/user/many/1.txt', '/home/user/many/2.txt', '/home/user/many/3.txt'])
      // A stream is uploaded as an octet stream.
      await sbx.files.write('/home/user/streamed.txt', new Blob(['streamed body']).stream())

      assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'hello')
      assert.deepEqual(await sbx.files.read('/home/user/bin.dat', { format: 'bytes' }), bytes)
      assert.equal(await sbx.files.read('/home/user/streamed.txt'), 'streamed body')
      const stream = await sbx.files.read('/home/user/many/3.txt', { format: 'stream' })
      assert.equal(await new Response(stream).text(), 'three')
      assert.equal(await (await sbx.files.read('/home/user/many/2.txt', { format: 'blob' })).text(), 'two')
      // Code sees the files under the same path.
      assert.equal((await sbx.runCode('open("/home/user/many/1.txt").read()')).text, 'one')

      const top = await sbx.files.list('/home/user')
      assert.deepEqual(top.map((e) => e.name).sort(), ['bin.dat', 'many', 'notes', 'streamed.txt'])
      const dir = top.find((e) => e.name === 'many')
      assert.equal(dir.type, 'dir')
      assert.equal(dir.path, '/home/user/many')
      const file = top.find((e) => e.name === 'bin.dat')
      assert.equal(file.type, 'file')
      assert.equal(file.size, 5)
      assert.equal(file.permissions, '-rw-r--r--')
      assert.ok(file.modifiedTime instanceof Date && Date.now() - file.modifiedTime < 60_000)
      const deep = await sbx.files.list('/home/user', { depth: 2 })
      assert.ok(deep.some((e) => e.path === '/home/user/many/3.txt'))

      assert.equal(await sbx.files.exists('/home/user/notes/a.txt'), true)
      assert.equal(await sbx.files.exists('/home/user/nope'), false)
      const info = await sbx.files.getInfo('/home/user/notes')
      assert.equal(info.type, 'dir')
      await assert.rejects(sbx.files.getInfo('/home/user/nope'), FileNotFoundError)

      assert.equal(await sbx.files.makeDir('/home/user/x/y'), true)
      assert.equal(await sbx.files.makeDir('/home/user/x/y'), false)
      const moved = await sbx.files.rename('/home/user/notes/a.txt', '/home/user/x/y/b.txt')
      assert.equal(moved.path, '/home/user/x/y/b.txt')
      assert.equal(await sbx.files.read('/home/user/x/y/b.txt'), 'hello')
      assert.equal(await sbx.files.exists('/home/user/notes/a.txt'), false)
      await sbx.files.remove('/home/user/x')
      assert.equal(await sbx.files.exists('/home/user/x/y/b.txt'), false)
      await assert.rejects(sbx.files.read('/home/user/x/y/b.txt'), FileNotFoundError)
      await sbx.files.remove('/home/user/x') // gone already: succeeds, as in E2B
    })
  })

  test('paths reach the sandbox\'s own disk as its user or its root, never through links or other mounts', async () => {
    await withSandbox(async (sbx) => {
      // The sandbox's /etc is its own: its user reads it, writes only as root.
      assert.match(await sbx.files.read('/etc/passwd'), /^user:x:1000:1000:user:\/home\/user:/m)
      await assert.rejects(sbx.files.write('/home/user/../../etc/evil', 'x'), SandboxError)
      await sbx.files.write('/etc/app.conf', 'conf', { user: 'root' })
      assert.equal((await sbx.commands.run('cat /etc/app.conf; echo; stat -c %U /etc/app.conf')).stdout, 'conf\nroot\n')
      // A user's write or makeDir anywhere makes the missing directories,
      // as envd (root) makes them, and they are the user's; an existing
      // one keeps its owner, and the user's write into it is refused.
      await sbx.files.write('/data/deep/out.csv', 'a,b')
      assert.equal((await sbx.commands.run('stat -c %U /data /data/deep /data/deep/out.csv /')).stdout, 'user\nuser\nuser\nroot\n')
      await sbx.files.makeDir('/made/here')
      assert.equal((await sbx.files.getInfo('/made/here')).owner, 'user')
      assert.equal((await sbx.files.getInfo('/made')).owner, 'user')
      await assert.rejects(sbx.files.write('/etc/new.conf', 'x'), SandboxError)
      await sbx.files.makeDir('/etc/newdir') // as envd (root) makes it
      assert.equal((await sbx.commands.run('stat -c %U /etc /etc/newdir')).stdout, 'root\nuser\n')
      await sbx.files.write('/tmp/x', 'x')
      assert.equal((await sbx.commands.run('cat /tmp/x; echo; stat -c %U /tmp/x')).stdout, 'x\nuser\n')
      assert.ok((await sbx.files.list('/')).some((e) => e.name === 'tmp' && e.type === 'dir'))
      // The host's /usr, /proc and /dev are other mounts: out of reach.
      await assert.rejects(sbx.files.read('/proc/self/environ'), SandboxError)
      await assert.rejects(sbx.files.read('/usr/bin/python3'), SandboxError)
      await assert.rejects(sbx.files.write('/usr/local/evil', 'x', { user: 'root' }), SandboxError)
      await assert.rejects(sbx.files.rename('/home/user', '/home/user/inside'), InvalidArgumentError)
      // Links the code makes are never followed.
      await sbx.runCode('import os\nos.symlink("/etc/passwd", "/home/user/link")\nos.symlink("/etc", "/home/user/dirlink")')
      await assert.rejects(sbx.files.read('/home/user/link'), SandboxError)
      await assert.rejects(sbx.files.read('/home/user/dirlink/passwd'), SandboxError)
      await assert.rejects(sbx.files.write('/home/user/dirlink/x', 'x'), SandboxError)
      const link = await sbx.files.getInfo('/home/user/link')
      assert.equal(link.type, 'symlink')
    })
  })

  test('watchDir reports changes as they happen', async () => {
    await withSandbox(async (sbx) => {
      const events = []
      const handle = await sbx.files.watchDir('/home/user', (e) => events.push(`${e.type} ${e.name}`), { recursive: true })
      await sbx.files.write('/home/user/w/new.txt', 'a')
      await sbx.runCode('open("/home/user/w/new.txt", "a").write("more")\nimport time; time.sleep(0.6)\nimport os; os.remove("/home/user/w/new.txt")')
      await sleep(800)
      await handle.stop()
      for (const want of ['create w', 'create w/new.txt', 'remove w/new.txt']) {
        assert.ok(events.includes(want), `${want} in ${events}`)
      }
      await assert.rejects(sbx.files.watchDir('/home/user/missing', () => {}), FileNotFoundError)
    })
  })
})

describe('commands', () => {
  test('run: stdout, stderr, exit code, CommandExitError, callbacks', async () => {
    await withSandbox(async (sbx) => {
      const r = await sbx.commands.run('echo out; echo err >&2')
      assert.deepEqual(r, { exitCode: 0, error: undefined, stdout: 'out\n', stderr: 'err\n' })
      await assert.rejects(sbx.commands.run('echo partial; exit 3'), (e) => {
        assert.ok(e instanceof CommandExitError)
        assert.equal(e.exitCode, 3)
        assert.equal(e.stdout, 'partial\n')
        return true
      })
      const seen = []
      const t0 = Date.now()
      await sbx.commands.run('echo first; sleep 1; echo second >&2', {
        onStdout: (d) => seen.push(['out', d, Date.now() - t0]),
        onStderr: (d) => seen.push(['err', d, Date.now() - t0]),
      })
      assert.deepEqual(seen.map((s) => s.slice(0, 2)), [['out', 'first\n'], ['err', 'second\n']])
      assert.ok(seen[1][2] - seen[0][2] >= 800, JSON.stringify(seen))
    })
  })

  test('envs, cwd, user, timeoutMs', async () => {
    await withSandbox(async (sbx) => {
      const r = await sbx.commands.run('echo "$A $B"; pwd', { envs: { A: '1', B: 'two words' }, cwd: '/tmp', user: 'user' })
      assert.equal(r.stdout, '1 two words\n/tmp\n')
      assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
      await sbx.files.makeDir('/home/user/sub')
      assert.equal((await sbx.commands.run('pwd', { cwd: 'sub' })).stdout, '/home/user/sub\n')
      assert.equal((await sbx.commands.run('id -un')).stdout, 'user\n')
      // Root of the sandbox's own user namespace, with no capability.
      const root = await sbx.commands.run('id -un; echo $HOME; pwd; grep CapEff /proc/self/status', { user: 'root' })
      assert.equal(root.stdout, 'root\n/root\n/root\nCapEff:\t0000000000000000\n')
      // Root's relative paths are relative to its home, as in E2B.
      await sbx.files.write('hello.txt', 'from root', { user: 'root' })
      assert.equal(await sbx.files.read('/root/hello.txt', { user: 'root' }), 'from root')
      assert.equal((await sbx.commands.run('cat hello.txt', { user: 'root' })).stdout, 'from root')
      await assert.rejects(sbx.commands.run('true', { cwd: '/nonexistent' }), SandboxError)

      const t0 = Date.now()
      await assert.rejects(sbx.commands.run('sleep 30', { timeoutMs: 1_000 }), TimeoutError)
      assert.ok(Date.now() - t0 < 5_000)
      // The command was killed with its timeout.
      await sleep(300)
      assert.ok(!(await sbx.commands.list()).some((p) => p.args.includes('sleep 30')))
    })
  })

  test('background: list, sendStdin, connect, wait, kill', async () => {
    await withSandbox(async (sbx) => {
      const cat = await sbx.commands.run('cat; echo done', { background: true, stdin: true })
      const sleeper = await sbx.commands.run('sleep 60', { background: true })
      const listed = await sbx.commands.list()
      assert.deepEqual(listed.map((p) => p.pid).sort(), [cat.pid, sleeper.pid].sort())
      const info = listed.find((p) => p.pid === cat.pid)
      assert.equal(info.cmd, '/bin/bash')
      assert.deepEqual(info.args, ['-l', '-c', 'cat; echo done'])
      assert.equal(info.cwd, '/home/user')

      await sbx.commands.sendStdin(cat.pid, 'line 1\n')
      await cat.sendStdin('line 2\n')
      await cat.closeStdin()
      const res = await cat.wait()
      assert.equal(res.stdout, 'line 1\nline 2\ndone\n')

      assert.equal(await sbx.commands.kill(sleeper.pid), true)
      await assert.rejects(sleeper.wait(), (e) => e instanceof CommandExitError && e.exitCode !== 0)
      assert.equal(await sbx.commands.kill(sleeper.pid), false)

      const ticker = await sbx.commands.run('for i in 1 2 3 4; do echo tick $i; sleep 0.4; done', { background: true })
      await sleep(500)
      const later = []
      const attached = await sbx.commands.connect(ticker.pid, { onStdout: (d) => later.push(d) })
      const end = await attached.wait()
      assert.equal(end.exitCode, 0)
      assert.ok(later.join('').includes('tick 4'), later.join(''))
      assert.ok(!later.join('').includes('tick 1'), 'connect streams output from now on')
      await assert.rejects(sbx.commands.connect(ticker.pid), NotFoundError)

      const h = await sbx.commands.run('sleep 60', { background: true })
      assert.equal(await h.kill(), true)
      await assert.rejects(h.wait(), CommandExitError)
    })
  })

  test('a command whose sandbox is killed: its stream drops, as envd\'s does with its machine', async () => {
    const sbx = await Sandbox.create()
    const h = await sbx.commands.run('sleep 60', { background: true })
    const waited = h.wait().then(() => null, (e) => e)
    await sleep(200)
    await sbx.kill()
    const e = await waited
    assert.ok(e && !(e instanceof CommandExitError) && /killed|not running/.test(e.message), String(e))
  })
})

describe('limits and lifetime', () => {
  test('every limit of the sandbox applies', async () => {
    // allowInternetAccess is accepted (the Python SDK sends true by
    // default): it is all the operator allows, and this server allows no
    // host, so there is no network (network.test.mjs has a server that
    // does).
    await withSandbox({ allowInternetAccess: true }, async (sbx) => {
      assert.equal((await sbx.getInfo()).allowInternetAccess, false)
      const oom = await sbx.runCode('x = bytearray(2 * 1024**3)')
      assert.equal(oom.error.name, 'MemoryError')
      const net = await sbx.runCode('import socket\nsocket.create_connection(("1.1.1.1", 80), timeout=3)')
      assert.ok(net.error, 'no network')
      assert.equal((await sbx.runCode('1 + 1')).text, '2')
    })
  })
})

describe('agent scenario', () => {
  test('upload a CSV, summarise it with pandas, chart it, list the files, kill', async () => {
    const sbx = await Sandbox.create({ timeoutMs: 300_000 })
    const csv = 'month,sales\njan,120\nfeb,135\nmar,160\napr,150\n'
    await sbx.files.write('/home/user/data/sales.csv', csv)

    const summary = await sbx.runCode(`
import pandas as pd
df = pd.read_csv("/home/user/data/sales.csv")
print(df["sales"].sum())
df.describe()`)
    assert.equal(summary.error, undefined, JSON.stringify(summary.error))
    assert.deepEqual(summary.logs.stdout, ['565\n'])
    assert.match(summary.text, /mean\s+141\.25/)
    assert.match(summary.results[0].html, /<table/)

    const chart = await sbx.runCode(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.bar(df["month"], df["sales"])
ax.set_title("Sales")
fig.savefig("/home/user/sales.png")
plt.show()`)
    assert.equal(chart.error, undefined, JSON.stringify(chart.error))
    const png = chart.results.find((r) => r.png)
    assert.ok(png, 'the chart came back as a PNG')
    assert.equal(Buffer.from(png.png, 'base64').subarray(0, 8).toString('hex'), '89504e470d0a1a0a')

    const ls = await sbx.commands.run('ls -1R /home/user')
    assert.match(ls.stdout, /sales\.png/)
    assert.match(ls.stdout, /sales\.csv/)
    const saved = await sbx.files.read('/home/user/sales.png', { format: 'bytes' })
    assert.equal(Buffer.from(saved.subarray(0, 4)).toString('hex'), '89504e47')

    assert.equal(await sbx.kill(), true)
    assert.equal(await sbx.isRunning(), false)
  })
})

// Terminals (sandbox.pty) through the unmodified e2b SDK: create,
// sendInput, resize, kill, connect; commands see them; hostile input is
// bounded. Run by e2b_test.go.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox, CommandExitError, NotFoundError } from 'e2b'

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))
const enc = new TextEncoder()

async function withSandbox(fn) {
  const sbx = await Sandbox.create()
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

// screen collects a terminal's bytes; until waits for a match past the
// previous one (the bound is for a failing test only).
function screen() {
  const dec = new TextDecoder()
  const s = {
    text: '',
    from: 0,
    bytes: [],
    onData: (d) => {
      s.bytes.push(d)
      s.text += dec.decode(d, { stream: true })
    },
    async until(re) {
      for (let waited = 0; ; waited += 20) {
        const m = re.exec(s.text.slice(s.from))
        if (m) {
          s.from += m.index + m[0].length
          return m
        }
        if (waited > 30_000) throw new Error(`the terminal did not show ${re}; it showed ${JSON.stringify(s.text)}`)
        await sleep(20)
      }
    },
  }
  return s
}

describe('pty', () => {
  test('create, sendInput, resize, Ctrl-C, kill', async () => {
    await withSandbox(async (sbx) => {
      const s = screen()
      const term = await sbx.pty.create({ cols: 80, rows: 24, onData: s.onData, envs: { WHO: 'me' }, cwd: '/tmp' })
      assert.ok(term.pid > 0)
      // Arithmetic marks output apart from the echo of what is typed.
      await sbx.pty.sendInput(term.pid, enc.encode('tty; stty size; echo $TERM $WHO $PWD; echo m-$((6*7))\n'))
      await s.until(/\/dev\/pts\/\d+\r\n24 80\r\nxterm-256color me \/tmp\r\nm-42\r\n/)

      await sbx.pty.resize(term.pid, { cols: 120, rows: 40 })
      await sbx.pty.sendInput(term.pid, enc.encode('stty size; echo m-$((6*8))\n'))
      await s.until(/40 120\r\nm-48\r\n/)

      await sbx.pty.sendInput(term.pid, enc.encode("sh -c 'echo m-$((7*7)); exec sleep 1000'\n"))
      await s.until(/m-49\r\n/)
      await sbx.pty.sendInput(term.pid, enc.encode('\x03'))
      await sbx.pty.sendInput(term.pid, enc.encode('echo status=$?\n'))
      await s.until(/status=130\r\n/)

      // Escape sequences arrive as the program wrote them.
      await sbx.pty.sendInput(term.pid, enc.encode("printf '\\033[31m%s\\033[0m\\n' red-$((5*5))\n"))
      await s.until(/\x1b\[31mred-25\x1b\[0m\r\n/)

      assert.equal(await sbx.pty.kill(term.pid), true)
      // Gone once the kill is answered, not a zombie yet to be reaped (E2B's own kill PTY test).
      await assert.rejects(sbx.commands.run(`kill -0 ${term.pid}`), CommandExitError)
      await assert.rejects(term.wait(), (e) => e instanceof CommandExitError && e.exitCode === 137)
      assert.equal(await sbx.pty.kill(term.pid), false)
      await assert.rejects(sbx.pty.sendInput(term.pid, enc.encode('x')), NotFoundError)
      await assert.rejects(sbx.pty.resize(term.pid, { cols: 10, rows: 10 }), NotFoundError)
    })
  })

  test('connect to a running terminal; commands list and kill it; its exit code', async () => {
    await withSandbox(async (sbx) => {
      const first = screen()
      const term = await sbx.pty.create({ cols: 80, rows: 24, onData: first.onData })
      await sbx.pty.sendInput(term.pid, enc.encode('echo m-$((2*3))\n'))
      await first.until(/m-6\r\n/)
      await term.disconnect()

      const listed = await sbx.commands.list()
      const info = listed.find((p) => p.pid === term.pid)
      assert.equal(info.cmd, '/bin/bash')
      assert.deepEqual(info.args, ['-i', '-l'])

      const later = screen()
      const again = await sbx.pty.connect(term.pid, { onData: later.onData })
      await sbx.pty.sendInput(term.pid, enc.encode('echo m-$((3*3))\n'))
      await later.until(/m-9\r\n/)
      assert.ok(!later.text.includes('m-6'), 'connect streams output from now on')
      await sbx.pty.sendInput(term.pid, enc.encode('exit 3\n'))
      await assert.rejects(again.wait(), (e) => e instanceof CommandExitError && e.exitCode === 3)

      // commands.kill ends a terminal as any process.
      const other = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
      assert.equal(await sbx.commands.kill(other.pid), true)
      await assert.rejects(other.wait(), CommandExitError)
      await assert.rejects(sbx.pty.connect(other.pid), NotFoundError)
    })
  })

  test('a terminal is its sandbox\'s: another sandbox\'s pid is not reached', async () => {
    await withSandbox(async (a) => {
      await withSandbox(async (b) => {
        const s = screen()
        const term = await a.pty.create({ cols: 80, rows: 24, onData: s.onData })
        await assert.rejects(b.pty.sendInput(term.pid, enc.encode('echo nope\n')), NotFoundError)
        await assert.rejects(b.pty.resize(term.pid, { cols: 10, rows: 10 }), NotFoundError)
        await assert.rejects(b.pty.connect(term.pid), NotFoundError)
        assert.equal(await b.pty.kill(term.pid), false)
        await a.pty.sendInput(term.pid, enc.encode('echo m-$((4*4))\n'))
        await s.until(/m-16\r\n/)
        assert.ok(!s.text.includes('nope'))
        await a.pty.kill(term.pid)
      })
    })
  })

  test('megabytes of input to a terminal that does not read do not wedge the server', async () => {
    await withSandbox(async (sbx) => {
      const s = screen()
      const term = await sbx.pty.create({ cols: 80, rows: 24, onData: s.onData })
      // A line longer than the line discipline keeps: the rest is dropped.
      await sbx.pty.sendInput(term.pid, enc.encode("echo m-$((8*8)); exec sleep 1000\n"))
      await s.until(/m-64\r\n/)
      await sbx.pty.sendInput(term.pid, new Uint8Array(2 << 20).fill(0x61))
      // In raw mode, input waits for a reader that never comes: the
      // caller gives up, the server goes on serving, and the terminal is
      // still killed.
      const raw = screen()
      const rawTerm = await sbx.pty.create({ cols: 80, rows: 24, onData: raw.onData })
      await sbx.pty.sendInput(rawTerm.pid, enc.encode("stty raw -echo; echo m-$((9*9)); exec sleep 1000\n"))
      await raw.until(/m-81/)
      await assert.rejects(sbx.pty.sendInput(rawTerm.pid, new Uint8Array(2 << 20).fill(0x61), { requestTimeoutMs: 2_000 }))
      assert.equal((await sbx.commands.run('echo still-here')).stdout, 'still-here\n')
      // Over the server's bound for one message: refused at once.
      await assert.rejects(sbx.pty.sendInput(rawTerm.pid, new Uint8Array(6 << 20)))
      for (const t of [term, rawTerm]) {
        assert.equal(await sbx.pty.kill(t.pid), true)
        await assert.rejects(t.wait(), CommandExitError)
      }
    })
  })
})

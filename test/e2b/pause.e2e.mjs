// Pause, resume and auto-resume as E2B's SDKs drive them, against a
// server whose sandboxes can be paused (vivarium serve --zygote=false, with
// CRIU). Run by TestE2BPause in e2b_test.go, not with the *.test.mjs.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox } from '@e2b/code-interpreter'

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[v]) throw new Error(`${v} is not set: run this suite with go test ./test/e2b/ -run TestE2BPause`)
}

describe('pause', () => {
  test('pause keeps the kernel, files and processes; connect resumes it', async () => {
    const sbx = await Sandbox.create()
    try {
      await sbx.runCode('import json\nx = 41')
      await sbx.files.write('/home/user/note.txt', 'kept')
      // Processes the code started, and commands started through the API,
      // are paused and resumed with it.
      await sbx.runCode("import subprocess\nsubprocess.Popen(['sleep', '601'], start_new_session=True)")
      const cmd = await sbx.commands.run('sleep 602', { background: true })
      assert.equal(await sbx.pause(), true)
      // A second pause changes nothing: the SDK answers false.
      assert.equal(await sbx.pause(), false)
      const info = await Sandbox.getInfo(sbx.sandboxId)
      assert.equal(info.state, 'paused')
      // Not running until connected to, as E2B's proxy says (502).
      assert.equal(await sbx.isRunning(), false)
      const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
      assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId))
      const running = await Sandbox.list({ query: { state: ['running'] } }).nextItems()
      assert.ok(!running.some((s) => s.sandboxId === sbx.sandboxId))

      const back = await Sandbox.connect(sbx.sandboxId)
      assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
      assert.equal(await back.isRunning(), true)
      const ex = await back.runCode('x + 1')
      assert.equal(ex.error, undefined)
      assert.equal(ex.text, '42')
      assert.equal(await back.files.read('/home/user/note.txt'), 'kept')
      const ps = await back.commands.run('pgrep -a sleep')
      assert.match(ps.stdout, /sleep 601/)
      assert.match(ps.stdout, /sleep 602/)
      await cmd.kill()
    } finally {
      await sbx.kill()
    }
  })

  test('a terminal (pty) is paused with its sandbox: after connect, pty.connect reaches the same shell', async () => {
    const sbx = await Sandbox.create()
    try {
      const enc = new TextEncoder()
      const dec = new TextDecoder()
      let text = ''
      const until = async (re) => {
        for (let waited = 0; !re.test(text); waited += 20) {
          if (waited > 30_000) throw new Error(`the terminal did not show ${re}; it showed ${JSON.stringify(text)}`)
          await new Promise((r) => setTimeout(r, 20))
        }
      }
      const onData = (d) => { text += dec.decode(d, { stream: true }) }
      const term = await sbx.pty.create({ cols: 80, rows: 24, onData })
      await sbx.pty.sendInput(term.pid, enc.encode('x=kept; echo m-$((6*7))\n'))
      await until(/m-42\r\n/)
      await term.disconnect()
      assert.equal(await sbx.pause(), true)

      const back = await Sandbox.connect(sbx.sandboxId)
      text = ''
      const again = await back.pty.connect(term.pid, { onData })
      await back.pty.sendInput(term.pid, enc.encode('echo $x m-$((6*8)); tty\n'))
      await until(/kept m-48\r\n\/dev\/pts\/\d+\r\n/)
      await back.pty.sendInput(term.pid, enc.encode('exit 0\n'))
      assert.equal((await again.wait()).exitCode, 0)
    } finally {
      await sbx.kill()
    }
  })

  test('fork: copies of a running sandbox, each a sandbox of its own', async () => {
    const sbx = await Sandbox.create()
    const copies = []
    try {
      await sbx.runCode('import random\nx = 41')
      await sbx.files.write('/home/user/shared.txt', 'from the source')
      copies.push(...(await sbx.fork({ count: 2 })))
      assert.equal(copies.length, 2)
      const draws = []
      for (const [i, c] of copies.entries()) {
        assert.ok(c instanceof Sandbox, `fork ${i}: ${c}`)
        assert.notEqual(c.sandboxId, sbx.sandboxId)
        assert.equal((await c.runCode('x + 1')).text, '42')
        assert.equal(await c.files.read('/home/user/shared.txt'), 'from the source')
        await c.files.write('/home/user/mine.txt', `copy ${i}`)
        draws.push((await c.runCode('random.random()')).text)
        // Its own id, where programs look for it (the source's process started as the source's).
        assert.equal((await c.commands.run('echo $E2B_SANDBOX_ID')).stdout.trim(), c.sandboxId)
        assert.equal((await c.runCode('import os\nos.environ["E2B_SANDBOX_ID"]')).text, c.sandboxId)
      }
      assert.equal((await sbx.commands.run('echo $E2B_SANDBOX_ID')).stdout.trim(), sbx.sandboxId)
      assert.notEqual(draws[0], draws[1], 'the copies share a random future')
      assert.equal(await copies[0].files.read('/home/user/mine.txt'), 'copy 0')
      assert.equal(await sbx.files.exists('/home/user/mine.txt'), false)
      assert.equal((await sbx.runCode('x')).text, '41')
      const listed = (await Sandbox.list().nextItems()).map((s) => s.sandboxId)
      for (const c of copies) assert.ok(listed.includes(c.sandboxId))
    } finally {
      for (const c of [sbx, ...copies]) await c.kill?.().catch(() => {})
    }
  })

  test('createSnapshot: a snapshot outlives its sandbox, and Sandbox.create(snapshotId) starts from it', async () => {
    const sbx = await Sandbox.create()
    let made
    try {
      await sbx.runCode('x = 41')
      await sbx.files.write('/home/user/saved.txt', 'saved')
      const snap = await sbx.createSnapshot()
      assert.match(snap.snapshotId, /^snap_/)
      const listed = await sbx.listSnapshots().nextItems()
      assert.deepEqual(listed.map((x) => x.snapshotId), [snap.snapshotId])
      await sbx.kill()
      made = await Sandbox.create(snap.snapshotId)
      assert.equal((await made.runCode('x + 1')).text, '42')
      assert.equal((await made.commands.run('echo $E2B_SANDBOX_ID')).stdout.trim(), made.sandboxId)
      assert.equal(await made.files.read('/home/user/saved.txt'), 'saved')
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
      await assert.rejects(Sandbox.create(snap.snapshotId))
    } finally {
      await sbx.kill().catch(() => {})
      await made?.kill().catch(() => {})
    }
  })

  test('createSnapshot({name}): the name finds its newest snapshot, Sandbox.create(name) starts from it, deleteSnapshot(name) deletes them', async () => {
    const sbx = await Sandbox.create()
    const made = []
    try {
      await sbx.runCode('x = 1')
      const first = await sbx.createSnapshot({ name: 'e2e-named' })
      assert.deepEqual(first.names, ['e2e-named'])
      await sbx.runCode('x = 2')
      const second = await sbx.createSnapshot({ name: 'e2e-named' })
      assert.notEqual(second.snapshotId, first.snapshotId)
      // Listed by name as E2B's API filters: every snapshot of it, newest first.
      const byName = await Sandbox.listSnapshots({ name: 'e2e-named' }).nextItems()
      assert.deepEqual(byName.map((x) => x.snapshotId), [second.snapshotId, first.snapshotId])
      assert.deepEqual(await Sandbox.listSnapshots({ name: 'e2e-named-does-not-exist' }).nextItems(), [])
      for (const ref of ['e2e-named', 'e2e-named:latest']) {
        const m = await Sandbox.create(ref)
        made.push(m)
        assert.equal((await m.runCode('x')).text, '2', ref)
      }
      made.push(await Sandbox.create(first.snapshotId))
      assert.equal((await made.at(-1).runCode('x')).text, '1')
      await assert.rejects(sbx.createSnapshot({ name: 'Not A Name' }), /name/)
      // A paused sandbox is saved too, and stays paused.
      await sbx.pause()
      const third = await sbx.createSnapshot({ name: 'e2e-named' })
      assert.equal(await sbx.isRunning(), false)
      assert.equal((await sbx.listSnapshots().nextItems()).length, 3)
      made.push(await Sandbox.create('e2e-named'))
      assert.equal((await made.at(-1).runCode('x')).text, '2')
      assert.notEqual(third.snapshotId, second.snapshotId)
      await assert.rejects(Sandbox.create('no-such-snapshot'), /no snapshot/)
      assert.equal(await Sandbox.deleteSnapshot('e2e-named'), true)
      assert.deepEqual((await sbx.listSnapshots().nextItems()).map((x) => x.snapshotId), [])
      await assert.rejects(Sandbox.create('e2e-named'), /no snapshot/)
    } finally {
      for (const s of [sbx, ...made]) await s.kill().catch(() => {})
    }
  })

  test('lifecycle onTimeout pause: the timeout pauses it, autoResume brings it back on use', async () => {
    const sbx = await Sandbox.create({ timeoutMs: 2000, lifecycle: { onTimeout: 'pause', autoResume: true } })
    try {
      const info = await Sandbox.getInfo(sbx.sandboxId)
      assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: true })
      await sbx.runCode('y = "still here"')
      let state = 'running'
      for (let i = 0; i < 50 && state !== 'paused'; i++) {
        await new Promise((r) => setTimeout(r, 200))
        state = (await Sandbox.getInfo(sbx.sandboxId)).state
      }
      assert.equal(state, 'paused', 'the timeout did not pause the sandbox')
      // Any call resumes it.
      const ex = await sbx.runCode('y')
      assert.equal(ex.text, 'still here') // E2B's server drops a str's quotes
    } finally {
      await sbx.kill()
    }
  })
})

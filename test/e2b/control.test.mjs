// E2B's control plane, files and commands as the unmodified `e2b` SDK
// expects them: listing (order, filters, pages), connect's timeout, file
// info fields, metadata, watch order, signed URLs, metrics, the python
// command and E2B-format API keys. Run by e2b_test.go (see e2b.test.mjs).
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox, FilesystemEventType, InvalidArgumentError, NotFoundError } from 'e2b'

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY', 'VIVARIUM_OTHER_KEY']) {
  if (!process.env[v]) throw new Error(`${v} is not set: run this suite with go test ./test/e2b/`)
}
const otherKey = process.env.VIVARIUM_OTHER_KEY

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function withSandbox(opts, fn) {
  if (typeof opts === 'function') [opts, fn] = [{}, opts]
  const sbx = await Sandbox.create(opts)
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

describe('keys', () => {
  test("a key is E2B's format, and the SDK uses it with validation on", async () => {
    assert.match(process.env.E2B_API_KEY, /^e2b_[0-9a-f]{40}$/)
    assert.match(otherKey, /^e2b_[0-9a-f]{40}$/)
    await withSandbox({ validateApiKey: true }, async (sbx) => {
      assert.equal(await sbx.isRunning(), true)
    })
  })
})

describe('listing', () => {
  test('newest first by default, asc, template and startedAfter filters, pages', async () => {
    const tag = `list-${Date.now()}`
    const made = []
    try {
      for (const template of ['base', 'code-interpreter-v1', 'base']) {
        made.push(await Sandbox.create(template, { metadata: { tag } }))
      }
      const ids = made.map((s) => s.sandboxId) // oldest first
      const all = await Sandbox.list({ query: { metadata: { tag } } }).nextItems()
      assert.deepEqual(all.map((s) => s.sandboxId), [...ids].reverse())
      const asc = await Sandbox.list({ query: { metadata: { tag } }, order: 'asc' }).nextItems()
      assert.deepEqual(asc.map((s) => s.sandboxId), ids)

      const ci = await Sandbox.list({ query: { metadata: { tag }, template: 'code-interpreter-v1' } }).nextItems()
      assert.deepEqual(ci.map((s) => s.sandboxId), [ids[1]])

      const second = asc[1].startedAt
      const later = await Sandbox.list({ query: { metadata: { tag }, startedAfter: second }, order: 'asc' }).nextItems()
      // startedAt has millisecond precision in the SDK: the second is in
      // or just before the bound, the third always in.
      assert.ok(later.map((s) => s.sandboxId).includes(ids[2]))
      assert.ok(!later.map((s) => s.sandboxId).includes(ids[0]))

      // Pages of two, newest first, until there are no more.
      const pager = Sandbox.list({ query: { metadata: { tag } }, limit: 2 })
      const page1 = await pager.nextItems()
      assert.equal(pager.hasNext, true)
      const page2 = await pager.nextItems()
      assert.equal(pager.hasNext, false)
      assert.deepEqual([...page1, ...page2].map((s) => s.sandboxId), [...ids].reverse())
      // Another key's list holds none of them.
      const theirs = await Sandbox.list({ apiKey: otherKey, query: { metadata: { tag } } }).nextItems()
      assert.deepEqual(theirs, [])
    } finally {
      await Promise.all(made.map((s) => s.kill().catch(() => {})))
    }
  })
})

describe('connect', () => {
  test("a shorter timeout never shortens a sandbox's life; a longer one extends it", async () => {
    await withSandbox({ timeoutMs: 600_000 }, async (sbx) => {
      const before = (await sbx.getInfo()).endAt
      const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 5_000 })
      assert.equal((await again.getInfo()).endAt.getTime(), before.getTime())
      await Sandbox.connect(sbx.sandboxId, { timeoutMs: 1_200_000 })
      assert.ok((await sbx.getInfo()).endAt > before)
      await sleep(6_000)
      assert.equal(await sbx.isRunning(), true)
    })
  })
})

describe('files', () => {
  test('info: mode, owner, group, symlinkTarget; removing a missing file succeeds', async () => {
    await withSandbox(async (sbx) => {
      await sbx.files.makeDir('/home/user/d')
      await sbx.files.write('/home/user/d/f.txt', 'hi')
      await sbx.commands.run('chmod 600 /home/user/d/f.txt && ln -s f.txt /home/user/d/rel && ln -s /home/user/d /home/user/abs')
      const dir = await sbx.files.getInfo('/home/user/d')
      assert.equal(dir.type, 'dir')
      assert.equal(dir.mode, 0o755)
      assert.equal(dir.permissions, 'drwxr-xr-x')
      assert.equal(dir.owner, 'user')
      assert.equal(dir.group, 'user')
      assert.equal(dir.symlinkTarget, undefined)
      const file = await sbx.files.getInfo('/home/user/d/f.txt')
      assert.equal(file.mode, 0o600)
      assert.equal(file.permissions, '-rw-------')
      const rel = await sbx.files.getInfo('/home/user/d/rel')
      assert.equal(rel.type, 'symlink')
      assert.equal(rel.symlinkTarget, '/home/user/d/f.txt')
      const listed = await sbx.files.list('/home/user')
      assert.equal(listed.find((e) => e.name === 'abs').symlinkTarget, '/home/user/d')

      await sbx.files.remove('/home/user/never-was')
      await sbx.files.remove('/home/user/d/f.txt')
      await sbx.files.remove('/home/user/d/f.txt')
      assert.equal(await sbx.files.exists('/home/user/d/f.txt'), false)
    })
  })

  test('metadata: on write, info, list and rename; cleared by a rewrite; set inside; bounded', async () => {
    await withSandbox(async (sbx) => {
      const metadata = { author: 'mish', purpose: 'upload' }
      const w = await sbx.files.write('m.txt', 'x', { metadata })
      assert.deepEqual(w.metadata, metadata)
      assert.deepEqual((await sbx.files.getInfo('m.txt')).metadata, metadata)
      const octet = await sbx.files.write('o.txt', 'x', { metadata, useOctetStream: true })
      assert.deepEqual(octet.metadata, metadata)
      const many = await sbx.files.writeFiles([{ path: 'a.txt', data: 'a' }, { path: 'b.txt', data: 'b' }], { metadata: { source: 'suite' } })
      for (const f of many) assert.deepEqual((await sbx.files.getInfo(f.path)).metadata, { source: 'suite' })
      const entry = (await sbx.files.list('/home/user')).find((e) => e.name === 'm.txt')
      assert.deepEqual(entry.metadata, metadata)
      assert.deepEqual((await sbx.files.rename('m.txt', 'n.txt')).metadata, metadata)
      // Rewritten without metadata: none left.
      assert.equal((await sbx.files.write('n.txt', 'y')).metadata, undefined)
      assert.equal((await sbx.files.getInfo('n.txt')).metadata, undefined)
      // What code in the sandbox sets as user.e2b.* is metadata too.
      await sbx.commands.run(`python3 -c "import os; os.setxattr('/home/user/n.txt', 'user.e2b.author', b'inside')"`)
      assert.deepEqual((await sbx.files.getInfo('n.txt')).metadata, { author: 'inside' })
      // setfattr (Debian's attr, which scripts/deps.sh installs), as E2B's own test uses it.
      await sbx.commands.run('setfattr -n user.e2b.tool -v setfattr /home/user/n.txt')
      assert.deepEqual((await sbx.files.getInfo('n.txt')).metadata, { author: 'inside', tool: 'setfattr' })
      // Bounds: too long a value, too many keys.
      await assert.rejects(sbx.files.write('big.txt', 'x', { metadata: { k: 'v'.repeat(2000) } }), InvalidArgumentError)
      const tooMany = Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`k${i}`, 'v']))
      await assert.rejects(sbx.files.write('many.txt', 'x', { metadata: tooMany }), InvalidArgumentError)
      assert.equal(await sbx.files.exists('big.txt'), false)
    })
  })

  test("hostile metadata: what the sandbox sets beyond the bounds, or on links, is not reported", async () => {
    await withSandbox(async (sbx) => {
      await sbx.files.write('f.txt', 'x')
      await sbx.commands.run(`python3 -c "
import os
for i in range(60):
    os.setxattr('/home/user/f.txt', 'user.e2b.k%02d' % i, (b'v' * 2000) if i % 2 else b'small')
os.symlink('/etc/passwd', '/home/user/link')
"`)
      const md = (await sbx.files.getInfo('f.txt')).metadata
      const keys = Object.keys(md)
      assert.ok(keys.length > 0 && keys.length <= 32, `${keys.length} keys`)
      assert.ok(Object.values(md).every((v) => v === 'small'))
      const link = await sbx.files.getInfo('link')
      assert.equal(link.metadata, undefined)
      assert.equal(link.symlinkTarget, '/etc/passwd')
    })
  })

  test('a watch reports a new file as created, then written', async () => {
    await withSandbox(async (sbx) => {
      await sbx.files.makeDir('/home/user/w')
      const events = []
      let seen
      const written = new Promise((resolve) => (seen = resolve))
      const handle = await sbx.files.watchDir('/home/user/w', (e) => {
        events.push(`${e.type} ${e.name}`)
        if (e.type === FilesystemEventType.WRITE && e.name === 'new.txt') seen()
      })
      await sbx.files.write('/home/user/w/new.txt', 'content')
      await written
      await handle.stop()
      assert.ok(events.indexOf('create new.txt') >= 0 && events.indexOf('create new.txt') < events.indexOf('write new.txt'), `${events}`)
    })
  })

  test('signed URLs: download and upload, expired, forged, another path or sandbox', async () => {
    const a = await Sandbox.create({ secure: true })
    const b = await Sandbox.create({ secure: true })
    try {
      await a.files.write('hello.txt', 'hello world')
      await a.files.write('secret.txt', 'secret')
      await b.files.write('hello.txt', 'b says hi')

      const url = await a.downloadUrl('hello.txt', { useSignatureExpiration: 10_000 })
      assert.ok(new URL(url).searchParams.get('signature').startsWith('v1_'))
      let res = await fetch(url)
      assert.equal(res.status, 200)
      assert.equal(await res.text(), 'hello world')
      res = await fetch(await a.downloadUrl('hello.txt'))
      assert.equal(await res.text(), 'hello world')

      res = await fetch(await a.downloadUrl('hello.txt', { useSignatureExpiration: -10_000 }))
      assert.equal(res.status, 401)
      assert.deepEqual(await res.json(), { code: 401, message: 'signature is already expired' })

      const up = await a.uploadUrl('up.txt', { useSignatureExpiration: 10_000 })
      const form = new FormData()
      form.append('file', 'file content')
      res = await fetch(up, { method: 'POST', body: form })
      assert.equal(res.status, 200)
      assert.deepEqual(await res.json(), [{ name: 'up.txt', path: '/home/user/up.txt', type: 'file' }])
      assert.equal(await a.files.read('up.txt'), 'file content')

      const refused = async (u, init) => {
        const r = await fetch(u, init)
        assert.equal(r.status, 401, `${u}: ${r.status}`)
      }
      // Forged, or used for another path, expiry or operation.
      const forged = new URL(url)
      forged.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
      await refused(forged)
      const otherPath = new URL(url)
      otherPath.searchParams.set('path', 'secret.txt')
      await refused(otherPath)
      const longer = new URL(url)
      longer.searchParams.set('signature_expiration', String(Number(longer.searchParams.get('signature_expiration')) + 3600))
      await refused(longer)
      await refused(url, { method: 'POST', body: form })
      // b's URL opens b's file, never a's.
      res = await fetch(await b.downloadUrl('hello.txt'))
      assert.equal(await res.text(), 'b says hi')
      // A killed sandbox's URL opens nothing.
      await a.kill()
      await refused(url)
    } finally {
      await a.kill().catch(() => {})
      await b.kill().catch(() => {})
    }
  })
})

describe('metrics', () => {
  test('getMetrics: CPU, memory and disk, at once and over time', async () => {
    await withSandbox(async (sbx) => {
      await sbx.commands.run('python3 -c "x = bytearray(48 << 20); open(\'/tmp/d\', \'wb\').write(x)"')
      const m = await sbx.getMetrics()
      assert.ok(m.length >= 1)
      const now = m[m.length - 1]
      assert.ok(now.timestamp instanceof Date)
      assert.ok(now.cpuCount > 0)
      assert.ok(now.memTotal > 0 && now.memUsed > 0 && now.memUsed <= now.memTotal, JSON.stringify(now))
      assert.ok(now.diskUsed >= 48 << 20 && now.diskUsed <= now.diskTotal, JSON.stringify(now))
      const same = await Sandbox.getMetrics(sbx.sandboxId, { start: new Date(Date.now() - 60_000) })
      assert.ok(same.length >= 1)
      await assert.rejects(Sandbox.getMetrics(sbx.sandboxId, { apiKey: otherKey }), NotFoundError)
    })
  })
})

describe('commands', () => {
  test('python is a command', async () => {
    await withSandbox(async (sbx) => {
      assert.equal((await sbx.commands.run('python -c "print(6 * 7)"')).stdout, '42\n')
      assert.match((await sbx.commands.run('python --version')).stdout, /^Python 3\./)
    })
  })
})

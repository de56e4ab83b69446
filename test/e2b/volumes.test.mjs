// E2B's volumes with the unmodified `e2b` SDK: the Volume API (create,
// connect, list, getInfo, destroy; files without a sandbox through the
// volume content API) and volumeMounts on Sandbox.create. The server runs
// with --volume-size 32MiB. Run by e2b_test.go (see e2b.test.mjs).
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox, Volume, VolumeNotFoundError, VolumePathNotFoundError, VolumeFileType } from 'e2b'

for (const v of ['E2B_API_URL', 'E2B_VOLUME_API_URL', 'E2B_API_KEY', 'VIVARIUM_OTHER_KEY']) {
  if (!process.env[v]) throw new Error(`${v} is not set: run this suite with go test ./test/e2b/`)
}
const otherKey = process.env.VIVARIUM_OTHER_KEY

const unique = (p) => `${p}-${Date.now()}-${Math.floor(Math.random() * 1e6)}`

describe('volumes', () => {
  test('create, connect, list, files without a sandbox, destroy', async () => {
    const name = unique('files')
    const vol = await Volume.create(name)
    try {
      assert.equal(vol.name, name)
      assert.ok(vol.volumeId && vol.token)
      const listed = await Volume.list()
      assert.ok(listed.some((v) => v.volumeId === vol.volumeId && v.name === name))
      const info = await Volume.getInfo(vol.volumeId)
      assert.equal(info.name, name)

      const w = await vol.writeFile('/dir/hello.txt', 'hello volume')
      assert.equal(w.type, VolumeFileType.FILE)
      assert.equal(w.path, '/dir/hello.txt')
      assert.equal(w.size, 12)
      assert.equal(w.uid, 1000)
      assert.equal(await vol.readFile('/dir/hello.txt'), 'hello volume')
      const bytes = await vol.readFile('dir/hello.txt', { format: 'bytes' })
      assert.equal(Buffer.from(bytes).toString(), 'hello volume')

      const d = await vol.makeDir('/other/deep', { mode: 0o700 })
      assert.equal(d.type, VolumeFileType.DIRECTORY)
      assert.equal(d.mode, 0o700)
      const entries = await vol.list('/')
      assert.deepEqual(entries.map((e) => e.name).sort(), ['dir', 'other'])
      assert.ok(entries.every((e) => e.mtime instanceof Date))
      assert.equal(await vol.exists('/dir/hello.txt'), true)
      assert.equal(await vol.exists('/nope'), false)
      await assert.rejects(vol.readFile('/nope'), VolumePathNotFoundError)

      const m = await vol.updateMetadata('/dir/hello.txt', { mode: 0o600 })
      assert.equal(m.mode, 0o600)
      await vol.remove('/dir')
      assert.equal(await vol.exists('/dir/hello.txt'), false)

      // Connecting by ID gives a working token.
      const again = await Volume.connect(vol.volumeId)
      await again.writeFile('x', 'y')
      assert.equal(await vol.readFile('/x'), 'y')
    } finally {
      assert.equal(await Volume.destroy(vol.volumeId), true)
    }
    await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
    assert.equal(await Volume.destroy(vol.volumeId), false)
  })

  test('names are checked', async () => {
    for (const bad of ['../x', '/', 'a/b', '..', 'x'.repeat(64)]) {
      await assert.rejects(Volume.create(bad), /volume name/, bad)
    }
  })

  test('mounted by two sandboxes at once, outliving them, within its size', async () => {
    const name = unique('shared')
    const vol = await Volume.create(name)
    await vol.writeFile('/from-api.txt', 'written before any sandbox')
    const a = await Sandbox.create({ volumeMounts: { '/home/user/data': vol } })
    const b = await Sandbox.create({ volumeMounts: { '/mnt/shared': name } })
    try {
      const info = await a.getInfo()
      assert.deepEqual(info.volumeMounts, [{ name, path: '/home/user/data' }])
      assert.equal(await a.files.read('/home/user/data/from-api.txt'), 'written before any sandbox')
      await a.files.write('/home/user/data/from-a.txt', 'hello from a')
      const r = await b.commands.run('cat /mnt/shared/from-a.txt; echo; stat -c %U /mnt/shared/from-a.txt')
      assert.equal(r.stdout, 'hello from a\nuser\n')
      await b.commands.run('echo from-b > /mnt/shared/from-b.txt')
      assert.equal(await a.files.read('/home/user/data/from-b.txt'), 'from-b\n')

      // Past its size (32 MiB here): no space, in the sandbox.
      const dd = await a.commands.run('dd if=/dev/zero of=/home/user/data/big bs=1M count=64 2>&1; true')
      assert.match(dd.stdout, /No space left on device/)
      await a.commands.run('rm -f /home/user/data/big')

      // A link pointing out is the sandbox's own business: the content
      // API does not follow it.
      await a.commands.run('ln -s /etc/shadow /home/user/data/shadow; ln -s ../../../../etc /home/user/data/up')
      await assert.rejects(vol.readFile('/shadow'))
      await assert.rejects(vol.readFile('/up/passwd'))
      await assert.rejects(vol.writeFile('/up/evil', 'x'))

      // In use: not destroyed.
      await assert.rejects(Volume.destroy(vol.volumeId), /in use|mounted/)
    } finally {
      await a.kill()
      await b.kill()
    }
    assert.equal(await vol.readFile('/from-b.txt'), 'from-b\n')
    const c = await Sandbox.create({ volumeMounts: { '/home/user/again': vol } })
    try {
      assert.equal(await c.files.read('/home/user/again/from-a.txt'), 'hello from a')
    } finally {
      await c.kill()
    }
    assert.equal(await Volume.destroy(vol.volumeId), true)
  })

  test("another key's volume is invisible and cannot be mounted", async () => {
    const name = unique('mine')
    const vol = await Volume.create(name)
    try {
      await assert.rejects(Volume.getInfo(vol.volumeId, { apiKey: otherKey }), VolumeNotFoundError)
      assert.equal(await Volume.destroy(vol.volumeId, { apiKey: otherKey }), false)
      assert.ok(!(await Volume.list({ apiKey: otherKey })).some((v) => v.volumeId === vol.volumeId))
      await assert.rejects(Sandbox.create({ apiKey: otherKey, volumeMounts: { '/mnt/x': name } }), /not found|no volume/i)
      await assert.rejects(Sandbox.create({ apiKey: otherKey, volumeMounts: { '/mnt/x': vol.volumeId } }), /not found|no volume/i)
      // Its key is not this volume's token.
      const stolen = new Volume(vol.volumeId, name, otherKey)
      await assert.rejects(stolen.readFile('/x'))
      await assert.rejects(stolen.writeFile('/x', 'x'))
    } finally {
      await Volume.destroy(vol.volumeId)
    }
  })

  test('mount paths are checked', async () => {
    const name = unique('paths')
    await Volume.create(name)
    try {
      for (const p of ['/etc', '/', '/usr/lib/x', '/proc/x', 'relative']) {
        await assert.rejects(Sandbox.create({ volumeMounts: { [p]: name } }), /mount path/, p)
      }
    } finally {
      const v = (await Volume.list()).find((v) => v.name === name)
      await Volume.destroy(v.volumeId)
    }
  })
})

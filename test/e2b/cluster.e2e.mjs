// E2B's SDKs through a cluster's gateway (docs/kubernetes.md): a sandbox
// made there, its code, files and commands reached through the gateway
// on the node its id names. Run by TestCluster in cmd/vivarium, with
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set to the gateway's.
import { test } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox } from '@e2b/code-interpreter'

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[v]) throw new Error(`${v} is not set: run go test ./cmd/vivarium -run TestCluster`)
}

test('a sandbox through the gateway', async () => {
  const sbx = await Sandbox.create()
  try {
    assert.match(sbx.sandboxId, /^sb_[a-z0-9-]+_[0-9a-f]{24}$/)
    await sbx.runCode('x = 41')
    assert.equal((await sbx.runCode('x + 1')).text, '42')
    await sbx.files.write('/home/user/note.txt', 'kept')
    assert.equal(await sbx.files.read('/home/user/note.txt'), 'kept')
    assert.equal((await sbx.commands.run('cat /home/user/note.txt')).stdout, 'kept')
    const listed = await Sandbox.list().nextItems()
    assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId))
    const back = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await back.runCode('x')).text, '41')
  } finally {
    await sbx.kill()
  }
  assert.equal((await Sandbox.list().nextItems()).some((s) => s.sandboxId === sbx.sandboxId), false)
})

test('signed file URLs through the gateway: the node of their sandbox', async () => {
  const sbx = await Sandbox.create({ secure: true })
  try {
    await sbx.files.write('hello.txt', 'hello world')
    let res = await fetch(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: 10_000 }))
    assert.equal(res.status, 200)
    assert.equal(await res.text(), 'hello world')
    const form = new FormData()
    form.append('file', 'file content')
    res = await fetch(await sbx.uploadUrl('up.txt'), { method: 'POST', body: form })
    assert.equal(res.status, 200)
    assert.equal(await sbx.files.read('up.txt'), 'file content')
    const forged = new URL(await sbx.downloadUrl('hello.txt'))
    forged.searchParams.set('signature', 'v1_' + 'A'.repeat(43))
    res = await fetch(forged)
    assert.equal(res.status, 401)
  } finally {
    await sbx.kill()
  }
})

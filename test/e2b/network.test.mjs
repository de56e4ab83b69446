// E2B's network settings (allowInternetAccess, network.allowOut and
// denyOut, updateNetwork) with the unmodified SDK, against a server whose
// operator allows two hosts of the test's own (VIVARIUM_NET_A and _B,
// HTTP servers on private addresses) and not a third
// (VIVARIUM_NET_OUTSIDE). Run by network_test.go, which makes the hosts
// and starts the server; the main run, without them, skips this file.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox, SandboxError, NotFoundError, ALL_TRAFFIC } from 'e2b'

const A = process.env.VIVARIUM_NET_A
const B = process.env.VIVARIUM_NET_B
const OUTSIDE = process.env.VIVARIUM_NET_OUTSIDE
const skip = !A && 'needs the test hosts of network_test.go (go test ./test/e2b/ -run TestE2BNetwork)'
const ip = (hostPort) => hostPort?.split(':')[0]

async function withSandbox(opts, fn) {
  const sbx = await Sandbox.create(opts)
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

// fetch gets a test host's hello.txt from inside the sandbox with curl
// (through the sandbox's proxy, as HTTP_PROXY says) and answers the
// status and the body: the host's greeting, or the proxy's refusal.
async function fetch(sbx, hostPort) {
  const r = await sbx.commands.run(`curl -s -m 20 -w '\\n%{http_code}' http://${hostPort}/hello.txt`)
  const lines = r.stdout.trimEnd().split('\n')
  return { status: Number(lines.pop()), body: lines.join('\n') }
}

async function reaches(sbx, hostPort) {
  const { status, body } = await fetch(sbx, hostPort)
  assert.equal(status, 200, `${hostPort}: ${status} ${body}`)
  assert.match(body, /^hello from vivtest-/)
}

async function refused(sbx, hostPort, why) {
  const { status, body } = await fetch(sbx, hostPort)
  assert.equal(status, 403, `${hostPort}: ${status} ${body}`)
  assert.ok(body.includes(why), `${hostPort}: ${body} does not say ${why}`)
}

describe('network per sandbox', { skip }, () => {
  test('by default a sandbox reaches what the operator allows, and nothing else', async () => {
    await withSandbox({}, async (sbx) => {
      await reaches(sbx, A)
      await reaches(sbx, B)
      await refused(sbx, OUTSIDE, "is not in this sandbox's network allowlist")
      const info = await sbx.getInfo()
      assert.equal(info.allowInternetAccess, true)
      assert.equal(info.network, undefined)
    })
  })

  test('allowInternetAccess: false reaches nothing', async () => {
    await withSandbox({ allowInternetAccess: false }, async (sbx) => {
      await refused(sbx, A, "in this sandbox's deny list")
      await refused(sbx, B, "in this sandbox's deny list")
      assert.equal((await sbx.getInfo()).allowInternetAccess, false)
    })
  })

  test('denyOut all traffic with allowOut: only what allowOut lists', async () => {
    await withSandbox({ network: { denyOut: ({ allTraffic }) => [allTraffic], allowOut: [ip(A)] } }, async (sbx) => {
      await reaches(sbx, A)
      await refused(sbx, B, "in this sandbox's deny list")
      const info = await sbx.getInfo()
      assert.equal(info.allowInternetAccess, true)
      assert.deepEqual(info.network.allowOut, [ip(A)])
      assert.deepEqual(info.network.denyOut, [ALL_TRAFFIC])
    })
  })

  test('denyOut by IP and by CIDR narrows the operator list; the rest stays', async () => {
    await withSandbox({ network: { denyOut: [ip(B)] } }, async (sbx) => {
      await reaches(sbx, A)
      await refused(sbx, B, "in this sandbox's deny list")
    })
    // B's /30 (its own address within it, not A's).
    await withSandbox({ network: { denyOut: [`${ip(B)}/30`] } }, async (sbx) => {
      await reaches(sbx, A)
      await refused(sbx, B, "in this sandbox's deny list")
    })
  })

  test('allowOut takes precedence over denyOut, as E2B has it', async () => {
    await withSandbox({ network: { denyOut: [ALL_TRAFFIC, ip(A)], allowOut: [ip(A), ip(B)] } }, async (sbx) => {
      await reaches(sbx, A)
      await reaches(sbx, B)
    })
  })

  test('a host outside the operator list stays unreachable whatever the sandbox asks', async () => {
    await assert.rejects(
      Sandbox.create({ network: { denyOut: [ALL_TRAFFIC], allowOut: [ip(OUTSIDE)] } }),
      (e) => e instanceof SandboxError && e.message.startsWith('403') && e.message.includes("not within the server's allowlist"),
    )
    await withSandbox({}, async (sbx) => {
      await assert.rejects(sbx.updateNetwork({ allowOut: [ip(OUTSIDE)] }), (e) => e.message.includes("not within the server's allowlist"))
      await assert.rejects(sbx.updateNetwork({ allowOut: ['evil.test'] }), (e) => e.message.startsWith('403'))
      await refused(sbx, OUTSIDE, "is not in this sandbox's network allowlist")
      // A refused update changed nothing.
      await reaches(sbx, A)
    })
  })

  test('updateNetwork applies to the next connection, and replaces rather than merges', async () => {
    await withSandbox({}, async (sbx) => {
      await reaches(sbx, A)
      await sbx.updateNetwork({ denyOut: [ip(A)] })
      await refused(sbx, A, "in this sandbox's deny list")
      await reaches(sbx, B)
      assert.deepEqual((await sbx.getInfo()).network.denyOut, [ip(A)])

      await sbx.updateNetwork({ allowInternetAccess: false })
      await refused(sbx, B, "in this sandbox's deny list")
      assert.equal((await sbx.getInfo()).allowInternetAccess, false)

      await sbx.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: [ip(B)] })
      await refused(sbx, A, "in this sandbox's deny list")
      await reaches(sbx, B)

      // Omitted fields clear what was set: back to the operator's list.
      await sbx.updateNetwork({})
      await reaches(sbx, A)
      await reaches(sbx, B)
      assert.equal((await sbx.getInfo()).network, undefined)
    })
  })

  test('a sandbox made without internet access can be given it later', async () => {
    await withSandbox({ allowInternetAccess: false }, async (sbx) => {
      await refused(sbx, A, "in this sandbox's deny list")
      await sbx.updateNetwork({ allowInternetAccess: true })
      await reaches(sbx, A)
    })
  })

  test("another key cannot change a sandbox's network", async () => {
    await withSandbox({ network: { denyOut: [ALL_TRAFFIC] } }, async (sbx) => {
      await assert.rejects(
        Sandbox.updateNetwork(sbx.sandboxId, {}, { apiKey: process.env.VIVARIUM_OTHER_KEY }),
        NotFoundError,
      )
      await refused(sbx, A, "in this sandbox's deny list")
    })
  })

  test('settings vivarium cannot honour are refused by name', async () => {
    await assert.rejects(
      Sandbox.create({ network: { egressProxy: { address: 'proxy.example.com:1080' } } }),
      (e) => e.message.startsWith('501') && e.message.includes('egress proxy'),
    )
    await withSandbox({}, async (sbx) => {
      await assert.rejects(
        sbx.updateNetwork({ rules: { 'api.example.com': [{ transform: { headers: { 'X-A': 'b' } } }] } }),
        (e) => e.message.startsWith('501') && e.message.includes('per-host rules'),
      )
    })
  })
})

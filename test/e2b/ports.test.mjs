// A sandbox's ports, as E2B's users reach them: a server started in the
// sandbox, getHost(port), and a fetch with the sandbox's trafficAccessToken
// in E2B's header. The server runs with --domain vivarium.test; every name
// under it "resolves" to the server (VIVARIUM_URL): the requests are sent
// there, with the preview host in their Host header, as a wildcard DNS
// record would have them.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import net from 'node:net'

import { Agent, fetch, WebSocket } from 'undici'
import { Sandbox } from 'e2b'

const serverURL = process.env.VIVARIUM_URL ? new URL(process.env.VIVARIUM_URL) : null
const domain = process.env.VIVARIUM_DOMAIN
const skip = !serverURL || !domain ? 'VIVARIUM_URL and VIVARIUM_DOMAIN are not set (run with go test ./test/e2b/)' : false

// Wildcard DNS for *.<domain>, pointing at the server.
const dispatcher = new Agent({
  connect: (_opts, cb) => {
    const s = net.connect({ host: serverURL.hostname, port: Number(serverURL.port) })
    s.once('connect', () => cb(null, s))
    s.once('error', (e) => cb(e))
    return s
  },
})

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

function get(url, headers = {}) {
  return fetch(url, { headers, dispatcher, redirect: 'manual' })
}

// waitFor fetches url until the server in the sandbox answers.
async function waitFor(url, token) {
  for (let i = 0; i < 300; i++) {
    const res = await get(url, { 'e2b-traffic-access-token': token })
    if (res.status !== 502) return res
    await res.arrayBuffer()
    await sleep(100)
  }
  throw new Error(`${url} never answered`)
}

// A WebSocket echo server, standard library only.
const wsServer = `
import base64, hashlib, socket, sys, threading
def handle(c):
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        data += c.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in data.split(b"\\r\\n") if l.lower().startswith(b"sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: " + accept + b"\\r\\n\\r\\n")
    while True:
        head = c.recv(2)
        if len(head) < 2 or head[0] & 15 == 8:
            return
        n = head[1] & 127
        mask = c.recv(4)
        payload = b""
        while len(payload) < n:
            payload += c.recv(n - len(payload))
        out = b"echo " + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        c.sendall(bytes([0x81, len(out)]) + out)
s = socket.create_server(("0.0.0.0", int(sys.argv[1])))
while True:
    conn, _ = s.accept()
    threading.Thread(target=handle, args=(conn,), daemon=True).start()
`

describe('ports (getHost)', { skip }, () => {
  test('a server started in the sandbox answers at getHost(port), with the traffic token only', async () => {
    const sbx = await Sandbox.create()
    const other = await Sandbox.create()
    try {
      await sbx.files.write('/home/user/index.html', 'hello from the sandbox')
      await sbx.commands.run('python3 -m http.server 8000', { background: true, cwd: '/home/user' })
      const host = sbx.getHost(8000)
      assert.equal(host, `8000-${sbx.sandboxId}.${domain}`)
      assert.ok(sbx.trafficAccessToken, 'the sandbox has a traffic access token')

      const res = await waitFor(`http://${host}/index.html`, sbx.trafficAccessToken)
      assert.equal(res.status, 200)
      assert.equal(await res.text(), 'hello from the sandbox')

      // Never without a token, nor with another sandbox's.
      for (const headers of [{}, { 'e2b-traffic-access-token': other.trafficAccessToken },
        { 'e2b-traffic-access-token': 'x' + sbx.trafficAccessToken }]) {
        const r = await get(`http://${host}/index.html`, headers)
        assert.equal(r.status, 403)
        assert.doesNotMatch(await r.text(), /hello from the sandbox/)
      }
      // The other sandbox's host with this sandbox's token.
      const r = await get(`http://${other.getHost(8000)}/`, { 'e2b-traffic-access-token': sbx.trafficAccessToken })
      assert.equal(r.status, 403)
      await r.arrayBuffer()

      // A port nothing listens on.
      const closed = await get(`http://${sbx.getHost(8001)}/`, { 'e2b-traffic-access-token': sbx.trafficAccessToken })
      assert.equal(closed.status, 502)
      assert.match((await closed.json()).error.message, /nothing listens/)
    } finally {
      await sbx.kill().catch(() => {})
      await other.kill().catch(() => {})
    }
  })

  test("another key's sandbox: its token opens only its own ports", async () => {
    const mine = await Sandbox.create()
    const theirs = await Sandbox.create({ apiKey: process.env.VIVARIUM_OTHER_KEY })
    try {
      await mine.commands.run('python3 -m http.server 8000', { background: true, cwd: '/home/user' })
      const res = await waitFor(`http://${mine.getHost(8000)}/`, mine.trafficAccessToken)
      assert.equal(res.status, 200)
      await res.arrayBuffer()
      const r = await get(`http://${mine.getHost(8000)}/`, { 'e2b-traffic-access-token': theirs.trafficAccessToken })
      assert.equal(r.status, 403)
      await r.arrayBuffer()
    } finally {
      await mine.kill().catch(() => {})
      await theirs.kill().catch(() => {})
    }
  })

  test('a WebSocket to the sandbox', async () => {
    const sbx = await Sandbox.create()
    try {
      await sbx.files.write('/home/user/ws.py', wsServer)
      await sbx.commands.run('python3 ws.py 9000', { background: true, cwd: '/home/user' })
      const url = `ws://${sbx.getHost(9000)}/`
      let reply
      for (let i = 0; i < 300 && reply === undefined; i++) {
        reply = await new Promise((resolve) => {
          const ws = new WebSocket(url, { dispatcher, headers: { 'e2b-traffic-access-token': sbx.trafficAccessToken } })
          ws.onopen = () => ws.send('ping')
          ws.onmessage = (e) => {
            resolve(e.data)
            ws.close()
          }
          ws.onerror = () => resolve(undefined)
        })
        if (reply === undefined) await sleep(100)
      }
      assert.equal(reply, 'echo ping')
      // Without the token the handshake is refused.
      const refused = await new Promise((resolve) => {
        const ws = new WebSocket(url, { dispatcher })
        ws.onopen = () => resolve('opened')
        ws.onerror = () => resolve('refused')
      })
      assert.equal(refused, 'refused')
    } finally {
      await sbx.kill().catch(() => {})
    }
  })

  test('a killed sandbox has no ports', async () => {
    const sbx = await Sandbox.create()
    await sbx.commands.run('python3 -m http.server 8000', { background: true, cwd: '/home/user' })
    const host = sbx.getHost(8000)
    const res = await waitFor(`http://${host}/`, sbx.trafficAccessToken)
    await res.arrayBuffer()
    await sbx.kill()
    const r = await get(`http://${host}/`, { 'e2b-traffic-access-token': sbx.trafficAccessToken })
    assert.equal(r.status, 404)
    await r.arrayBuffer()
  })

  test('httpsPorts: the server reaches an HTTPS server in the sandbox; maskRequestHost sets the Host it sees', async () => {
    const sbx = await Sandbox.create({ network: { httpsPorts: [8443, 8000], maskRequestHost: 'app-${PORT}.internal' } })
    try {
      const info = await sbx.getInfo()
      assert.deepEqual(info.network?.httpsPorts, [8443, 8000])
      assert.equal(info.network?.maskRequestHost, 'app-${PORT}.internal')
      // A self-signed certificate, and a server that answers with the
      // Host it was sent.
      const made = await sbx.commands.run('openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=sandbox ' +
        '-keyout key.pem -out cert.pem', { cwd: '/home/user' })
      assert.equal(made.exitCode, 0)
      await sbx.files.write('/home/user/tls.py', `
import http.server, ssl
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("tls host=" + self.headers["Host"]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
s = http.server.HTTPServer(("0.0.0.0", 8443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("cert.pem", "key.pem")
s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()
`)
      await sbx.commands.run('python3 tls.py', { background: true, cwd: '/home/user' })
      const res = await waitFor(`http://${sbx.getHost(8443)}/`, sbx.trafficAccessToken)
      assert.equal(res.status, 200)
      assert.equal(await res.text(), 'tls host=app-8443.internal')
      // A plain HTTP server on a port set to TLS: a clear 502, no hang.
      await sbx.commands.run('python3 -m http.server 8000', { background: true, cwd: '/home/user' })
      let body = ''
      for (let i = 0; i < 100 && !body.includes('speak TLS'); i++) {
        const r = await get(`http://${sbx.getHost(8000)}/`, { 'e2b-traffic-access-token': sbx.trafficAccessToken })
        assert.equal(r.status, 502)
        body = await r.text()
        if (!body.includes('speak TLS')) await sleep(100)
      }
      assert.match(body, /port 8000 was set to speak TLS, and its server did not/)
    } finally {
      await sbx.kill().catch(() => {})
    }
  })
})

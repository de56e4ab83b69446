// Vivarium's MCP server, driven by the official TypeScript SDK as an agent
// would: over stdio (spawning `vivarium mcp`) and over streamable HTTP (a
// real `vivarium serve` with an API key). mcp_test.go builds the binary,
// starts the server and runs this file with the environment below.
//
//   VIVARIUM_BIN         the vivarium binary
//   VIVARIUM_STDIO_ARGS  JSON array of extra arguments for `vivarium mcp`
//   VIVARIUM_URL         base URL of the running server
//   VIVARIUM_API_KEY     a key of that server
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set: run these tests through "go test ./test/mcp"`);
  return v;
};

const TOOLS = ['close_sandbox', 'create_sandbox', 'fetch_port', 'fork_sandbox', 'list_files', 'pause_sandbox', 'read_file', 'resume_sandbox', 'run_code', 'run_python', 'run_shell', 'snapshot_sandbox', 'write_file'];

const texts = (res) => res.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n');

async function call(client, name, args) {
  return client.callTool({ name, arguments: args });
}

// What an agent does in a session: discover the tools, compute, keep state
// in one sandbox, draw a chart, hit an error, use files.
async function exercise(client) {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), TOOLS);
  const runPython = tools.find((t) => t.name === 'run_python');
  assert.match(runPython.description, /create_sandbox/);
  assert.equal(runPython.inputSchema.type, 'object');
  assert.deepEqual(runPython.inputSchema.required, ['code']);
  assert.ok(runPython.inputSchema.properties.code.description.length > 20);

  // One-shot.
  let res = await call(client, 'run_python', { code: 'print(sum(range(10)))' });
  assert.ok(!res.isError, texts(res));
  assert.match(texts(res), /stdout:\n45\n/);

  // State across calls in one sandbox.
  res = await call(client, 'create_sandbox', {});
  const id = res.structuredContent.sandbox_id;
  assert.match(id, /^sb_[0-9a-f]+$/);
  res = await call(client, 'run_python', { sandbox_id: id, code: 'import statistics\ndata = [3, 1, 4, 1, 5, 9, 2, 6]' });
  assert.ok(!res.isError, texts(res));
  res = await call(client, 'run_python', { sandbox_id: id, code: 'statistics.mean(data)' });
  assert.ok(!res.isError, texts(res));
  assert.match(texts(res), /Out\[2\]:\n3\.875/);

  // A chart comes back as image content.
  res = await call(client, 'run_python', {
    sandbox_id: id,
    code: [
      'import matplotlib.pyplot as plt',
      'fig, ax = plt.subplots()',
      'ax.bar(range(len(data)), data)',
      'ax.set_title("data")',
      'fig.savefig("chart.png")',
      'print("saved")',
    ].join('\n'),
  });
  assert.ok(!res.isError, texts(res));
  const images = res.content.filter((c) => c.type === 'image');
  assert.equal(images.length, 1, JSON.stringify(res.content).slice(0, 300));
  assert.equal(images[0].mimeType, 'image/png');
  const png = Buffer.from(images[0].data, 'base64');
  assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  assert.ok(png.length > 1000);

  // Files the code wrote.
  res = await call(client, 'list_files', { sandbox_id: id });
  assert.match(texts(res), /chart\.png {2}\(\d+ bytes\)/);
  res = await call(client, 'read_file', { sandbox_id: id, path: 'chart.png' });
  assert.equal(res.content[0].type, 'image');
  await call(client, 'write_file', { sandbox_id: id, path: 'notes/a.txt', content: 'hello from the agent' });
  res = await call(client, 'run_shell', { sandbox_id: id, command: 'cat notes/a.txt && ls' });
  assert.match(texts(res), /hello from the agent/);
  assert.match(texts(res), /exit code 0/);

  // An exception: isError, with Python's traceback.
  res = await call(client, 'run_python', { sandbox_id: id, code: 'data[100]' });
  assert.equal(res.isError, true);
  assert.match(texts(res), /Traceback \(most recent call last\):[\s\S]*IndexError: list index out of range/);
  // The state survived the error.
  res = await call(client, 'run_python', { sandbox_id: id, code: 'len(data)' });
  assert.match(texts(res), /:\n8/);
  return id;
}

test('stdio: vivarium mcp', async () => {
  const transport = new StdioClientTransport({
    command: env('VIVARIUM_BIN'),
    args: ['mcp', ...JSON.parse(env('VIVARIUM_STDIO_ARGS'))],
    stderr: 'inherit',
  });
  const client = new Client({ name: 'vivarium-node-test', version: '1.0.0' });
  await client.connect(transport);
  assert.equal(client.getServerVersion().name, 'vivarium');
  await exercise(client);
  await client.close();
});

test('streamable HTTP: vivarium serve /mcp with an API key', async () => {
  const base = env('VIVARIUM_URL');
  const key = env('VIVARIUM_API_KEY');

  // Without a key, nothing.
  const anon = await fetch(`${base}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: {} }),
  });
  assert.equal(anon.status, 401);
  const forged = new Client({ name: 'forged', version: '1.0.0' });
  await assert.rejects(forged.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    requestInit: { headers: { Authorization: 'Bearer viv_forged' } },
  })));

  const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  });
  const client = new Client({ name: 'vivarium-node-test', version: '1.0.0' });
  await client.connect(transport);
  const id = await exercise(client);

  // The sandbox belongs to the key: the HTTP API shows it.
  const list = async () => (await (await fetch(`${base}/v1/sandboxes`, { headers: { Authorization: `Bearer ${key}` } })).json()).sandboxes;
  assert.ok((await list()).some((s) => s.id === id));

  // Ending the session closes the sandboxes it created.
  await transport.terminateSession();
  await client.close();
  const deadline = Date.now() + 10000;
  while ((await list()).some((s) => s.id === id)) {
    assert.ok(Date.now() < deadline, 'the session\'s sandbox outlived the session');
    await new Promise((r) => setTimeout(r, 100));
  }
});

test('streamable HTTP: a key has at most 32 sessions open', async () => {
  const base = env('VIVARIUM_URL');
  const key = env('VIVARIUM_API_KEY');
  const open = async () => {
    const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
      requestInit: { headers: { Authorization: `Bearer ${key}` } },
    });
    const client = new Client({ name: 'vivarium-node-test', version: '1.0.0' });
    await client.connect(transport);
    return { client, transport };
  };
  const end = async (s) => {
    await s.transport.terminateSession();
    await s.client.close();
  };
  const sessions = [];
  try {
    for (let i = 0; i < 32; i++) sessions.push(await open());
    // One more fails, saying why, as the agent's user sees it.
    await assert.rejects(open(), /this key has 32 MCP sessions open, the most it may/);
    // Ending one makes room at once.
    await end(sessions.shift());
    sessions.push(await open());
  } finally {
    for (const s of sessions) await end(s);
  }
});

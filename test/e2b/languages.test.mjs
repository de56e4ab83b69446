// Code contexts in other languages than Python through the unmodified
// @e2b/code-interpreter SDK: javascript and typescript (Node), r and java
// where the host has them (the sandbox shows the host's /usr), bash; the
// default contexts as E2B lists them. Run by e2b_test.go.
import { test, describe } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'

import { Sandbox } from '@e2b/code-interpreter'
import { TimeoutError } from 'e2b'

function missing(tool, what) {
  try {
    execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' })
    return false
  } catch {
    return `needs ${tool} (${what}) on the host`
  }
}

async function withSandbox(opts, fn) {
  if (typeof opts === 'function') [opts, fn] = [{}, opts]
  const sbx = await Sandbox.create(opts)
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

describe('languages', () => {
  test('listCodeContexts holds the default python and javascript contexts', async () => {
    await withSandbox(async (sbx) => {
      const langs = (await sbx.listCodeContexts()).map((c) => c.language)
      assert.ok(langs.includes('python') && langs.includes('javascript'), `languages ${langs}`)
      // A language's default context appears once it is used.
      await sbx.runCode('1', { language: 'bash' })
      assert.ok((await sbx.listCodeContexts()).some((c) => c.language === 'bash'))
    })
  })

  test('javascript: console output, the last value, state, top-level await, env vars, cwd', async () => {
    await withSandbox({ envs: { TEST_ENV_VAR: 'supertest' } }, async (sbx) => {
      let ex = await sbx.runCode('console.log("Hello World!")', { language: 'js' })
      assert.deepEqual(ex.logs.stdout, ['Hello World!\n'])
      assert.equal(ex.error, undefined)

      ex = await sbx.runCode('const add = (x, y) => x + y;\nadd(1, 2)', { language: 'javascript' })
      assert.equal(ex.results[0].text, '3')
      await sbx.runCode('const z = 1', { language: 'js' })
      assert.equal((await sbx.runCode('z', { language: 'js' })).results[0].text, '1')

      ex = await sbx.runCode(`
        async function main() {
          return 'Hello, World!'
        }

        await main()
      `, { language: 'js' })
      assert.equal(ex.results[0].text, 'Hello, World!')

      assert.equal((await sbx.runCode('process.env.TEST_ENV_VAR', { language: 'js' })).results[0].text, 'supertest')
      ex = await sbx.runCode('process.env.TEST_ENV_VAR', { language: 'js', envs: { TEST_ENV_VAR: 'overwrite' } })
      assert.equal(ex.results[0].text, 'overwrite')
      assert.equal((await sbx.runCode('process.env.TEST_ENV_VAR', { language: 'js' })).results[0].text, 'supertest')

      // The javascript context starts where Python's does; another starts
      // in the directory it was given.
      const pyCwd = (await sbx.runCode('import os; os.getcwd()')).results[0].text
      assert.equal((await sbx.runCode('process.cwd()', { language: 'js' })).results[0].text, pyCwd)
      const ctx = await sbx.createCodeContext({ cwd: '/tmp', language: 'js' })
      assert.equal(ctx.language, 'javascript')
      assert.equal((await sbx.runCode('process.cwd() + " " + typeof z', { context: ctx })).results[0].text, '/tmp undefined')

      ex = await sbx.runCode('null.x', { language: 'js' })
      assert.equal(ex.error.name, 'TypeError')

      // Rich results: an object's own MIME bundle.
      ex = await sbx.runCode(`({ [Symbol.for("Jupyter.display")]() { return { "text/plain": "Hello world!", "text/html": "<h1>Hello world!</h1>" } } })`,
        { language: 'js' })
      assert.equal(ex.results[0].html, '<h1>Hello world!</h1>')
      assert.equal(ex.results[0].text, 'Hello world!')
    })
  })

  test("javascript: the SDK's timeoutMs interrupts a busy loop and the state survives", async () => {
    await withSandbox(async (sbx) => {
      await sbx.runCode('var n = 0', { language: 'js' })
      await assert.rejects(sbx.runCode('for (;;) { n++ }', { language: 'js', timeoutMs: 1_000 }), TimeoutError)
      // The next cell waits its turn: the interrupt ended the loop, and n
      // counted.
      assert.equal((await sbx.runCode('n > 0', { language: 'js' })).results[0].text, 'true')
    })
  })

  test('typescript: types are stripped', async () => {
    await withSandbox(async (sbx) => {
      const ex = await sbx.runCode(`
function subtract(x: number, y: number): number {
  return x - y;
}

subtract(1, 2)
`, { language: 'ts' })
      assert.equal(ex.error, undefined)
      assert.equal(ex.results[0].text, '-1')
    })
  })

  test('r: values as R prints them, env vars', { skip: missing('Rscript', "Debian's r-base-core") }, async () => {
    await withSandbox({ envs: { TEST_ENV_VAR: 'supertest' } }, async (sbx) => {
      assert.equal((await sbx.runCode('Sys.getenv("TEST_ENV_VAR")', { language: 'r' })).results[0].text.trim(), '[1] "supertest"')
      const ex = await sbx.runCode('Sys.getenv("FOO")', { language: 'r', envs: { FOO: 'bar' } })
      assert.equal(ex.results[0].text.trim(), '[1] "bar"')
      const empty = await sbx.runCode('Sys.getenv("FOO", unset = "default")', { language: 'r' })
      assert.equal(empty.results[0].text.trim(), '[1] "default"')
    })
  })

  test('java: JShell, env vars in the environment and as system properties', { skip: missing('jshell', "a JDK: Debian's default-jdk-headless") }, async () => {
    await withSandbox({ envs: { TEST_ENV_VAR: 'supertest' } }, async (sbx) => {
      let ex = await sbx.runCode('System.getProperty("TEST_ENV_VAR")', { language: 'java' })
      assert.equal(ex.results[0]?.text.trim(), 'supertest')
      ex = await sbx.runCode('System.getProperty("FOO")', { language: 'java', envs: { FOO: 'bar' } })
      assert.equal(ex.results[0]?.text.trim(), 'bar')
      ex = await sbx.runCode('System.getProperty("FOO", "default")', { language: 'java' })
      assert.equal(ex.results[0]?.text.trim(), 'default')
      // and environment variables, for that execution only
      ex = await sbx.runCode('System.getenv("FOO")', { language: 'java', envs: { FOO: 'bar' } })
      assert.equal(ex.results[0]?.text.trim(), 'bar')
      ex = await sbx.runCode('System.out.println(System.getenv("TEST_ENV_VAR"))', { language: 'java', envs: { TEST_ENV_VAR: 'overwrite' } })
      assert.deepEqual(ex.logs.stdout, ['overwrite\n'])
      ex = await sbx.runCode('System.getenv("TEST_ENV_VAR")', { language: 'java' })
      assert.equal(ex.results[0]?.text.trim(), 'supertest')
      ex = await sbx.runCode('int x = 2;\nx * 21', { language: 'java' })
      assert.equal(ex.results[0]?.text, '42')
    })
  })

  test('bash: env vars per execution', async () => {
    await withSandbox(async (sbx) => {
      assert.equal((await sbx.runCode('echo $FOO', { language: 'bash', envs: { FOO: 'bar' } })).logs.stdout[0], 'bar\n')
      assert.equal((await sbx.runCode('echo ${FOO:-default}', { language: 'bash' })).logs.stdout[0], 'default\n')
    })
  })

  test('an unknown language is refused', async () => {
    await withSandbox(async (sbx) => {
      await assert.rejects(sbx.runCode('1', { language: 'cobol' }), /not available/)
    })
  })
})

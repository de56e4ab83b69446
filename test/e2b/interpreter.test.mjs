// The code interpreter as E2B's behaves, through the unmodified
// @e2b/code-interpreter SDK: cells written for IPython (indented, shell
// escapes, magics), a figure's chart and a DataFrame's data, PIL images,
// and a sandbox killed during an execution. Run by e2b_test.go.
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'

import { Sandbox } from '@e2b/code-interpreter'
import { TimeoutError } from 'e2b'

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  if (!process.env[v]) throw new Error(`${v} is not set: run this suite with go test ./test/e2b/`)
}

describe('code interpreter', () => {
  let sbx
  before(async () => {
    sbx = await Sandbox.create()
  })
  after(async () => {
    await sbx?.kill().catch(() => {})
  })

  test('an indented cell runs, its lines numbered as written', async () => {
    const ok = await sbx.runCode(`
      total = 0
      for i in range(4):
          total += i
      total
    `)
    assert.equal(ok.error, undefined)
    assert.equal(ok.text, '6')
    const bad = await sbx.runCode(`
      x = 1
      !true
      raise ValueError("line four")
    `)
    assert.equal(bad.error.name, 'ValueError')
    assert.match(bad.error.traceback, /line 4/)
  })

  test('shell escapes, with variables; x = !cmd', async () => {
    const ex = await sbx.runCode('who = "vivarium"\n!echo hello {who}\nlines = !printf "a\\nb\\n"\nlines')
    assert.equal(ex.error, undefined)
    assert.equal(ex.logs.stdout.join(''), 'hello vivarium\n')
    assert.equal(ex.text, "['a', 'b']")
    // Text that looks like one, inside a string, is left alone.
    assert.equal((await sbx.runCode('s = """\n!not a command\n"""\ns.strip()')).text, '!not a command')
  })

  test('%cd, %env, %time, %%time, %%writefile', async () => {
    let ex = await sbx.runCode('%cd /tmp\nimport os\nos.getcwd()')
    assert.equal(ex.text, '/tmp')
    ex = await sbx.runCode('%env VV_MAGIC=yes\nimport os\nos.environ["VV_MAGIC"]')
    assert.equal(ex.text, 'yes')
    ex = await sbx.runCode('%time sum(range(10))')
    assert.equal(ex.text, '45')
    assert.match(ex.logs.stdout.join(''), /Wall time:/)
    ex = await sbx.runCode('%%time\ny = 2\ny * 21')
    assert.equal(ex.text, '42')
    assert.match(ex.logs.stdout.join(''), /CPU times:/)
    ex = await sbx.runCode('%%writefile /tmp/vv.txt\nwritten {as is}\n')
    assert.equal(ex.error, undefined)
    ex = await sbx.runCode('print(open("/tmp/vv.txt").read(), end="")')
    assert.equal(ex.logs.stdout.join(''), 'written {as is}\n')
  })

  test('%pip without an index, and an unknown magic, are errors that say so', async () => {
    let ex = await sbx.runCode('%pip install requests')
    assert.equal(ex.error.name, 'UsageError')
    assert.match(ex.error.value, /no package index/)
    ex = await sbx.runCode('%frobnicate')
    assert.equal(ex.error.name, 'UsageError')
    assert.match(ex.error.value, /%frobnicate/)
  })

  test('a DataFrame comes with its data', async () => {
    const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", None]})')
    assert.deepEqual(ex.results[0].data, { a: [1, 2, 3], b: ['x', 'y', null] })
    assert.ok(ex.results[0].html)
    assert.ok(ex.results[0].formats().includes('data'))
  })

  test('PIL images: Image.show(), an image as the value, Image.save(path)', async () => {
    const ex = await sbx.runCode('from PIL import Image\nim = Image.new("RGB", (8, 8), "blue")\nim.show()\nim')
    assert.equal(ex.error, undefined)
    assert.equal(ex.results.length, 2)
    for (const r of ex.results) assert.ok(Buffer.from(r.png, 'base64').subarray(1, 4).toString() === 'PNG')
    // Saved to a file, it is shown too, as E2B's.
    const saved = await sbx.runCode('im.save("/tmp/blue.png")')
    assert.equal(saved.results.length, 1)
    assert.ok(saved.results[0].png)
  })
})

describe('charts', () => {
  let sbx
  before(async () => {
    sbx = await Sandbox.create()
    await sbx.runCode('import matplotlib.pyplot as plt\nimport numpy as np')
  })
  after(async () => {
    await sbx?.kill().catch(() => {})
  })
  // Each cell ends in plt.show(): the figure is the one result.
  const chartOf = async (code) => {
    const ex = await sbx.runCode(code)
    assert.equal(ex.error, undefined)
    assert.equal(ex.results.length, 1)
    assert.ok(ex.results[0].png)
    return ex.results[0].chart
  }

  test('line', async () => {
    const c = await chartOf(`
      x = np.linspace(0, 2 * np.pi, 50)
      plt.plot(x, np.sin(x), label="sin")
      plt.plot(x, np.cos(x), label="cos")
      plt.xlabel("Time (s)")
      plt.ylabel("Amplitude (Hz)")
      plt.title("Waves")
      plt.show()
    `)
    assert.equal(c.type, 'line')
    assert.equal(c.title, 'Waves')
    assert.deepEqual([c.x_label, c.x_unit, c.y_label, c.y_unit], ['Time (s)', 's', 'Amplitude (Hz)', 'Hz'])
    assert.ok(c.x_ticks.every((t) => typeof t === 'number'))
    assert.ok(c.y_tick_labels.every((t) => typeof t === 'string'))
    assert.equal(c.x_scale, 'linear')
    assert.deepEqual(c.elements.map((e) => [e.label, e.points.length]), [['sin', 50], ['cos', 50]])
  })

  test('datetime and categorical scales', async () => {
    let c = await chartOf(`
      import datetime
      days = [datetime.date(2024, 3, 1) + datetime.timedelta(days=i) for i in range(5)]
      plt.plot(days, [5, 3, 4, 1, 2], label="visits")
      plt.show()
    `)
    assert.deepEqual([c.type, c.x_scale, c.y_scale], ['line', 'datetime', 'linear'])
    assert.ok(c.x_ticks.every((t) => typeof t === 'string' && !isNaN(new Date(t))))
    assert.deepEqual(new Date(c.elements[0].points[0][0]), new Date('2024-03-01T00:00:00Z'))
    c = await chartOf('plt.plot([1, 2, 3], ["low", "mid", "high"])\nplt.show()')
    assert.deepEqual([c.x_scale, c.y_scale], ['linear', 'categorical'])
  })

  test('scatter, on a log scale', async () => {
    const c = await chartOf('plt.scatter([1, 10, 100], [3, 2, 1], label="pts")\nplt.xscale("log")\nplt.show()')
    assert.equal(c.type, 'scatter')
    assert.equal(c.x_scale, 'log')
    assert.deepEqual(c.elements, [{ label: 'pts', points: [[1, 3], [10, 2], [100, 1]] }])
  })

  test('bar', async () => {
    const c = await chartOf(`
      plt.bar(["A", "B", "C"], [100, 200, 300])
      plt.xlabel("Authors")
      plt.ylabel("Books")
      plt.title("Sales")
      plt.show()
    `)
    assert.equal(c.type, 'bar')
    assert.deepEqual([c.title, c.x_label, c.y_label, c.x_unit], ['Sales', 'Authors', 'Books', null])
    assert.deepEqual(c.elements.map((e) => [e.label, e.value]), [['A', 100], ['B', 200], ['C', 300]])
    assert.ok(c.elements.every((e) => typeof e.group === 'string'))
  })

  test('pie', async () => {
    const c = await chartOf('plt.pie([1, 1, 2], labels=["a", "b", "c"])\nplt.title("Share")\nplt.show()')
    assert.equal(c.type, 'pie')
    assert.equal(c.title, 'Share')
    assert.deepEqual(c.elements.map((e) => [e.label, e.angle]), [['a', 90], ['b', 90], ['c', 180]])
    assert.ok(c.elements.every((e) => e.radius === 1))
  })

  test('box and whisker', async () => {
    const c = await chartOf(`
      fig, ax = plt.subplots()
      ax.boxplot([[85, 90, 78, 92, 88], [95, 89, 76, 91, 84, 87]], labels=["A", "B"], patch_artist=True)
      ax.set_title("Scores")
      ax.set_xlabel("Class")
      ax.set_ylabel("Score")
      plt.show()
    `)
    assert.equal(c.type, 'box_and_whisker')
    assert.deepEqual([c.title, c.x_label, c.y_label], ['Scores', 'Class', 'Score'])
    assert.deepEqual(c.elements.map((e) => e.label), ['A', 'B'])
    for (const e of c.elements) {
      assert.ok(e.min <= e.first_quartile && e.first_quartile <= e.median && e.median <= e.third_quartile && e.third_quartile <= e.max, JSON.stringify(e))
    }
    assert.deepEqual(c.elements.map((e) => [e.min, e.first_quartile, e.median, e.third_quartile, e.max, e.outliers]),
      [[78, 85, 88, 90, 92, []], [84, 84.75, 88, 90.5, 95, [76]]])
  })

  test('superchart and unknown', async () => {
    let c = await chartOf(`
      fig, axs = plt.subplots(1, 2)
      fig.suptitle("Both")
      axs[0].plot([1, 2, 3])
      axs[0].set_title("Line")
      axs[1].scatter([1, 2], [3, 4])
      plt.show()
    `)
    assert.equal(c.type, 'superchart')
    assert.equal(c.title, 'Both')
    assert.deepEqual(c.elements.map((e) => [e.type, e.title]), [['line', 'Line'], ['scatter', null]])
    c = await chartOf('fig, ax = plt.subplots()\nax.add_artist(plt.Circle((0, 0), 1))\nplt.title("Circle")\nplt.show()')
    assert.deepEqual([c.type, c.title, c.elements], ['unknown', 'Circle', []])
  })
})

test('a sandbox killed during an execution: the SDK raises its TimeoutError', async () => {
  const sbx = await Sandbox.create()
  try {
    const started = sbx.runCode('import time\nprint("started", flush=True)\ntime.sleep(60)', {
      onStdout: () => sbx.kill(),
    })
    await assert.rejects(started, (err) => err instanceof TimeoutError && /sandbox was killed/.test(err.message))
  } finally {
    await sbx.kill().catch(() => {})
  }
})

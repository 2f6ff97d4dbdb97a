// runCode: state, streaming, rich output, errors and envs, through
// @e2b/code-interpreter unchanged.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { SLOW, assertJournal } from './helpers.mjs'

const sandboxes = []
after(async () => {
  for (const s of sandboxes) await s.kill().catch(() => {})
})

async function create(opts) {
  const s = await Sandbox.create(opts)
  sandboxes.push(s)
  return s
}

test('state and output: x carries over, another sandbox does not see it', SLOW, async () => {
  const sbx = await create()
  await sbx.runCode('x = 21')
  const exec = await sbx.runCode('x * 2')
  assert.equal(exec.results[0].text, '42')
  assert.equal(exec.text, '42')
  assert.ok(exec.executionCount >= 2, `executionCount ${exec.executionCount}`)
  assert.equal(exec.error, undefined)

  const other = await create()
  const miss = await other.runCode('x')
  assert.equal(miss.error?.name, 'NameError')

  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 2 })
  await assertJournal(other.sandboxId, { 'sandbox.exec': 1 })
})

test('errors: 1/0 gives ZeroDivisionError with a traceback', SLOW, async () => {
  const sbx = await create()
  const seen = []
  const exec = await sbx.runCode('print("before")\n1/0', { onError: (e) => seen.push(e) })
  assert.equal(exec.error.name, 'ZeroDivisionError')
  assert.match(exec.error.value, /division by zero/)
  assert.match(exec.error.traceback, /ZeroDivisionError/)
  assert.deepEqual(exec.logs.stdout, ['before\n'])
  assert.equal(seen.length, 1)
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 1 })
})

test('rich output: a matplotlib figure arrives as png, a DataFrame has html', SLOW, async () => {
  const sbx = await create()
  const results = []
  const exec = await sbx.runCode(
    'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nimport pandas as pd\npd.DataFrame({"a": [1, 2], "b": [3, 4]})',
    { onResult: (r) => results.push(r) },
  )
  const png = exec.results.find((r) => r.png)
  assert.ok(png, `no png in ${JSON.stringify(exec.results.map((r) => r.formats()))}`)
  assert.equal(Buffer.from(png.png, 'base64').subarray(0, 4).toString('latin1'), '\x89PNG')
  const df = exec.results.find((r) => r.isMainResult)
  assert.match(df.html, /<table/)
  assert.match(df.text, /a\s+b/)
  assert.equal(results.length, exec.results.length)
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 1 })
})

test('envs: at create and per call, the call\'s reset after it', SLOW, async () => {
  const sbx = await create({ envs: { FROM_CREATE: 'c' } })
  const a = await sbx.runCode('import os\n(os.environ.get("FROM_CREATE"), os.environ.get("PER_CALL"))', { envs: { PER_CALL: 'p' } })
  assert.equal(a.text, "('c', 'p')")
  const b = await sbx.runCode('import os\nos.environ.get("PER_CALL") is None')
  assert.equal(b.text, 'True')
  const cel = await assertJournal(sbx.sandboxId, { 'sandbox.exec': 2 })
  assert.ok(cel.length >= 2)
})

test('streaming: onStdout gets each line before the next is printed', SLOW, async () => {
  const sbx = await create()
  // Each line carries the kernel's clock when it was printed; the host
  // records its clock when the line arrived. Kernel and host share one
  // clock, so "line i arrived before line i+1 was printed" is an ordering
  // of events, not a duration.
  const events = []
  const exec = await sbx.runCode('import time\nfor i in range(3):\n    print(i, time.time(), flush=True)\n    time.sleep(0.5)', {
    onStdout: (m) => events.push({ line: m.line, at: Date.now() / 1000 }),
  })
  events.push({ returned: true })
  const lines = events.filter((e) => e.line).flatMap((e) => e.line.trim().split('\n').map((l) => ({ l, at: e.at })))
  assert.deepEqual(lines.map((x) => Number(x.l.split(' ')[0])), [0, 1, 2])
  assert.ok(events.at(-1).returned)
  for (let i = 1; i < 3; i++) {
    const printed = Number(lines[i].l.split(' ')[1])
    assert.ok(lines[i - 1].at <= printed, `line ${i - 1} arrived at ${lines[i - 1].at}, after line ${i} was printed at ${printed}: not streamed`)
  }
  assert.equal(exec.logs.stdout.length, 3)
})

test('streaming: onStderr and onResult fire as the cell produces them', SLOW, async () => {
  const sbx = await create()
  const seen = {}
  const exec = await sbx.runCode(
    'import sys, time\nfrom IPython.display import display, Markdown\nprint("e", file=sys.stderr, flush=True)\ntime.sleep(0.5)\n' +
      'display(Markdown("**m**"))\ntime.sleep(0.5)\nprint(time.time(), flush=True)',
    {
      onStderr: () => { seen.stderr ??= Date.now() / 1000 },
      onResult: () => { seen.result ??= Date.now() / 1000 },
    },
  )
  // Kernel and host share one clock: the stderr line and the display
  // arrived before the last line was printed.
  const last = Number(exec.logs.stdout.at(-1))
  assert.ok(seen.stderr <= last, `stderr arrived at ${seen.stderr}, after ${last}: not streamed`)
  assert.ok(seen.result <= last, `the result arrived at ${seen.result}, after ${last}: not streamed`)
  assert.equal(exec.results[0].markdown, '**m**')
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 1 })
})

test('rich output: every format as the kernel produced it', SLOW, async () => {
  const sbx = await create()
  const code = `import base64, io
import matplotlib
import matplotlib.pyplot as plt
from IPython.display import display, Markdown, SVG, Latex, JSON, HTML
fig = plt.figure()
plt.plot([1, 2])
buf = {}
for fmt in ("jpeg", "pdf"):
    b = io.BytesIO()
    fig.savefig(b, format=fmt)
    buf[fmt] = base64.b64encode(b.getvalue()).decode()
plt.close(fig)
display(Markdown("# title"))
display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'))
display(Latex(r"$\\alpha^2$"))
display(JSON({"a": [1, 2]}))
display(HTML("<b>bold</b>"))
display({"image/jpeg": buf["jpeg"], "text/plain": "a jpeg"}, raw=True)
display({"application/pdf": buf["pdf"], "text/plain": "a pdf"}, raw=True)
"main"`
  const exec = await sbx.runCode(code)
  assert.equal(exec.error, undefined, JSON.stringify(exec.error))
  const by = (f) => exec.results.find((r) => r[f] !== undefined)
  assert.equal(by('markdown').markdown, '# title')
  assert.match(by('svg').svg, /^<svg[^>]*><rect/)
  assert.equal(by('latex').latex, '$\\alpha^2$')
  assert.deepEqual(by('json').json, { a: [1, 2] })
  assert.equal(by('html').html, '<b>bold</b>')
  assert.deepEqual([...Buffer.from(by('jpeg').jpeg, 'base64').subarray(0, 3)], [0xff, 0xd8, 0xff])
  assert.equal(Buffer.from(by('pdf').pdf, 'base64').subarray(0, 5).toString(), '%PDF-')
  assert.equal(exec.text, 'main')
  assert.equal(exec.results.at(-1).isMainResult, true)
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 1 })
})

test('timeout: an SDK timeout interrupts the cell on the server, and the kernel keeps its state', SLOW, async () => {
  const sbx = await create()
  await sbx.runCode('kept = 1')
  await assert.rejects(sbx.runCode('import time\ntime.sleep(600)', { timeoutMs: 1500 }), (e) => e.name === 'TimeoutError')
  // The next cell runs once the sleeping one was interrupted (not after
  // its 600 s), and the interpreter that holds kept is the same.
  const exec = await sbx.runCode('kept')
  assert.equal(exec.text, '1')
  assert.equal(exec.logs.stderr.length, 0, 'no kernel restart is reported')
  const cel = await assertJournal(sbx.sandboxId, { 'sandbox.exec': 3 })
  assert.ok(cel.length >= 3)
})

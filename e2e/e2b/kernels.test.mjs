// What E2B's own suites asked of the kernels (issue 24): /home/user as the
// one working directory, charts and data, kernels in R, JavaScript,
// TypeScript and bash, the tools a template has and the sudo answer, each
// through the official SDKs unchanged and each ending with the journal check.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { SLOW, assertJournal, triad } from './helpers.mjs'

const sandboxes = []
after(async () => {
  for (const s of sandboxes) await s.kill().catch(() => {})
})

// A language's first cell starts its kernel: give it longer than the
// SDK's default on a loaded machine.
const FIRST = { timeoutMs: 170_000 }

async function create(opts) {
  const s = await Sandbox.create(opts)
  sandboxes.push(s)
  return s
}

test('one working directory: /home/user for cells, commands, E2B files and tmp.write', SLOW, async () => {
  const sbx = await create()
  const cwd = await sbx.runCode('import os\nos.getcwd(), os.environ["HOME"]')
  assert.equal(cwd.text, "('/home/user', '/home/user')")
  const bang = await sbx.runCode('!pwd')
  assert.equal(bang.logs.stdout.join('').trim(), '/home/user')
  const pwd = await sbx.commands.run('pwd && echo ~ && whoami')
  assert.deepEqual(pwd.stdout.trim().split('\n'), ['/home/user', '/home/user', 'user'])

  await sbx.files.write('/home/user/data/a.txt', 'from files')
  const w = await triad('/tmp/write', { run: sbx.sandboxId, method: 'POST', body: { path: 'data/b.txt', text: 'from tmp.write' } })
  assert.equal(w.status, 200, await w.text())
  const read = await sbx.runCode('open("data/a.txt").read() + "|" + open("/home/user/data/b.txt").read()')
  assert.equal(read.text, 'from files|from tmp.write')
  const cat = await sbx.commands.run('cat ~/data/b.txt /work/data/a.txt')
  assert.equal(cat.stdout, 'from tmp.writefrom files')
  assert.equal(await sbx.files.read('data/b.txt'), 'from tmp.write')
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 3, 'tmp.write': 2 })
})

test('charts: a matplotlib bar chart arrives as chart data beside its png', SLOW, async () => {
  const sbx = await create()
  const exec = await sbx.runCode(`
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.bar(["A", "B", "C"], [3, 1, 2], label="sales")
ax.set_title("Sales")
ax.set_xlabel("Product")
ax.set_ylabel("Units (k)")
plt.show()`)
  assert.equal(exec.error, undefined)
  const r = exec.results[0]
  assert.ok(r.png, `no png in ${JSON.stringify(r.formats())}`)
  assert.equal(r.chart.type, 'bar')
  assert.equal(r.chart.title, 'Sales')
  assert.equal(r.chart.x_label, 'Product')
  assert.equal(r.chart.y_unit, 'k')
  assert.deepEqual(r.chart.elements.map((e) => [e.label, e.value, e.group]), [['A', 3, 'sales'], ['B', 1, 'sales'], ['C', 2, 'sales']])

  const line = await sbx.runCode('plt.figure(); plt.plot([0, 1, 2], [0, 1, 4], label="sq"); plt.yscale("log"); plt.show()')
  assert.equal(line.results[0].chart.type, 'line')
  assert.equal(line.results[0].chart.y_scale, 'log')
  assert.deepEqual(line.results[0].chart.elements[0].points, [[0, 0], [1, 1], [2, 4]])
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 2 })
})

test('data: a DataFrame result carries its columns; PIL save shows the image', SLOW, async () => {
  const sbx = await create()
  const exec = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})')
  assert.deepEqual(exec.results[0].data, { a: [1, 2, 3], b: ['x', 'y', 'z'] })
  assert.match(exec.results[0].html, /<table/)

  const img = await sbx.runCode(`
from PIL import Image
Image.new("RGB", (8, 8), "red").save("red.png")`)
  assert.ok(img.results[0]?.png, `no png in ${JSON.stringify(img.results.map((r) => r.formats()))}`)
  assert.ok(await sbx.files.exists('red.png'))
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 2 })
})

test('languages: R, JavaScript, TypeScript and bash kernels keep their state', SLOW, async () => {
  const sbx = await create({ envs: { REGION: 'eu' } })
  await sbx.files.write('n.txt', '7')

  await sbx.runCode('x <- as.integer(readLines("n.txt"))', { language: 'r', ...FIRST })
  const r = await sbx.runCode('cat(x * 6, Sys.getenv("REGION"), "\\n"); x + 1', { language: 'r' })
  assert.equal(r.error, undefined, JSON.stringify(r.error))
  assert.deepEqual(r.logs.stdout, ['42 eu \n'])
  // IRkernel shows a value as a display, not an execute_result.
  assert.equal(r.results[0]?.text, '[1] 8')

  const js = await sbx.runCode('const n = Number(Deno.readTextFileSync("n.txt")); console.log(n * 6)', { language: 'js', ...FIRST })
  assert.deepEqual(js.logs.stdout, ['42\n'])
  const js2 = await sbx.runCode('process.env.REGION + ":" + n', { language: 'javascript' })
  assert.equal(js2.text, 'eu:7')

  const ts = await sbx.runCode('const m: number = 5; m * 2', { language: 'ts', ...FIRST })
  assert.equal(ts.text, '10')

  await sbx.runCode('y=$(cat n.txt); cd /tmp', { language: 'bash', ...FIRST })
  const sh = await sbx.runCode('echo "$((y * 6)) $(pwd) $REGION"', { language: 'bash', envs: { REGION: 'us' } })
  assert.deepEqual(sh.logs.stdout, ['42 /tmp us\n'])
  const after = await sbx.runCode('echo $REGION', { language: 'bash' })
  assert.deepEqual(after.logs.stdout, ['eu\n'])
  const fail = await sbx.runCode('false', { language: 'bash' })
  assert.equal(fail.error?.value, 'exit status 1')

  const ctx = await sbx.createCodeContext({ language: 'r' })
  assert.equal(ctx.language, 'r')
  const own = await sbx.runCode('exists("x")', { context: ctx, ...FIRST })
  assert.equal(own.results[0]?.text, '[1] FALSE')

  // No Java kernel: 422 (the SDK shows the status; the body says why).
  const java = await sbx.runCode('1+1', { language: 'java' }).catch((e) => e)
  assert.match(String(java.message), /422/)

  const steps = await assertJournal(sbx.sandboxId, { 'sandbox.exec': 10, 'sandbox.context': 1 })
  const cel = await (await triad('/cel', { run: sbx.sandboxId })).text()
  for (const lang of ['R', 'JavaScript', 'TypeScript', 'bash']) {
    assert.match(cel, new RegExp(`Ran a ${lang} cell`), `no ${lang} cell in the journal`)
  }
  assert.ok(steps.length >= 11)
})

test('tools: git, curl and python are there; sudo runs without privilege and says so', SLOW, async () => {
  const sbx = await create()
  const tools = await sbx.commands.run('git --version && curl --version | head -1 && python --version && which jq zip unzip ps')
  assert.equal(tools.exitCode, 0, tools.stderr)
  assert.match(tools.stdout, /git version/)
  assert.match(tools.stdout, /Python 3/)

  const repo = await sbx.commands.run('git init -q repo && cd repo && git config user.email a@b && git config user.name a && echo hi > f && git add f && git commit -qm one && git log --oneline | wc -l')
  assert.equal(repo.stdout.trim(), '1')
  assert.ok(await sbx.files.exists('repo/f'))

  const sudo = await sbx.commands.run('sudo echo "hi $FOO"', { envs: { FOO: 'x' } })
  assert.equal(sudo.exitCode, 0)
  assert.equal(sudo.stdout.trim(), 'hi x')
  assert.match(sudo.stderr, /no root/)
  const root = await sbx.commands.run('sudo id -u').catch((e) => e)
  assert.equal((root.stdout ?? root.result?.stdout).trim(), '1000')
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 3 })
})

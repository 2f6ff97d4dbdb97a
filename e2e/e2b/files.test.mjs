// files.*: the sandbox's files are the run's tmp.* files.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, FileType, SandboxError } from '@e2b/code-interpreter'
import { SLOW, assertJournal, triad, sha256 } from './helpers.mjs'

const sandboxes = []
after(async () => {
  for (const s of sandboxes) await s.kill().catch(() => {})
})

test('write a csv, use it in the next runCode, see it in tmp.list with its sha256', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  const csv = 'a,b\n1,2\n3,4\n'
  const info = await sbx.files.write('data/a.csv', csv)
  assert.equal(info.path, '/home/user/data/a.csv')
  assert.equal(info.name, 'a.csv')

  const exec = await sbx.runCode('import pandas as pd\nint(pd.read_csv("data/a.csv")["b"].sum())')
  assert.equal(exec.text, '6')

  const res = await triad('/tmp/list?prefix=data/', { run: sbx.sandboxId })
  const { files } = await res.json()
  const f = files.find((x) => x.path === 'data/a.csv')
  assert.ok(f, JSON.stringify(files))
  assert.equal(f.sha256, sha256(csv))
  assert.equal(f.size, csv.length)

  const entries = await sbx.files.list('data')
  assert.deepEqual(entries.map((e) => [e.name, e.type]), [['a.csv', FileType.FILE]])
  assert.equal((await sbx.files.getInfo('data/a.csv')).metadata, undefined) // only what a caller set

  await sbx.files.remove('data/a.csv')
  assert.equal(await sbx.files.exists('data/a.csv'), false)
  const after = await (await triad('/tmp/list?prefix=data/', { run: sbx.sandboxId })).json()
  assert.equal(after.files.length, 0)

  await assertJournal(sbx.sandboxId, { 'tmp.write': 1, 'sandbox.exec': 1, 'tmp.list': 3, 'tmp.delete': 1 })
})

test('a file a cell wrote reads back as text, bytes and a stream', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  await sbx.runCode('import os\nos.makedirs("out", exist_ok=True)\nwith open("out/report.txt", "w") as f:\n    f.write("made by a cell\\n")')
  assert.equal(await sbx.files.read('out/report.txt'), 'made by a cell\n')
  assert.equal(await sbx.files.read('/home/user/out/report.txt'), 'made by a cell\n')
  const bytes = await sbx.files.read('out/report.txt', { format: 'bytes' })
  assert.ok(bytes instanceof Uint8Array)
  assert.equal(Buffer.from(bytes).toString(), 'made by a cell\n')
  const stream = await sbx.files.read('out/report.txt', { format: 'stream' })
  let text = ''
  for await (const chunk of stream) text += Buffer.from(chunk).toString()
  assert.equal(text, 'made by a cell\n')
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 1, 'tmp.read': 4 })
})

test('write bytes, a stream and several files at once; makeDir, rename, getInfo', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  const bin = new Uint8Array([0, 1, 2, 250, 255])
  await sbx.files.write('bin/raw.bin', bin.buffer)
  assert.deepEqual(new Uint8Array(await sbx.files.read('bin/raw.bin', { format: 'bytes' })), bin)

  const big = 'x'.repeat(1 << 20)
  await sbx.files.write('big.txt', new Blob([big]).stream())
  assert.equal((await sbx.files.getInfo('big.txt')).size, big.length)

  const many = await sbx.files.write([
    { path: 'm/one.txt', data: 'one' },
    { path: '/home/user/m/two.txt', data: 'two' },
  ])
  assert.deepEqual(many.map((w) => w.path).sort(), ['/home/user/m/one.txt', '/home/user/m/two.txt'])

  assert.equal(await sbx.files.makeDir('empty'), true)
  assert.equal(await sbx.files.makeDir('empty'), false)
  assert.equal(await sbx.files.exists('empty'), true)

  const moved = await sbx.files.rename('m/one.txt', 'moved/one.txt')
  assert.equal(moved.path, '/home/user/moved/one.txt')
  assert.equal(await sbx.files.read('moved/one.txt'), 'one')
  assert.equal(await sbx.files.exists('m/one.txt'), false)

  const dir = await sbx.files.getInfo('m')
  assert.equal(dir.type, FileType.DIR)
  // The run's root also holds Triad's journal (CEL.md and its records):
  // the sandbox's files are the run's files, and the journal is one.
  const top = (await sbx.files.list('/home/user')).map((e) => e.name)
  for (const n of ['big.txt', 'bin', 'empty', 'm', 'moved', 'CEL.md']) assert.ok(top.includes(n), `${n} not in ${top}`)
  assert.ok(!top.includes('one.txt') && !top.includes('raw.bin'), 'depth 1 lists only the top level')

  const exec = await sbx.runCode('open("moved/one.txt").read() + open("m/two.txt").read()')
  assert.equal(exec.text, 'onetwo')
  await assertJournal(sbx.sandboxId, { 'tmp.write': 6, 'tmp.read': 3, 'tmp.delete': 1 })
})

test('watchDir is a clear unsupported error', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  await assert.rejects(sbx.files.watchDir('/home/user', () => {}), (e) =>
    e instanceof SandboxError && /not supported on Triad/.test(e.message))
})

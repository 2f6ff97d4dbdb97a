// files.*: the sandbox's files are the run's tmp.* files.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, FileType, SandboxError, FilesystemEventType, FileNotFoundError } from '@e2b/code-interpreter'
import { SLOW, SANDBOX_URL, assertJournal, triad, sha256 } from './helpers.mjs'

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

test('watchDir sees files.write, a cell, a running command and Triad\'s own PUT /tmp/files; kill ends it', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  await sbx.files.makeDir('watched')
  const events = []
  const waiters = []
  const seen = (name, type) => events.some((e) => e.name === name && e.type === type)
  const waitFor = (name, type) =>
    seen(name, type) ? Promise.resolve() : new Promise((resolve) => waiters.push({ name, type, resolve }))
  let exited
  const exitedP = new Promise((resolve) => { exited = resolve })
  const handle = await sbx.files.watchDir('watched', (e) => {
    events.push(e)
    for (const w of waiters.filter((w) => w.name === e.name && w.type === e.type)) w.resolve()
  }, { recursive: true, includeEntry: true, onExit: (err) => exited(err) })

  await sbx.files.write('watched/sdk.txt', 'from files.write')
  await waitFor('sdk.txt', FilesystemEventType.WRITE)
  const entry = events.find((e) => e.name === 'sdk.txt' && e.entry).entry
  assert.equal(entry.path, '/home/user/watched/sdk.txt')
  assert.equal(entry.size, 'from files.write'.length)

  await sbx.runCode('open("watched/cell.txt", "w").write("from a cell")')
  await waitFor('cell.txt', FilesystemEventType.CREATE)

  // A background command writes, and waits until the test saw the write:
  // the event comes while the command still runs, before its harvest.
  const cmd = await sbx.commands.run('mkdir -p watched/deep && echo running > watched/deep/cmd.txt; while [ ! -e seen ]; do sleep 0.05; done', { background: true })
  await waitFor('deep', FilesystemEventType.CREATE)
  await waitFor('deep/cmd.txt', FilesystemEventType.CREATE)
  await sbx.files.write('seen', '')
  await cmd.wait()

  const res = await triad('/tmp/files/watched/put.txt', { run: sbx.sandboxId, method: 'PUT', body: 'streamed' })
  assert.equal(res.status, 200, await res.text())
  await waitFor('put.txt', FilesystemEventType.CREATE)

  await sbx.files.remove('watched/sdk.txt')
  await waitFor('sdk.txt', FilesystemEventType.REMOVE)

  await sbx.kill()
  const err = await exitedP
  assert.ok(err instanceof Error, `onExit got ${err}`)
  await handle.stop()
})

test('watchDir: a missing directory, a file; the polling form over Connect', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  await assert.rejects(sbx.files.watchDir('nowhere', () => {}), (e) => e instanceof FileNotFoundError)
  await sbx.files.write('plain.txt', 'x')
  await assert.rejects(sbx.files.watchDir('plain.txt', () => {}), (e) => e instanceof SandboxError)

  // E2B's Python SDK watches with CreateWatcher / GetWatcherEvents.
  const rpc = async (method, body) => {
    const res = await fetch(`${SANDBOX_URL}/filesystem.Filesystem/${method}`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': sbx.envdAccessToken },
      body: JSON.stringify(body),
    })
    return { status: res.status, body: await res.json() }
  }
  const made = await rpc('CreateWatcher', { path: '/home/user', recursive: false })
  assert.equal(made.status, 200, JSON.stringify(made.body))
  await sbx.files.write('polled.txt', 'p')
  let got = []
  while (!got.some((e) => e.name === 'polled.txt' && e.type === 'EVENT_TYPE_WRITE')) {
    const ev = await rpc('GetWatcherEvents', { watcherId: made.body.watcherId })
    assert.equal(ev.status, 200, JSON.stringify(ev.body))
    got = got.concat(ev.body.events ?? [])
  }
  assert.equal((await rpc('RemoveWatcher', { watcherId: made.body.watcherId })).status, 200)
  const gone = await rpc('GetWatcherEvents', { watcherId: made.body.watcherId })
  assert.equal(gone.status, 404)
  assert.equal(gone.body.code, 'not_found')
  const bad = await rpc('CreateWatcher', { path: '/etc' })
  assert.equal(bad.status, 400)
  await assertJournal(sbx.sandboxId, { 'tmp.list': 3, 'tmp.write': 2 })
})

test('signed download and upload URLs, with and without an expiry', SLOW, async () => {
  const sbx = await Sandbox.create({ secure: true })
  sandboxes.push(sbx)
  await sbx.files.write('hello.txt', 'hello world')
  const down = await sbx.downloadUrl('hello.txt', { useSignatureExpiration: 10_000 })
  assert.ok(!down.includes(sbx.sandboxId), 'the link names no sandbox: the signature does')
  let res = await fetch(down)
  assert.equal(res.status, 200)
  assert.equal(await res.text(), 'hello world')
  res = await fetch(await sbx.downloadUrl('hello.txt'))
  assert.equal(await res.text(), 'hello world')

  res = await fetch(await sbx.downloadUrl('hello.txt', { useSignatureExpiration: -10_000 }))
  assert.equal(res.status, 401)
  assert.deepEqual(await res.json(), { code: 401, message: 'signature is already expired' })
  res = await fetch(down.replace('hello.txt', 'other.txt'))
  assert.equal(res.status, 401)
  assert.deepEqual(await res.json(), { code: 401, message: 'invalid signature' })

  const form = new FormData()
  form.append('file', 'uploaded by link')
  res = await fetch(await sbx.uploadUrl('up.txt', { useSignatureExpiration: 10_000 }), { method: 'POST', body: form })
  assert.equal(res.status, 200)
  assert.deepEqual(await res.json(), [{ name: 'up.txt', path: '/home/user/up.txt', type: 'file' }])
  assert.equal(await sbx.files.read('up.txt'), 'uploaded by link')

  await sbx.kill()
  res = await fetch(down)
  assert.equal(res.status, 401, 'a killed sandbox\'s links are dead')
  await assertJournal(sbx.sandboxId, { 'tmp.write': 2, 'tmp.read': 3 })
})

test('files metadata: envd 0.6.4, directories, makeDir markers, and file metadata kept with the bytes', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  await sbx.files.makeDir('d/sub')
  await sbx.files.write('d/f.txt', 'four')
  const dir = await sbx.files.getInfo('d')
  assert.equal(dir.type, FileType.DIR)
  assert.ok(dir.size > 0)
  assert.equal(dir.mode, 0o755)
  assert.equal(dir.permissions, 'drwxr-xr-x')
  const list = await sbx.files.list('d')
  assert.deepEqual(list.map((e) => [e.name, e.type, e.size, e.mode, e.permissions, e.owner, e.group]).sort(), [
    ['f.txt', FileType.FILE, 4, 0o644, '-rw-r--r--', 'user', 'user'],
    ['sub', FileType.DIR, 4096, 0o755, 'drwxr-xr-x', 'user', 'user'],
  ])
  assert.ok(list.every((e) => e.modifiedTime instanceof Date && e.symlinkTarget === undefined))

  const w = await sbx.files.write('m.txt', 'x', { metadata: { author: 'me', purpose: 'test' } })
  assert.deepEqual(w.metadata, { author: 'me', purpose: 'test' })
  assert.deepEqual((await sbx.files.getInfo('m.txt')).metadata, { author: 'me', purpose: 'test' })
  assert.deepEqual((await sbx.files.rename('m.txt', 'd/m.txt')).metadata, { author: 'me', purpose: 'test' })
  assert.deepEqual((await sbx.files.list('d')).find((e) => e.name === 'm.txt').metadata, { author: 'me', purpose: 'test' })
  // A cell that rewrites the file makes new bytes: the metadata was the old ones'.
  await sbx.runCode('open("d/m.txt", "w").write("rewritten")')
  assert.equal((await sbx.files.getInfo('d/m.txt')).metadata, undefined)
  await sbx.files.write('d/m.txt', 'again', { metadata: { v: '2' } })
  await sbx.files.write('d/m.txt', 'no metadata now')
  assert.equal((await sbx.files.getInfo('d/m.txt')).metadata, undefined)
  await assertJournal(sbx.sandboxId, { 'tmp.write': 6, 'sandbox.exec': 1 })
})

test('files outside /home/user are the sandbox\'s own: a repository in /tmp, read-only root refused, each a sandbox.fs step', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  assert.equal(await sbx.files.exists('/tmp/repo/README.md'), false) // no kernel yet: nothing there, and none started
  await sbx.files.write('/tmp/repo/README.md', 'hello\n')
  const git = await sbx.commands.run('cd /tmp/repo && git init -q && git add README.md && git status --short')
  assert.equal(git.stdout, 'A  README.md\n')
  assert.equal(await sbx.files.exists('/tmp/repo/.git'), true)
  assert.equal(await sbx.files.read('/tmp/repo/README.md'), 'hello\n')
  const info = await sbx.files.getInfo('/tmp/repo/README.md')
  assert.equal(info.type, FileType.FILE)
  assert.equal(info.size, 6)
  const names = (await sbx.files.list('/tmp/repo')).map((e) => [e.name, e.type])
  assert.deepEqual(names, [['.git', FileType.DIR], ['README.md', FileType.FILE]])
  await sbx.files.rename('/tmp/repo/README.md', '/tmp/repo/NOTES.md')
  assert.equal(await sbx.files.read('/tmp/repo/NOTES.md'), 'hello\n')
  await assert.rejects(sbx.files.read('/tmp/repo/missing'), FileNotFoundError)
  await assert.rejects(sbx.files.write('/etc/triad.txt', 'x'), (e) => e instanceof SandboxError && /read-only|refused/i.test(e.message))
  // The run's files stay the run's: nothing under /tmp is a tmp.* file.
  const { files } = await (await triad('/tmp/list', { run: sbx.sandboxId })).json()
  assert.ok(!files.some((f) => /README|NOTES|repo/.test(f.path)), JSON.stringify(files.map((f) => f.path)))
  await sbx.files.remove('/tmp/repo')
  assert.equal(await sbx.files.exists('/tmp/repo'), false)
  await assertJournal(sbx.sandboxId, { 'sandbox.fs': 11, 'sandbox.exec': 1, 'tmp.list': 1 })
})

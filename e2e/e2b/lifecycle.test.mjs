// Lifecycle and auth: create, connect, getInfo, setTimeout, isRunning,
// list, kill; a timeout keeps the files; the SDK's own errors.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, AuthenticationError, SandboxNotFoundError } from '@e2b/code-interpreter'
import { SLOW, API_KEY, assertJournal, triad, sha256 } from './helpers.mjs'

const sandboxes = []
after(async () => {
  for (const s of sandboxes) await s.kill().catch(() => {})
})

async function listAll(opts) {
  const p = Sandbox.list(opts)
  const out = []
  while (p.hasNext) out.push(...(await p.nextItems()))
  return out
}

test('create with template, metadata and timeout; getInfo, list, connect, setTimeout, isRunning', SLOW, async () => {
  const tag = `t${Date.now()}`
  const sbx = await Sandbox.create('base', { metadata: { suite: tag }, timeoutMs: 120_000 })
  sandboxes.push(sbx)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.deepEqual(info.metadata, { suite: tag })
  assert.equal(info.state, 'running')
  const life = info.endAt.getTime() - info.startedAt.getTime()
  assert.ok(life >= 119_000 && life <= 121_000, `lifetime ${life} ms, want the 120 s asked for`)
  assert.equal(await sbx.isRunning(), true)

  const listed = await listAll({ query: { metadata: { suite: tag } } })
  assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])

  await sbx.setTimeout(600_000)
  const later = await Sandbox.getInfo(sbx.sandboxId)
  assert.ok(later.endAt > info.endAt)

  const again = await Sandbox.connect(sbx.sandboxId)
  await sbx.runCode('shared = "yes"')
  assert.equal((await again.runCode('shared')).text, 'yes')
})

test('kill removes the sandbox; its journal and files stay readable through Triad', SLOW, async () => {
  const sbx = await Sandbox.create()
  await sbx.files.write('keep/me.txt', 'still here')
  await sbx.runCode('1 + 1')
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.isRunning(), false)
  assert.ok(!(await listAll()).some((s) => s.sandboxId === sbx.sandboxId))
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)

  const read = await triad('/tmp/read?path=keep/me.txt', { run: sbx.sandboxId })
  assert.equal((await read.json()).text, 'still here')
  await assertJournal(sbx.sandboxId, { 'tmp.write': 1, 'sandbox.exec': 1 })
})

test('past its timeout the kernel stops and the files stay; connect starts a fresh kernel over them', SLOW, async () => {
  // The cell runs first, then the timeout is cut to a second: a sandbox
  // paused during runCode breaks that call off, as E2B's does, and a loaded
  // machine can take more than a second to start the kernel.
  const sbx = await Sandbox.create({ timeoutMs: 300_000 })
  sandboxes.push(sbx)
  const data = 'kept across the timeout\n'
  await sbx.files.write('kept.txt', data)
  await sbx.runCode('y = 1')
  await sbx.setTimeout(1_000)
  // Wait for the timeout by watching the state, not the clock.
  for (let i = 0; (await Sandbox.getInfo(sbx.sandboxId)).state !== 'paused'; i++) {
    assert.ok(i < 600, 'the sandbox never paused')
    await new Promise((r) => setTimeout(r, 100))
  }
  assert.equal(await sbx.isRunning(), false)
  const files = await (await triad('/tmp/list', { run: sbx.sandboxId })).json()
  assert.equal(files.files.find((f) => f.path === 'kept.txt')?.sha256, sha256(data))

  const back = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
  assert.equal(await back.isRunning(), true)
  assert.equal(await back.files.read('kept.txt'), data)
  const exec = await back.runCode('"y" in globals(), open("kept.txt").read()')
  assert.equal(exec.text, "(False, 'kept across the timeout\\n')")
})

test('a wrong X-API-Key gives the SDK\'s own AuthenticationError', SLOW, async () => {
  await assert.rejects(Sandbox.create({ apiKey: `${API_KEY}0` }), AuthenticationError)
  await assert.rejects(Sandbox.list({ apiKey: 'e2b_wrong' }).nextItems(), AuthenticationError)
})

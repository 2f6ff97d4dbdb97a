// Code contexts: each its own interpreter in the run's container.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { SLOW, assertJournal, triad } from './helpers.mjs'

const sandboxes = []
after(async () => {
  for (const s of sandboxes) await s.kill().catch(() => {})
})

test('the default context is listed, and restarting it drops its variables', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  // The run's default Python context first, then each other language's
  // default (its id is the language's name), then the run's own: none yet.
  const ctxs = await sbx.listCodeContexts()
  assert.equal(ctxs[0].language, 'python')
  assert.equal(ctxs[0].cwd, '/home/user')
  assert.deepEqual(ctxs.slice(1).map((c) => [c.id, c.language]), ctxs.slice(1).map((c) => [c.language, c.language]))
  assert.equal(new Set(ctxs.map((c) => c.language)).size, ctxs.length)
  await sbx.runCode('v = 1', { context: ctxs[0] })
  await sbx.restartCodeContext(ctxs[0])
  const exec = await sbx.runCode('v', { context: ctxs[0] })
  assert.equal(exec.error?.name, 'NameError')
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 2 })
})

test('two contexts keep separate variables, and restarting one keeps the other', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  const a = await sbx.createCodeContext()
  const b = await sbx.createCodeContext({ cwd: '/home/user/sub', language: 'python' })
  assert.equal(a.language, 'python')
  assert.equal(a.cwd, '/home/user')
  assert.equal(b.cwd, '/home/user/sub')
  await sbx.runCode('v = "a"', { context: a })
  await sbx.runCode('v = "b"\nopen("from-b.txt", "w").write("b")', { context: b })
  assert.equal((await sbx.runCode('v', { context: a })).text, 'a')
  assert.equal((await sbx.runCode('v', { context: b })).text, 'b')
  assert.equal((await sbx.runCode('v')).error?.name, 'NameError', 'the default context is its own interpreter too')
  // b starts in its own directory, in the sandbox's files.
  assert.equal(await sbx.files.read('sub/from-b.txt'), 'b')

  await sbx.restartCodeContext(a)
  assert.equal((await sbx.runCode('v', { context: a })).error?.name, 'NameError')
  assert.equal((await sbx.runCode('v', { context: b })).text, 'b')

  const ids = (await sbx.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes('default') && ids.includes(a.id) && ids.includes(b.id), `${ids}`)
  await sbx.removeCodeContext(b)
  assert.ok(!(await sbx.listCodeContexts()).map((c) => c.id).includes(b.id))

  // Every cell is a Step Block that names its context.
  const steps = await assertJournal(sbx.sandboxId, { 'sandbox.exec': 7 })
  const cel = await (await triad('/cel', { run: sbx.sandboxId })).text()
  assert.ok(cel.includes(`context=${a.id}`) && cel.includes(`context=${b.id}`), cel)
  assert.ok(steps.length >= 7)
})

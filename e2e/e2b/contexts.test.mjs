// Code contexts: each its own interpreter in the run's container.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'
import { SLOW, CONTEXTS, assertJournal } from './helpers.mjs'

const sandboxes = []
after(async () => {
  for (const s of sandboxes) await s.kill().catch(() => {})
})

test('the default context is listed, and restarting it drops its variables', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  const ctxs = await sbx.listCodeContexts()
  assert.equal(ctxs.length, 1)
  assert.equal(ctxs[0].language, 'python')
  assert.equal(ctxs[0].cwd, '/home/user')
  await sbx.runCode('v = 1', { context: ctxs[0] })
  await sbx.restartCodeContext(ctxs[0])
  const exec = await sbx.runCode('v', { context: ctxs[0] })
  assert.equal(exec.error?.name, 'NameError')
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 2 })
})

test('two contexts keep separate variables, and restarting one keeps the other', { ...SLOW, todo: CONTEXTS }, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  const a = await sbx.createCodeContext()
  const b = await sbx.createCodeContext({ cwd: '/home/user' })
  await sbx.runCode('v = "a"', { context: a })
  await sbx.runCode('v = "b"', { context: b })
  assert.equal((await sbx.runCode('v', { context: a })).text, 'a')
  assert.equal((await sbx.runCode('v', { context: b })).text, 'b')
  await sbx.restartCodeContext(a)
  assert.equal((await sbx.runCode('v', { context: a })).error?.name, 'NameError')
  assert.equal((await sbx.runCode('v', { context: b })).text, 'b')
  const ids = (await sbx.listCodeContexts()).map((c) => c.id)
  assert.ok(ids.includes(a.id) && ids.includes(b.id))
  await sbx.removeCodeContext(b)
  assert.ok(!(await sbx.listCodeContexts()).map((c) => c.id).includes(b.id))
})

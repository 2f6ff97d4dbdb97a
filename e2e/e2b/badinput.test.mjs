// Bad input gets the error the SDK expects, never a 500.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, SandboxNotFoundError, NotFoundError, InvalidArgumentError, FileNotFoundError } from '@e2b/code-interpreter'
import { SLOW, SANDBOX_URL, assertJournal } from './helpers.mjs'

let sbx
after(async () => {
  await sbx?.kill().catch(() => {})
})

test('an unknown sandbox id', SLOW, async () => {
  await assert.rejects(Sandbox.connect('r-no-such-sandbox'), SandboxNotFoundError)
  await assert.rejects(Sandbox.getInfo('r-no-such-sandbox'), SandboxNotFoundError)
  await assert.rejects(Sandbox.setTimeout('r-no-such-sandbox', 10_000), SandboxNotFoundError)
  assert.equal(await Sandbox.kill('r-no-such-sandbox'), false)
  await assert.rejects(Sandbox.connect('not a valid id!'), SandboxNotFoundError)
})

test('an unknown context', SLOW, async () => {
  sbx ??= await Sandbox.create()
  await assert.rejects(
    sbx.runCode('1', { context: { id: 'no-such-context', language: 'python', cwd: '/home/user' } }),
    NotFoundError,
  )
  await assert.rejects(sbx.restartCodeContext('no-such-context'), NotFoundError)
  await assert.rejects(sbx.removeCodeContext('no-such-context'), NotFoundError)
})

test('path traversal and paths outside the sandbox in files.*', SLOW, async () => {
  sbx ??= await Sandbox.create()
  for (const p of ['../etc/passwd', 'a/../../b', 'sub/../../x']) {
    await assert.rejects(sbx.files.read(p), InvalidArgumentError, `read ${p}`)
    await assert.rejects(sbx.files.write(p, 'x'), InvalidArgumentError, `write ${p}`)
    await assert.rejects(sbx.files.list(p), InvalidArgumentError, `list ${p}`)
    await assert.rejects(sbx.files.exists(p), InvalidArgumentError, `exists ${p}`)
    await assert.rejects(sbx.files.remove(p), InvalidArgumentError, `remove ${p}`)
    await assert.rejects(sbx.files.rename('x', p), InvalidArgumentError, `rename to ${p}`)
  }
  // An absolute path outside /home/user is the sandbox's own filesystem
  // (sandbox.fs), never the host's: its read-only root refuses a write
  // (400, kind permission_denied), and /etc/passwd is the sandbox's.
  await assert.rejects(sbx.files.write('/etc/passwd', 'x'), InvalidArgumentError, 'write /etc/passwd')
  for (const p of ['/etc/passwd', '/home/user/../../etc/passwd']) {
    assert.match(await sbx.files.read(p), /^root:x:0:0:/m, `read ${p}`)
  }
  await assert.rejects(sbx.files.read('no/such/file.txt'), FileNotFoundError)
  await assert.rejects(sbx.files.getInfo('no/such/file.txt'), FileNotFoundError)
  await assert.rejects(sbx.files.list('no/such/dir'), FileNotFoundError)
  assert.equal(await sbx.files.exists('no/such/file.txt'), false)
})

test('a malformed Connect request gets invalid_argument (InvalidArgumentError in the SDK), never a 500', SLOW, async () => {
  sbx ??= await Sandbox.create()
  const headers = {
    'Content-Type': 'application/json',
    'Connect-Protocol-Version': '1',
    'E2b-Sandbox-Id': sbx.sandboxId,
    'E2b-Sandbox-Port': '49983',
    'X-Access-Token': sbx.envdAccessToken,
  }
  for (const body of ['{"path": ', '{"path": 5}', '[]', '']) {
    const res = await fetch(`${SANDBOX_URL}/filesystem.Filesystem/ListDir`, { method: 'POST', headers, body })
    const err = await res.json()
    assert.equal(res.status, 400, `${JSON.stringify(body)}: ${JSON.stringify(err)}`)
    // The SDK maps this Connect code to InvalidArgumentError
    // (e2b src/envd/rpc.ts:72; docs/e2b-protocol.md §3).
    assert.equal(err.code, 'invalid_argument')
  }
  // A streaming call with a broken envelope: the error travels in the
  // end-stream message, and the status is still not a 500.
  const res = await fetch(`${SANDBOX_URL}/process.Process/Start`, {
    method: 'POST',
    headers: { ...headers, 'Content-Type': 'application/connect+json' },
    body: new Uint8Array([0, 0, 0, 0, 9, 123]),
  })
  assert.ok(res.status < 500, `status ${res.status}`)
  const bad = await fetch(`${SANDBOX_URL}/files?path=x`, { method: 'POST', headers: { ...headers, 'Content-Type': 'multipart/form-data; boundary=zzz' }, body: 'not multipart' })
  assert.equal(bad.status, 400)
  await assertJournal(sbx.sandboxId, {})
})

// commands.run: a command in the run's kernel container, under the same jail.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from '@e2b/code-interpreter'
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

test('echo hi && exit 3: stdout hi and exit code 3', SLOW, async () => {
  const sbx = await create()
  const out = []
  await assert.rejects(sbx.commands.run('echo hi && exit 3', { onStdout: (d) => out.push(d) }), (e) => {
    assert.ok(e instanceof CommandExitError, `${e}`)
    assert.equal(e.exitCode, 3)
    assert.equal(e.stdout, 'hi\n')
    return true
  })
  assert.equal(out.join(''), 'hi\n')
  const ok = await sbx.commands.run('echo fine')
  assert.equal(ok.exitCode, 0)
  assert.equal(ok.stdout, 'fine\n')
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 2 })
})

test('a command trying the network fails: the jail is the same', SLOW, async () => {
  const sbx = await create()
  await assert.rejects(
    sbx.commands.run(`python3 -c "import urllib.request; urllib.request.urlopen('http://1.1.1.1', timeout=5)"`),
    (e) => e instanceof CommandExitError && e.exitCode !== 0,
  )
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 1 })
})

test('envs at create and per call, cwd, and files shared with runCode', SLOW, async () => {
  const sbx = await create({ envs: { GREETING: 'hello' } })
  const r = await sbx.commands.run('echo "$GREETING $WHO" > greeting.txt; cat greeting.txt', { envs: { WHO: 'world' } })
  assert.equal(r.stdout, 'hello world\n')
  assert.equal(await sbx.files.read('greeting.txt'), 'hello world\n')
  await sbx.files.makeDir('sub')
  const pwd = await sbx.commands.run('pwd', { cwd: '/home/user/sub' })
  assert.match(pwd.stdout, /\/sub\n$/)
  const exec = await sbx.runCode('open("greeting.txt").read().strip()')
  assert.equal(exec.text, 'hello world')
})

test('a background command can be waited for, and does not hold the sandbox', SLOW, async () => {
  const sbx = await create()
  const h = await sbx.commands.run('while [ ! -e go ]; do sleep 0.05; done; echo done', { background: true })
  assert.ok(h.pid > 0)
  assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid))
  // runCode runs while the command does, and makes the file it waits for.
  await sbx.runCode('open("go", "w").close()')
  const r = await h.wait()
  assert.equal(r.stdout, 'done\n')
  assert.equal(r.exitCode, 0)
  // The start and the end are each a Step Block.
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 3 })
})

test('a background command can be killed, and the kernel keeps its state', SLOW, async () => {
  const sbx = await create()
  await sbx.runCode('kept = 1')
  const h = await sbx.commands.run('sleep 600', { background: true })
  assert.equal(await h.kill(), true)
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode !== 0)
  assert.equal(await sbx.commands.kill(h.pid), false, 'a killed command is gone')
  assert.equal((await sbx.runCode('kept')).text, '1')
  await assertJournal(sbx.sandboxId, { 'sandbox.exec': 4 })
})

test('stdout streams while the command runs', SLOW, async () => {
  const sbx = await create()
  const events = []
  await sbx.commands.run('for i in 0 1 2; do echo "$i $(date +%s.%N)"; sleep 0.5; done', {
    onStdout: (d) => events.push({ d, at: Date.now() / 1000 }),
  })
  const lines = events.flatMap((e) => e.d.trim().split('\n').map((l) => ({ l, at: e.at })))
  assert.equal(lines.length, 3)
  for (let i = 1; i < 3; i++) {
    assert.ok(lines[i - 1].at <= Number(lines[i].l.split(' ')[1]), 'line arrived after the next was printed: not streamed')
  }
})

test("stdin: sendStdin and closeStdin reach cat; the pid is the process's own", SLOW, async () => {
  const sbx = await create()
  const cmd = await sbx.commands.run('cat', { background: true, stdin: true })
  const seen = await sbx.commands.run(`tr '\\0' ' ' < /proc/${cmd.pid}/cmdline`)
  assert.match(seen.stdout, /cat/)
  await sbx.commands.sendStdin(cmd.pid, 'Hello, ')
  await cmd.sendStdin('World!')
  await cmd.closeStdin()
  const done = await cmd.wait()
  assert.equal(done.exitCode, 0)
  assert.equal(done.stdout, 'Hello, World!')
})

test('pty: a terminal takes input, resizes, and is killed at once', SLOW, async () => {
  const sbx = await create()
  let out = ''
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d) }, envs: { ABC: '123' } })
  await sbx.pty.resize(term.pid, { cols: 100, rows: 24 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo $ABC; tput cols\nexit\n'))
  await term.wait()
  assert.equal(term.exitCode, 0)
  assert.match(out, /123/)
  assert.match(out, /100/)
  const other = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
  assert.equal(await sbx.pty.kill(other.pid), true)
  await assert.rejects(sbx.commands.run(`kill -0 ${other.pid}`), CommandExitError)
  assert.equal(await sbx.pty.kill(999999), false)
})

test("a command's timeoutMs raises the SDK's TimeoutError", SLOW, async () => {
  const sbx = await create()
  // timeoutMs bounds the whole request, the start included: on a loaded
  // machine the 2 s can run out before the start answers, and the SDK's
  // TimeoutError then comes from run() rather than wait(). Either way it is
  // the SDK's TimeoutError, past timeoutMs.
  await assert.rejects(async () => {
    const h = await sbx.commands.run('sleep 60', { background: true, timeoutMs: 2000 })
    await h.wait()
  }, (e) => e.name === 'TimeoutError')
})

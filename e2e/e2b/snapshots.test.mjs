// Snapshots, fork, getMetrics and getHost, through the SDK unchanged, and
// a fork through Triad's own API. Each is a Step Block of the run it
// touches; kernel memory is kept by neither a snapshot nor a fork.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import { Sandbox } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'
import { SLOW, API_KEY, assertJournal, triad } from './helpers.mjs'

const sandboxes = []
after(async () => {
  for (const s of sandboxes) await s.kill().catch(() => {})
})

test('createSnapshot keeps the files; a sandbox from it and a fork start from them, with fresh kernels', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  await sbx.files.write('/home/user/app/state.txt', 'before')
  await sbx.commands.run('echo -n from-a-command > /home/user/app/cmd.txt')
  const name = `snap-${Date.now()}`
  const snap = await sbx.createSnapshot({ name })
  assert.ok(snap.snapshotId.length > 0)
  assert.deepEqual(snap.names, [name])
  await sbx.files.write('/home/user/app/state.txt', 'after')

  const listed = await sbx.listSnapshots().nextItems()
  assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId])
  const byName = await Sandbox.listSnapshots({ name }).nextItems()
  assert.deepEqual(byName.map((s) => s.snapshotId), [snap.snapshotId])

  const fromSnap = await Sandbox.create(snap.snapshotId)
  sandboxes.push(fromSnap)
  assert.equal(await fromSnap.files.read('/home/user/app/state.txt'), 'before')
  assert.equal(await fromSnap.files.read('app/cmd.txt'), 'from-a-command')

  const [fork] = await sbx.fork()
  assert.ok(fork instanceof Sandbox, String(fork))
  sandboxes.push(fork)
  assert.notEqual(fork.sandboxId, sbx.sandboxId)
  assert.equal(await fork.files.read('/home/user/app/state.txt'), 'after')
  await fork.files.write('/home/user/app/state.txt', 'in the fork')
  assert.equal(await sbx.files.read('/home/user/app/state.txt'), 'after')
  assert.equal(await fork.isRunning(), true)

  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)

  const got = await assertJournal(sbx.sandboxId, { 'run.snapshot': 1 })
  assert.ok(got.some((s) => s.tool === 'run.snapshot'))
  await assertJournal(fork.sandboxId, { 'run.fork': 1 })
  const cel = await (await triad('/cel', { run: fork.sandboxId })).text()
  assert.match(cel, /Kernel memory is not kept/)
})

test('fork through Triad\'s own API: a new run with the files and a Step Block', SLOW, async () => {
  const run = `r-fork-${Date.now()}`
  let res = await triad('/tmp/write', { run, method: 'POST', body: { path: 'a.csv', text: 'x\n1\n' } })
  assert.equal(res.status, 200, await res.text())
  res = await triad(`/runs/${run}/fork`, { method: 'POST' })
  const f = await res.json()
  assert.equal(res.status, 201, JSON.stringify(f))
  assert.equal(f.from, run)
  assert.equal(f.files, 1)
  assert.equal(f.memory_kept, false)
  res = await triad('/tmp/read?path=a.csv', { run: f.run_id })
  assert.equal((await res.json()).text, 'x\n1\n')
  await assertJournal(f.run_id, { 'run.fork': 1 })
})

test('getMetrics reports CPU, memory and disk from the kernel\'s cgroup', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  await sbx.commands.run('python3 -c "x = bytearray(64 << 20); import time; time.sleep(0.2)"')
  const start = new Date(Date.now() - 60_000)
  const [m] = await sbx.getMetrics({ start, end: new Date() })
  assert.ok(m, 'no reading')
  assert.ok(m.cpuCount >= 1)
  assert.ok(m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, `cpuUsedPct ${m.cpuUsedPct}`)
  assert.ok(m.memUsed > 0, `memUsed ${m.memUsed}: a running kernel uses memory`)
  assert.ok(m.memTotal >= m.memUsed)
  assert.ok(m.diskTotal >= m.diskUsed)
  const old = await sbx.getMetrics({ start: new Date(Date.now() - 3_600_000), end: new Date(Date.now() - 1_800_000) })
  assert.deepEqual(old, [])
})

/** GET through Triad's listener to a getHost host, without DNS. */
function getVia(host, headers = {}) {
  const u = new URL(process.env.E2B_SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, path: '/', headers: { Host: host, ...headers } }, (res) => {
      let body = ''
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.end()
  })
}

test('getHost proxies HTTP to a port in the sandbox, authenticated and journaled', SLOW, async () => {
  const sbx = await Sandbox.create()
  sandboxes.push(sbx)
  await sbx.files.write('site/index.html', 'hello from the sandbox')
  const srv = await sbx.commands.run('cd site && python3 -m http.server 8000', { background: true })
  const host = sbx.getHost(8000)
  assert.match(host, new RegExp(`^8000-${sbx.sandboxId}\\.`))
  let r
  for (let i = 0; i < 100; i++) {
    r = await getVia(host, { 'E2B-Traffic-Access-Token': sbx.trafficAccessToken })
    if (r.status === 200) break
    await new Promise((res) => setTimeout(res, 200))
  }
  assert.equal(r.status, 200, r.body)
  assert.equal(r.body, 'hello from the sandbox')
  // A key that may see the sandbox admits it too.
  const byKey = await getVia(host, { 'X-API-Key': API_KEY })
  assert.equal(byKey.status, 200, byKey.body)
  // Without a credential: E2B's "not found", as for a sandbox that does not exist.
  const anon = await getVia(host)
  assert.equal(anon.status, 502)
  assert.equal(JSON.parse(anon.body).message, 'The sandbox was not found')
  await srv.kill()
  await assertJournal(sbx.sandboxId, { 'sandbox.port': 1 })
})

test('network options: allowPublicTraffic false demands a credential; true with maskRequestHost is public and masks the Host', SLOW, async () => {
  const secure = await CodeSandbox.create({ secure: true, network: { allowPublicTraffic: false } })
  sandboxes.push(secure)
  // The code interpreter works as E2B's secure tests use it.
  assert.equal((await secure.runCode('x = 1; x')).text, '1')
  const server = `import http.server as h
class H(h.BaseHTTPRequestHandler):
    def do_GET(s):
        b = s.headers['Host'].encode()
        s.send_response(200); s.end_headers(); s.wfile.write(b)
h.HTTPServer(('127.0.0.1', 8001), H).serve_forever()`
  await secure.files.write('host.py', server)
  const own = await secure.commands.run('python3 host.py', { background: true })
  let r
  for (let i = 0; i < 100; i++) {
    r = await getVia(secure.getHost(8001), { 'E2B-Traffic-Access-Token': secure.trafficAccessToken })
    if (r.status === 200) break
    await new Promise((res) => setTimeout(res, 200))
  }
  assert.equal(r.status, 200, r.body)
  assert.equal((await getVia(secure.getHost(8001))).status, 502)
  await own.kill()

  const open = await Sandbox.create({ network: { allowPublicTraffic: true, maskRequestHost: '${PORT}-app.example.test' } })
  sandboxes.push(open)
  await open.files.write('host.py', server)
  const pub = await open.commands.run('python3 host.py', { background: true })
  for (let i = 0; i < 100; i++) {
    r = await getVia(open.getHost(8001))
    if (r.status === 200) break
    await new Promise((res) => setTimeout(res, 200))
  }
  assert.equal(r.status, 200, r.body)
  assert.equal(r.body, '8001-app.example.test')
  await pub.kill()
  await assertJournal(open.sandboxId, { 'sandbox.port': 1 })

  // A mask that is no host, and network options Triad does not read, are
  // refused with what to send.
  await assert.rejects(Sandbox.create({ network: { maskRequestHost: 'a b' } }), /400|maskRequestHost/)
  await assert.rejects(Sandbox.create({ network: { httpsPorts: [8443] } }), /422|httpsPorts/)
})

// bench.mjs: what the E2B surface adds to a cell, and how fast output
// streams. Times N runCode('1+1') calls through @e2b/code-interpreter
// against N POST /sandbox/exec calls on Triad's own API, interleaved, on the
// same server in the same run, and prints the medians and their ratio; then
// runs one cell that prints the kernel's clock N times and reports how long
// each line took to reach onStdout (kernel and host share one clock). Run it
// against a triad serve:
//   E2B_API_URL=... E2B_SANDBOX_URL=... E2B_API_KEY=... node bench.mjs [N]
import { Sandbox } from '@e2b/code-interpreter'
import { randomUUID } from 'node:crypto'
import { triad } from './helpers.mjs'

const n = Number(process.argv[2] ?? 50)
const sbx = await Sandbox.create()
const run = `bench-${randomUUID()}`
await sbx.runCode('1+1') // both kernels warm before timing
await triad('/sandbox/exec', { run, method: 'POST', body: { code: '1+1' } })

const e2b = []
const own = []
for (let i = 0; i < n; i++) {
  let t = performance.now()
  const exec = await sbx.runCode('1+1')
  e2b.push(performance.now() - t)
  if (exec.text !== '2') throw new Error(`runCode answered ${exec.text}`)
  t = performance.now()
  const res = await triad('/sandbox/exec', { run, method: 'POST', body: { code: '1+1' } })
  const body = await res.json()
  own.push(performance.now() - t)
  if (body.result?.data?.['text/plain'] !== '2') throw new Error(`sandbox.exec answered ${JSON.stringify(body)}`)
}

const lag = []
await sbx.runCode(`import time\nfor i in range(${n}):\n    print(repr(time.time()), flush=True)\n    time.sleep(0.05)`, {
  onStdout: (m) => {
    const at = Date.now() / 1000
    for (const l of m.line.trim().split('\n')) lag.push((at - Number(l)) * 1000)
  },
})
await sbx.kill()
const q = (a, p) => [...a].sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(a.length * p))]
console.log(`n=${n} runCode p50 ${q(e2b, 0.5).toFixed(1)} ms, POST /sandbox/exec p50 ${q(own, 0.5).toFixed(1)} ms, ratio ${(q(e2b, 0.5) / q(own, 0.5)).toFixed(2)}`)
console.log(`print -> onStdout: p50 ${q(lag, 0.5).toFixed(1)} ms, p90 ${q(lag, 0.9).toFixed(1)} ms, max ${Math.max(...lag).toFixed(1)} ms over ${lag.length} lines`)

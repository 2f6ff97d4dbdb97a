// bench.mjs: what the E2B surface adds to a cell. Times N runCode('1+1')
// calls through @e2b/code-interpreter against N POST /sandbox/exec calls on
// Triad's own API, interleaved, on the same server in the same run, and
// prints the medians and their ratio. Run it against a triad serve:
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
await sbx.kill()
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)]
console.log(`n=${n} runCode p50 ${median(e2b).toFixed(1)} ms, POST /sandbox/exec p50 ${median(own).toFixed(1)} ms, ratio ${(median(e2b) / median(own)).toFixed(2)}`)

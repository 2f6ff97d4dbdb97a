// The first runCode in R and in JavaScript against the first in Python,
// through @e2b/code-interpreter against a running triad serve (the same
// variables as the suite). Each language gets fresh sandboxes, so its first
// cell includes starting its kernel; Python's kernel comes from the warm
// pool, as an agent's does. Rounds alternate the languages so load on a
// shared machine falls on each alike; the ratios are of medians.
//
//   node e2e/e2b/bench-languages.mjs [rounds]
import { Sandbox } from '@e2b/code-interpreter'

const rounds = Number(process.argv[2] ?? 3)
const cells = {
  python: '1+1',
  r: '1+1',
  javascript: '1+1',
}
const times = { python: [], r: [], javascript: [] }

for (let i = 0; i < rounds; i++) {
  for (const lang of Object.keys(cells)) {
    const sbx = await Sandbox.create()
    try {
      const t0 = performance.now()
      const exec = await sbx.runCode(cells[lang], { language: lang, timeoutMs: 300_000 })
      const ms = performance.now() - t0
      const got = exec.text ?? exec.results[0]?.text
      if (exec.error || !/2/.test(got ?? '')) throw new Error(`${lang}: ${JSON.stringify(exec.error ?? got)}`)
      times[lang].push(ms)
    } finally {
      await sbx.kill().catch(() => {})
    }
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const py = median(times.python)
console.log(`first runCode('1+1'), median of ${rounds} fresh sandboxes each:`)
for (const lang of Object.keys(cells)) {
  const m = median(times[lang])
  console.log(`  ${lang.padEnd(10)} ${m.toFixed(0).padStart(6)} ms  ${(m / py).toFixed(2)}x python  (${times[lang].map((t) => t.toFixed(0)).join(', ')})`)
}

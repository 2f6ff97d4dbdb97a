// Shared helpers for the E2B SDK suite: the environment it runs in, Triad's
// own API, and the journal check every test ends with.
//
// The suite drives a running `triad serve` with E2B's official SDKs,
// unchanged: E2B_API_URL and E2B_SANDBOX_URL point at it, E2B_API_KEY is the
// key it was started with (--e2b-api-key). TRIAD_URL is Triad's own API
// (the same listener by default).
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'

export const API_URL = must('E2B_API_URL')
export const SANDBOX_URL = must('E2B_SANDBOX_URL')
export const API_KEY = must('E2B_API_KEY')
export const TRIAD_URL = process.env.TRIAD_URL ?? API_URL
/** Triad's own API key (a server with keys demands one); empty sends none. */
export const TRIAD_API_KEY = process.env.TRIAD_API_KEY ?? ''

function must(name) {
  const v = process.env[name]
  if (!v) {
    throw new Error(`${name} is not set: run this suite against a triad serve (see cmd/triad/e2b_sdk_test.go)`)
  }
  return v
}

/** A generous per-test limit: kernels start in containers on a busy machine. */
export const SLOW = { timeout: 180_000 }

/** Calls Triad's own HTTP API. */
export async function triad(path, { run, method = 'GET', body, headers = {} } = {}) {
  const h = { ...headers }
  if (run) h['X-Run-Id'] = run
  if (TRIAD_API_KEY && !h.Authorization) h.Authorization = `Bearer ${TRIAD_API_KEY}`
  if (body !== undefined && typeof body !== 'string') {
    h['Content-Type'] = 'application/json'
    body = JSON.stringify(body)
  }
  return fetch(`${TRIAD_URL}${path}`, { method, headers: h, body })
}

export function sha256(bytes) {
  return createHash('sha256').update(bytes).digest('hex')
}

/** The Step Blocks of a journal: number, tool and evaluation verdict. */
export function steps(cel) {
  const out = []
  const late = {}
  for (const m of cel.matchAll(/### Late verdict of Step (\d+): \S+\n(?:.*\n)*?\*\*Evaluation \(by Evaluator\):\*\* (\S+)/g)) {
    late[Number(m[1])] = m[2]
  }
  for (const block of cel.split(/\n(?=## Step \d+: )/).slice(1)) {
    const head = block.match(/^## Step (\d+): (\S+)/)
    const ev = block.match(/\*\*Evaluation \(by Evaluator\):\*\* (\S+)/)
    const n = Number(head[1])
    // A step the evaluator could not grade in time is UNGRADED in its
    // Step Block; the journal is append-only, so its verdict arrives later
    // in a "Late verdict of Step N" section, which is the step's verdict.
    out.push({ n, tool: head[2], evaluation: late[n] ?? (ev ? ev[1] : undefined) })
  }
  return out
}

/**
 * Reads the sandbox's journal through Triad's GET /cel and checks that it
 * holds at least `want[tool]` Step Blocks per tool, numbered 1..n with no
 * gap, and that every one has a finished evaluation (PASS or FAIL, never
 * PENDING or missing).
 */
export async function assertJournal(sandboxId, want) {
  // On a loaded host the evaluator can miss its deadline: the step is
  // UNGRADED and the regrader grades it again within seconds (backoff from
  // 1 s). Wait for the late verdicts, bounded by the test's own timeout.
  let res, cel, got
  for (let wait = 250; ; wait = Math.min(wait * 2, 4000)) {
    res = await triad('/cel', { run: sandboxId })
    cel = await res.text()
    assert.equal(res.status, 200, `GET /cel for ${sandboxId}: ${cel}`)
    got = steps(cel)
    if (!got.some((s) => s.evaluation === 'UNGRADED')) break
    await new Promise((r) => setTimeout(r, wait))
  }
  got.forEach((s, i) => {
    assert.equal(s.n, i + 1, `step numbers have a gap at ${i + 1}`)
    assert.ok(s.evaluation === 'PASS' || s.evaluation === 'FAIL', `step ${s.n} (${s.tool}) is evaluated ${s.evaluation}\n${cel}`)
  })
  assert.ok(!cel.includes('PENDING'), `the journal has a PENDING step:\n${cel}`)
  const count = {}
  for (const s of got) count[s.tool] = (count[s.tool] ?? 0) + 1
  for (const [tool, n] of Object.entries(want)) {
    assert.ok((count[tool] ?? 0) >= n, `want at least ${n} ${tool} Step Blocks, got ${count[tool] ?? 0}:\n${cel}`)
  }
  return got
}

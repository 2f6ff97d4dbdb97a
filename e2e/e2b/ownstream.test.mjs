// Triad's own API streams too: POST /sandbox/exec with Accept:
// text/event-stream sends the cell's output as it runs and ends with the
// JSON the plain call returns.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { SLOW, triad } from './helpers.mjs'

/** Parses an SSE body into [{event, data}]. */
function parseSSE(text) {
  return text.split(/\r?\n\r?\n/).filter((b) => b.trim()).map((block) => {
    const ev = { event: 'message', data: '' }
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith('event:')) ev.event = line.slice(6).trim()
      else if (line.startsWith('data:')) ev.data += (ev.data ? '\n' : '') + line.slice(5).replace(/^ /, '')
    }
    return ev
  })
}

const loop = 'import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.5)'

test('SSE exec streams the loop line by line and ends with the plain answer', SLOW, async () => {
  const plain = await (await triad('/sandbox/exec', { run: `sse-${randomUUID()}`, method: 'POST', body: { code: loop } })).json()

  const res = await triad('/sandbox/exec', {
    run: `sse-${randomUUID()}`, method: 'POST', body: { code: loop }, headers: { Accept: 'text/event-stream' },
  })
  assert.match(res.headers.get('content-type') ?? '', /^text\/event-stream/)
  // Read the body as it arrives, recording when each stdout event came
  // relative to the others.
  const events = []
  const decoder = new TextDecoder()
  let buf = ''
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true })
    const cut = buf.lastIndexOf('\n\n')
    if (cut < 0) continue
    events.push(...parseSSE(buf.slice(0, cut)))
    buf = buf.slice(cut + 2)
  }
  events.push(...parseSSE(buf))
  const stdout = events.filter((e) => e.event === 'stdout').map((e) => JSON.parse(e.data).text)
  assert.deepEqual(stdout, ['0\n', '1\n', '2\n'])
  const last = JSON.parse(events.at(-1).data)
  delete last.duration_ms
  delete plain.duration_ms
  assert.deepEqual(last, plain)
})

test('SSE exec sends each line before the next is printed', SLOW, async () => {
  const res = await triad('/sandbox/exec', {
    run: `sse-${randomUUID()}`, method: 'POST', headers: { Accept: 'text/event-stream' },
    body: { code: 'import time\nfor i in range(3):\n    print(i, time.time(), flush=True)\n    time.sleep(0.5)' },
  })
  // Kernel and host share one clock: line i must arrive before line i+1
  // is printed. An ordering of events, not a duration.
  const arrived = []
  const decoder = new TextDecoder()
  let buf = ''
  for await (const chunk of res.body) {
    buf += decoder.decode(chunk, { stream: true })
    const cut = buf.lastIndexOf('\n\n')
    if (cut < 0) continue
    const at = Date.now() / 1000
    for (const e of parseSSE(buf.slice(0, cut))) if (e.event === 'stdout') arrived.push({ text: JSON.parse(e.data).text, at })
    buf = buf.slice(cut + 2)
  }
  const lines = arrived.flatMap((a) => a.text.trim().split('\n').map((l) => ({ l, at: a.at })))
  assert.equal(lines.length, 3)
  for (let i = 1; i < 3; i++) {
    assert.ok(lines[i - 1].at <= Number(lines[i].l.split(' ')[1]), `line ${i - 1} arrived after line ${i} was printed: not streamed`)
  }
})

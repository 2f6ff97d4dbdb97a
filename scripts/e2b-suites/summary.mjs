// Merges vitest's JSON reports of one suite (scripts/e2b-suites.sh runs the
// npm-SDK and source-SDK halves separately) into one report and prints the
// counts and each failure.
//
//   node summary.mjs NAME SUITE_ROOT OUT REPORT...
import { readFileSync, writeFileSync } from 'node:fs'
import path from 'node:path'

const [name, root, outFile, ...reports] = process.argv.slice(2)
const merged = { testResults: [] }
for (const r of reports) merged.testResults.push(...JSON.parse(readFileSync(r, 'utf8')).testResults)
writeFileSync(outFile, JSON.stringify(merged, null, 1))

const count = { files: 0, tests: 0, passed: 0, failed: 0, skipped: 0 }
const failures = []
for (const file of merged.testResults) {
  count.files++
  const rel = path.relative(root, file.name)
  if (file.assertionResults.length === 0 && file.status === 'failed') {
    // A file that failed before any test ran (an import, a hook).
    failures.push(`FAIL ${rel} > (file) ${(file.message ?? '').split('\n')[0]}`)
  }
  for (const t of file.assertionResults) {
    count.tests++
    if (t.status === 'passed') count.passed++
    else if (t.status === 'failed') {
      count.failed++
      const why = (t.failureMessages?.[0] ?? '').split('\n')[0].slice(0, 200)
      failures.push(`FAIL ${rel} > ${t.fullName} :: ${why}`)
    } else count.skipped++
  }
}
console.log(`SUITE ${name} files=${count.files} tests=${count.tests} passed=${count.passed} failed=${count.failed} skipped=${count.skipped}`)
for (const f of failures) console.log(f)

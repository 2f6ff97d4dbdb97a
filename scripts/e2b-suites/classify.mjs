// Sorts an E2B suite's test files into the two ways scripts/e2b-suites.sh
// runs them (see vitest.config.mjs):
//   npm  the file reaches the SDK only through names the pinned npm package
//        exports, so its imports of ../src can be that package;
//   src  the file mocks the SDK's internals (vi.mock, vi.doMock, msw) or
//        uses a value the npm package does not export (mapEntryInfo,
//        CommandHandle, ...): it keeps the suite's own SDK source. These are
//        the SDK's unit tests; they never reach a server.
//
//   node classify.mjs SUITE_ROOT SDK_PACKAGE FILE...
// prints "npm<TAB>file" or "src<TAB>file" per file.
import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'

const [root, sdk, ...files] = process.argv.slice(2)
const exported = new Set(Object.keys(await import(sdk)))
const src = path.join(root, 'src')
let cache // the SDK source's files, read once

for (const file of files) {
  const text = readFileSync(path.join(root, file), 'utf8')
  console.log(`${classify(file, text)}\t${file}`)
}

function classify(file, text) {
  if (/\bvi\.(do)?[mM]ock\(|from ['"]msw/.test(text)) return 'src'
  const imports = /import\s+(type\s+)?\{([^}]*)\}\s*from\s*['"]([^'"]+)['"]/g
  for (const m of text.matchAll(imports)) {
    if (m[1] || !m[3].startsWith('.')) continue
    const target = path.resolve(path.dirname(path.join(root, file)), m[3])
    if (target !== src && !target.startsWith(src + path.sep)) continue
    const rest = text.slice(0, m.index) + text.slice(m.index + m[0].length)
    for (let name of m[2].split(',')) {
      name = name.trim()
      if (!name || name.startsWith('type ')) continue
      name = name.split(/\s+as\s+/).pop()
      // A name neither build exports (a test's stale import) is undefined
      // either way, so it does not decide.
      if (!exported.has(name) && srcExports(name) && usedAsValue(rest, name)) return 'src'
    }
  }
  return 'npm'
}

// srcExports says whether the SDK's source exports a value by that name.
function srcExports(name) {
  return sourceText().some((t) => new RegExp(`export\\s+(declare\\s+)?(abstract\\s+)?(async\\s+)?(class|function|const|let|enum)\\s+${name}\\b`).test(t))
}

function sourceText() {
  if (!cache) {
    cache = readdirSync(src, { recursive: true })
      .filter((f) => /\.(ts|js)$/.test(f))
      .map((f) => readFileSync(path.join(src, f), 'utf8'))
  }
  return cache
}

// usedAsValue says whether a name appears where TypeScript keeps it at run
// time (esbuild drops imports used only as types): called, constructed,
// tested with instanceof, read a member of, or passed as an argument.
function usedAsValue(text, name) {
  const n = name.replace(/[$]/g, '\\$')
  return new RegExp(`(new\\s+|instanceof\\s+|[(,]\\s*)${n}\\b|\\b${n}\\s*[.(]`).test(text)
}

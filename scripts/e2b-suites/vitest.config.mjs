// The vitest configuration scripts/e2b-suites.sh runs E2B's own test suites
// with. It is Triad's, not E2B's: the suites stay checked out outside this
// repository, unchanged, and this file only tells vitest where they are and
// which SDK build their imports of the SDK's source reach.
//
// Read from the environment (scripts/e2b-suites.sh sets them):
//   E2B_SUITE_ROOT   the suite's package directory (code-interpreter/js or
//                    E2B/packages/js-sdk)
//   E2B_SUITE_SDK    the npm package the suite tests (@e2b/code-interpreter
//                    or e2b)
//   E2B_SUITE_MODE   npm: every import of the suite's ../src resolves to that
//                    npm package as pinned in package-lock.json here, so the
//                    tests drive the same SDK build as e2e/e2b; src: imports
//                    stay on the suite's own source (for the SDK's unit tests
//                    that mock its internals and never reach a server)
//   E2B_SUITE_FILES  the test files to run, one per line, relative to the root
//   E2B_SUITE_TIMEOUT_MS  the per-test timeout (default: the suite's own, 30 s)
//
// The endpoint is the suites' own hook: the SDK reads E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY from process.env, which vitest passes on.
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { defineConfig } from 'vitest/config'

const here = path.dirname(fileURLToPath(import.meta.url))
const root = process.env.E2B_SUITE_ROOT
if (!root) throw new Error('E2B_SUITE_ROOT is not set: run this through scripts/e2b-suites.sh')
const sdk = process.env.E2B_SUITE_SDK
const mode = process.env.E2B_SUITE_MODE ?? 'npm'
const files = (process.env.E2B_SUITE_FILES ?? '').split('\n').filter(Boolean)
const src = path.join(root, 'src')
// Bare imports from the suite (vitest, msw, dotenv, the SDK source's own
// dependencies) resolve from the runner's node_modules: the checkouts have
// none of their own.
const anchor = path.join(here, 'node_modules', '.resolve-anchor.js')

/** Resolves the suite's imports as E2B_SUITE_MODE says. */
function suiteImports() {
  return {
    name: 'triad-e2b-suite-imports',
    enforce: 'pre',
    async resolveId(source, importer, options) {
      if (!importer || !importer.startsWith(root + path.sep)) return null
      if (source.startsWith('.')) {
        const target = path.resolve(path.dirname(importer), source)
        const inSrc = target === src || target.startsWith(src + path.sep)
        if (mode === 'npm' && inSrc && !importer.startsWith(src + path.sep)) {
          return this.resolve(sdk, anchor, { ...options, skipSelf: true })
        }
        return null
      }
      if (source.startsWith('/') || source.startsWith('node:') || source.startsWith('\0') || source.startsWith('virtual:')) return null
      return this.resolve(source, anchor, { ...options, skipSelf: true })
    },
  }
}

const setupFiles = []
if (mode === 'src' && sdk === 'e2b') setupFiles.push(path.join(root, 'tests', 'globalFetchFallback.setup.ts'))

export default defineConfig({
  root,
  plugins: [suiteImports()],
  server: { fs: { allow: [root, here] } },
  test: {
    include: files.length ? files : ['tests/**/*.test.ts'],
    exclude: ['tests/runtimes/**', 'tests/template/**'],
    isolate: true,
    globals: false,
    testTimeout: Number(process.env.E2B_SUITE_TIMEOUT_MS ?? 30_000),
    environment: 'node',
    bail: 0,
    setupFiles,
    deps: { interopDefault: true },
    env: { ...process.env },
  },
})

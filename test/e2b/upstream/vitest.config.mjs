// E2B's template suite (tests/template of e2b-dev/E2B's packages/js-sdk),
// as E2B's own vitest.config.mts runs it (its "template" project), less
// the files that test the SDK's internals, which the npm package does not
// export.
import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['tests/template/**/*.test.ts'],
    exclude: [
      'tests/template/uploadFile.test.ts', // src/template/buildApi
      'tests/template/utils/**', // src/template/utils, readycmd, errors
    ],
    globals: false,
    testTimeout: 180_000,
    environment: 'node',
    // One file at a time: the server's builds per key are bounded.
    fileParallelism: false,
    setupFiles: ['./undici-unavailable.setup.mjs'],
    // The SDK through vitest's module runner, so that the setup's mocks
    // reach its imports.
    server: { deps: { inline: ['e2b'] } },
  },
})

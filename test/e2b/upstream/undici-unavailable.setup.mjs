// As E2B's own setup of these tests (tests/globalFetchFallback.setup.ts,
// which mocks the SDK's source): the SDK finds no undici and falls back
// to the global fetch, which msw mocks for the suites that mock the API.
import { vi } from 'vitest'

vi.mock('undici', () => {
  throw new Error('undici is left out of these tests, as E2B leaves it out of its own')
})
vi.mock('undici8', () => {
  throw new Error('undici is left out of these tests, as E2B leaves it out of its own')
})

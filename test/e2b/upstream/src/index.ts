// E2B's tests import the SDK's sources ('../../src'); here they get the
// npm package pinned in package.json, as a program would.
export * from 'e2b'

// Loaded with node --import: names under VIVARIUM_E2B_TEST_DOMAIN
// (api.DOMAIN, 49983-<id>.DOMAIN ...) resolve to 127.0.0.1, where the
// test's TLS front for vivarium serve listens, as wildcard DNS would.
import dns from 'node:dns'

const domain = process.env.VIVARIUM_E2B_TEST_DOMAIN
const lookup = dns.lookup
if (domain) {
  dns.lookup = function (host, options, callback) {
    if (typeof options === 'function') {
      callback = options
      options = {}
    }
    if (host !== domain && !host.endsWith('.' + domain)) {
      return lookup.call(this, host, options, callback)
    }
    if (typeof options === 'object' && options?.all) {
      return process.nextTick(callback, null, [{ address: '127.0.0.1', family: 4 }])
    }
    return process.nextTick(callback, null, '127.0.0.1', 4)
  }
}

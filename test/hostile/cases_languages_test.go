//go:build linux

package hostile

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// The kernels of other languages (internal/runner/kernels.py) are processes
// of the sandbox like any other: the same user, namespaces, seccomp filter
// and limits. These cases attack through Node's own APIs (child_process,
// fs, net, process), in the javascript context, so that a kernel started
// anywhere but inside the sandbox, or with more privilege, is caught.
var languageCases = []hostileCase{
	{
		name: "node_kernel_privileges",
		code: `
const fs = require('fs')
const st = Object.fromEntries(fs.readFileSync('/proc/self/status', 'utf8').trim().split('\n').map((l) => l.split(':\t')))
// The sandbox user's uid is 1000, or a host uid of a pool (docker): never 0.
console.log('uid root', process.getuid() === 0 || process.geteuid() === 0 || process.getgid() === 0)
for (const k of ['CapEff', 'CapBnd', 'NoNewPrivs', 'Seccomp']) console.log(k, (st[k] || 'absent').trim())
const attempt = (what, f) => { try { f(); console.log(what, 'succeeded') } catch (e) { console.log(what, e.code) } }
attempt('setuid 0', () => process.setuid(0))
attempt('setgid 0', () => process.setgid(0))
attempt('kill 1', () => process.kill(1, 'SIGKILL'))
`,
		prepare: inJavaScript,
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("uid root false", "CapEff 0000000000000000", "CapBnd 0000000000000000",
				"NoNewPrivs 1", "Seccomp 2", "setuid 0 EPERM", "setgid 0 EPERM", "kill 1 EPERM"))
		},
	},
	{
		name: "node_child_process_and_fs",
		code: `
const fs = require('fs')
const cp = require('child_process')
const attempt = (what, f) => { try { const r = f(); console.log(what, r === undefined ? 'succeeded' : r) } catch (e) { console.log(what, e.code || e.status) } }
// Refused either way: absent from the sandbox's root, or in its /root,
// which the sandbox user may not enter.
try { fs.readFileSync(process.env.SECRET_PATH, 'utf8'); console.log('read host secret succeeded') } catch (e) {
  console.log('read host secret', ['ENOENT', 'EACCES'].includes(e.code) ? 'refused' : e.code)
}
// Whether these fail in the sandbox depends on its root (read-only, or
// writable and its own): the check is that the host's files are unchanged.
try { fs.writeFileSync('/usr/vivarium-node-canary', 'x') } catch {}
try { fs.chmodSync('/usr/bin/node', 0o4777) } catch {}
try { fs.appendFileSync('/etc/passwd', 'evil::0:0::/:/bin/sh\n') } catch {}
console.log('canary in env', JSON.stringify(process.env).includes('` + testutil.CanaryEnv + `'))
console.log('child id is the kernel\'s', cp.execFileSync('id', ['-u']).toString().trim() === String(process.getuid()))
console.log('child sees secret', cp.spawnSync('cat', [process.env.SECRET_PATH]).status !== 0 ? 'no' : 'yes')
console.log('child su', cp.spawnSync('su', ['-c', 'id -u', 'root'], { stdio: 'pipe' }).status === 0 ? 'root' : 'refused')
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			inJavaScript(t, h, j)
			j.vars["SECRET_PATH"] = h.canaries.SecretPath
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			wantOK(t, o, lines("read host secret refused", "canary in env false", "child id is the kernel's true", "child sees secret no",
				"child su refused"))
			if _, err := os.Lstat("/usr/vivarium-node-canary"); err == nil {
				os.Remove("/usr/vivarium-node-canary")
				t.Error("the sandbox wrote the host's /usr")
			}
			if fi, err := os.Stat("/usr/bin/node"); err == nil && fi.Mode()&(os.ModeSetuid|0o002) != 0 {
				t.Errorf("the host's node is now %v", fi.Mode())
			}
			if b, _ := os.ReadFile("/etc/passwd"); strings.Contains(string(b), "evil::0:0") {
				t.Error("the sandbox wrote the host's /etc/passwd")
			}
		},
	},
	{
		name: "node_network_to_host",
		code: `
const net = require('net')
const ports = process.env.PORTS.split(',').map(Number)
for (const port of ports) {
  const r = await new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port })
    s.on('connect', () => { s.destroy(); resolve('connected') })
    s.on('error', (e) => resolve(e.code))
  })
  console.log(port, r)
}
`,
		prepare: func(t *testing.T, h *harness, j *job) {
			inJavaScript(t, h, j)
			j.vars["PORTS"] = fmt.Sprintf("%d,%d", canaryPorts[0], canaryPorts[1])
		},
		check: func(t *testing.T, h *harness, o *outcome) {
			// The sandbox's loopback is its own: nothing listens there.
			wantOK(t, o, lines(fmt.Sprintf("%d ECONNREFUSED", canaryPorts[0]), fmt.Sprintf("%d ECONNREFUSED", canaryPorts[1])))
		},
	},
}

// inJavaScript runs the case's code in the javascript context; the host
// must have Node (the sandbox shows its /usr).
func inJavaScript(t *testing.T, h *harness, j *job) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("needs node (Node.js) on the host")
	}
	j.Request.Context = "javascript"
	j.Request.Filename = ""
}

func init() {
	for _, c := range languageCases {
		wasmDifferences[c.name] = difference{why: "a wasm sandbox runs Python only: it has no javascript context, and no processes"}
	}
	gvisorDifferences["node_kernel_privileges"] = difference{
		why: sentryProc + ": its status has no NoNewPrivs line (capabilities_and_no_new_privs checks it with prctl)",
		check: want("uid root false", "CapEff 0000000000000000", "CapBnd 0000000000000000", "NoNewPrivs absent",
			"Seccomp 2", "setuid 0 EPERM", "setgid 0 EPERM", "kill 1 EPERM")}
}

package native

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// Two sandboxes of a key that mount one volume meet on a Unix socket in
// it; one after another, senders fill a 128 MiB memfd, hand it to the
// receiver and are closed. Their pages stay charged to their ended
// groups, outside every live sandbox's limit, for as long as the
// receiver holds them (docs/security.md, Volumes): without a ceiling
// the key holds 128 MiB more with each sender, bounded by nothing. Under
// the key's ceiling (MemoryPerTenant), or without groups per key under
// the one on all sandboxes (MemoryTotal), 384 MiB here, they stay within
// it, the ended ones' charges included: the kernel OOM-kills a process
// of the sandboxes' code, and that sandbox's execution ends as
// memory_limit.
func TestCeilingBoundsHandedMemory(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequirePython(t)
	const ceiling = 384 << 20
	for _, c := range []struct {
		name, tenant string
		cfg          Config
	}{
		{"per key", "key_memtest", Config{MemoryPerTenant: ceiling}},
		{"all sandboxes", "", Config{MemoryTotal: ceiling}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.CgroupParent, cfg.UIDBase, cfg.UIDRanges = "vivarium-native-ceiling-test", DefaultUIDBase+38<<24, 8
			cfg.Zygote = testutil.ZygoteMode()
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			handOver(t, b, c.tenant, ceiling)
		})
	}
}

// handOver runs the receiver and five senders of tenant on b, and fails
// if what the tenant's group (with tenant "", the backend's parent)
// holds goes past ceiling or nothing is killed.
func handOver(t *testing.T, b *Backend, tenant string, ceiling int64) {
	st, err := volume.Open(volume.Config{Dir: filepath.Join(t.TempDir(), "volumes"), MaxSize: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Unavailable(); err != nil {
		t.Skipf("volumes unavailable: %v", err)
	}
	const owner = "key_memtest"
	if _, err := st.Create(owner, "v", 0); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	create := func(memory int64) sandbox.Sandbox {
		t.Helper()
		l, err := st.Acquire(owner, "v", true)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.Release)
		sb, err := b.Create(ctx, sandbox.Spec{Tenant: tenant, Limits: sandbox.Limits{Memory: memory},
			Volumes: []sandbox.VolumeMount{{Path: "/mnt/vol", Mount: l.Mount, Name: "v"}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Close() })
		return sb
	}
	receiver := create(128 << 20)
	res, err := receiver.Execute(ctx, sandbox.ExecRequest{Code: `import socket, threading
held = []
srv = socket.socket(socket.AF_UNIX)
srv.bind("/mnt/vol/rendezvous")
srv.listen(8)
def serve():
    while True:
        c, _ = srv.accept()
        try:
            msg, fds, _, _ = socket.recv_fds(c, 16, 4)
            held.extend(fds)
            c.send(b"k")
        except OSError:
            pass
        c.close()
threading.Thread(target=serve, daemon=True).start()`}, nil)
	if err != nil || res.Status != sandbox.StatusOK {
		t.Fatalf("the receiver: %v %+v", err, res)
	}
	usage := func() int64 {
		n, err := b.cgroups.TenantMemory(tenant)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	t.Logf("with the receiver alone: %d MiB", usage()>>20)
	var limited int
	for i := range 5 {
		// Its own limit is no bound on what it hands over.
		sender := create(256 << 20)
		res, err := sender.Execute(ctx, sandbox.ExecRequest{Code: `import os, socket
fd = os.memfd_create("pinned")
for _ in range(128):
    os.write(fd, b"x" * (1 << 20))
c = socket.socket(socket.AF_UNIX)
c.connect("/mnt/vol/rendezvous")
socket.send_fds(c, [b"m"], [fd])
c.recv(1)
print("handed over")`}, nil)
		if err != nil {
			t.Fatal(err)
		}
		what := string(res.Status)
		if res.Error != nil && res.Status != sandbox.StatusMemoryLimit {
			what += ": " + res.Error.Value
		}
		if res.Status == sandbox.StatusMemoryLimit {
			limited++
		}
		sender.Close()
		n := usage()
		t.Logf("sender %d (%s %s), closed: %d MiB held", i, what, strings.TrimSpace(res.Stdout), n>>20)
		if n > ceiling {
			t.Fatalf("%d MiB held, over the ceiling of %d MiB", n>>20, ceiling>>20)
		}
	}
	res, err = receiver.Execute(ctx, sandbox.ExecRequest{Code: "print(len(held))"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the receiver after: %s %s", res.Status, strings.TrimSpace(res.Stdout))
	if res.Status != sandbox.StatusOK {
		limited++ // the receiver was the OOM killer's choice
	}
	if limited == 0 {
		t.Errorf("five 128 MiB memfds handed over under a ceiling of %d MiB, and nothing was killed", ceiling>>20)
	}
}

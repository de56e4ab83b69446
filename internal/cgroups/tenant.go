//go:build linux

package cgroups

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// A tenant's group holds the groups of its sandboxes: parent/TENANT/SANDBOX.
// Tenant groups are siblings with one weight each, so the kernel shares CPU
// (and, where the I/O scheduler weighs groups, disk time) between tenants
// first and only then between a tenant's sandboxes: a tenant running many
// busy sandboxes gets its one share, not one per sandbox. It may also have
// a memory ceiling (Ceilings.Tenant): all of a tenant's sandboxes, and
// what ended ones left charged to it, within one bound.
//
// The weights are the kernel's defaults, written explicitly so that a group
// left from an earlier process or changed by hand is set right again.
const (
	tenantCPUShares = 1024 // cgroup v1 cpu.shares
	tenantCPUWeight = 100  // cgroup v2 cpu.weight
	tenantIOWeight  = 100  // blkio.bfq.weight, io.weight, io.bfq.weight
)

// validTenant: a tenant's name goes into a path. It is an id (an API key's,
// "key_" and hex), never a secret: 1 to 64 letters, digits, '_' and '-'.
func validTenant(name string) error {
	ok := len(name) > 0 && len(name) <= 64
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("cgroups: invalid tenant name %q (1 to 64 letters, digits, '_' or '-')", name)
	}
	return nil
}

// tenants counts the live groups of each tenant group in this process, so
// that the tenant's group is made with its first sandbox and removed with
// its last. One count per tenant group path, for every Manager of the
// process: two managers of the same parent share their tenants' groups.
var tenants = tenantCounts{n: map[string]int{}}

type tenantCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// acquire counts one more group of the tenant whose group is at key,
// calling create first when there was none.
func (t *tenantCounts) acquire(key string, create func() error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n[key] == 0 {
		if err := create(); err != nil {
			return err
		}
	}
	t.n[key]++
	return nil
}

// release counts one group less, and calls remove after the last one.
// The lock is held meanwhile: a New of the same tenant waits, rather than
// making its group in a directory about to be removed.
func (t *tenantCounts) release(key string, remove func() error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n[key]--; t.n[key] > 0 {
		return nil
	}
	delete(t.n, key)
	return remove()
}

// removeTenantDirs removes a tenant's (empty) group directories. A tenant
// group holds no process, so rmdir succeeds at once when its sandboxes'
// groups are gone; one that fails (a sandbox's group that could not be
// removed) is reported and stays for the next Sweep.
func removeTenantDirs(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		if err := rmdirGroup(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			if errors.Is(err, syscall.EBUSY) || errors.Is(err, syscall.ENOTEMPTY) {
				err = fmt.Errorf("cgroups: tenant group %s still holds a group: %w", d, err)
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

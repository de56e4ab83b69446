package cgroups

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// MemoryReader is a Group that tells the memory charged to it now (a
// sandbox's metrics over time; Stats has the peak only, and is read with
// every execution, where one more file read costs).
type MemoryReader interface {
	MemoryCurrent() (int64, error)
}

var errDestroyed = errors.New("cgroups: the group is destroyed")

// MemoryCurrent reads memory.current. Not safe to call while Destroy runs.
func (g *group2) MemoryCurrent() (int64, error) {
	if g.dir == "" {
		return 0, errDestroyed
	}
	return readInt(g.dir, "memory.current")
}

// MemoryCurrent reads memory.usage_in_bytes. Not safe to call while
// Destroy runs.
func (g *group1) MemoryCurrent() (int64, error) {
	if g.dirs == nil {
		return 0, errDestroyed
	}
	return readInt(g.dir(g.m.memory), "memory.usage_in_bytes")
}

// KernelMemory is what a group is charged beyond its processes' pages
// (anonymous, page cache): kernel buffers such as sockets' queues.
type KernelMemory interface {
	MemoryKernel() (int64, error)
}

// MemoryKernel implements KernelMemory: memory.stat's sock, the sockets'
// buffers.
func (g *group2) MemoryKernel() (int64, error) {
	if g.dir == "" {
		return 0, errDestroyed
	}
	st, err := readStat(g.dir, "memory.stat")
	if err != nil {
		return 0, err
	}
	return st["sock"], nil
}

// MemoryKernel implements KernelMemory: what memory.usage_in_bytes
// charges beyond memory.stat's rss and cache.
func (g *group1) MemoryKernel() (int64, error) {
	if g.dirs == nil {
		return 0, errDestroyed
	}
	d := g.dir(g.m.memory)
	usage, err := readInt(d, "memory.usage_in_bytes")
	if err != nil {
		return 0, err
	}
	st, err := readStat(d, "memory.stat")
	if err != nil {
		return 0, err
	}
	return max(0, usage-st["rss"]-st["cache"]), nil
}

// readStat reads a "key value" per line file.
func readStat(dir, name string) (map[string]int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			out[k] = n
		}
	}
	return out, nil
}

// PidsSetter is a Group whose pids limit can be changed: a restore
// (checkpoint and restore) needs more tasks than the tree it restores for
// a while.
type PidsSetter interface {
	SetPidsMax(n int) error
}

// SetPidsMax implements PidsSetter.
func (g *group1) SetPidsMax(n int) error {
	if g.dirs == nil {
		return errDestroyed
	}
	return writeFile(g.dir(g.m.pids), "pids.max", strconv.Itoa(n))
}

// SetPidsMax implements PidsSetter.
func (g *group2) SetPidsMax(n int) error {
	if g.dir == "" {
		return errDestroyed
	}
	return writeFile(g.dir, "pids.max", strconv.Itoa(n))
}

// MemorySetter is a Group whose memory limit can be changed, and whose
// memory controller's directory is known (/proc/kpagecgroup names the
// group a page is charged to by that directory's inode): a restored
// sandbox forked from a zygote is charged for the zygote's pages it
// shared, and its limit is raised by them.
type MemorySetter interface {
	SetMemoryMax(bytes int64) error
	MemoryDir() string
}

// SetMemoryMax implements MemorySetter.
func (g *group1) SetMemoryMax(bytes int64) error {
	if g.dirs == nil {
		return errDestroyed
	}
	return limitMemoryV1(g.dir(g.m.memory), bytes)
}

// MemoryDir implements MemorySetter.
func (g *group1) MemoryDir() string { return g.dir(g.m.memory) }

// SetMemoryMax implements MemorySetter.
func (g *group2) SetMemoryMax(bytes int64) error {
	if g.dir == "" {
		return errDestroyed
	}
	return writeFile(g.dir, "memory.max", strconv.FormatInt(bytes, 10))
}

// MemoryDir implements MemorySetter.
func (g *group2) MemoryDir() string { return g.dir }

var (
	_ MemorySetter = (*group1)(nil)
	_ MemorySetter = (*group2)(nil)
	_ PidsSetter   = (*group1)(nil)
	_ PidsSetter   = (*group2)(nil)
	_ MemoryReader = (*group1)(nil)
	_ MemoryReader = (*group2)(nil)
	_ KernelMemory = (*group1)(nil)
	_ KernelMemory = (*group2)(nil)
)

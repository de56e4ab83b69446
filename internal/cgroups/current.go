package cgroups

import "errors"

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

var (
	_ MemoryReader = (*group1)(nil)
	_ MemoryReader = (*group2)(nil)
)

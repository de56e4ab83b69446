package sandbox

import "time"

// Usage is what a sandbox uses now.
type Usage struct {
	CPU    time.Duration // CPU time of all its processes so far, living and dead
	Memory int64         // bytes charged to it now
}

// UsageReporter is a Sandbox that tells what it uses now, cheaply (a few
// file reads): the service samples it for a sandbox's metrics over time.
// Usage is not called while Close runs.
type UsageReporter interface {
	Usage() (Usage, error)
}

// DiskUser is a Workspace on a file system of the sandbox's own, which
// tells how much of it is used (the workspace and the sandbox's other
// writable files, such as /tmp).
type DiskUser interface {
	DiskUsed() (int64, error)
}

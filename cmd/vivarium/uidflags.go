package main

import (
	"flag"
	"strconv"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
)

// addUIDFlags adds the native backend's pool of host users and its kernel
// limits to a command's flags.
func addUIDFlags(fs *flag.FlagSet, base *uint, ranges *int, limits *native.KernelLimits) {
	fs.UintVar(base, "uid-base", native.DefaultUIDBase,
		"first host `UID` of the pool of host users sandboxes are made of (every sandbox is one: 65536 ids)")
	fs.IntVar(ranges, "uid-ranges", native.DefaultUIDRanges,
		"size of that pool: sandboxes (and zygotes) that can exist at once; its ids must belong to nobody")
	fs.Var(kernelLimitFlag{limits}, "kernel-limit", kernelLimitUsage)
}

const kernelLimitUsage = "per-sandbox kernel budget, `NAME=N` (repeatable): inotify-instances, inotify-watches, " +
	"pending-signals, msgqueue-bytes, locked-memory, shm-segments, msg-queues, sem-arrays, mqueues"

// kernelLimitFlag sets one native.KernelLimits field per use.
type kernelLimitFlag struct{ l *native.KernelLimits }

func (f kernelLimitFlag) String() string {
	if f.l == nil {
		return ""
	}
	var set []string
	for _, name := range native.KernelLimitNames() {
		if v := f.l.Get(name); v != 0 {
			set = append(set, name+"="+strconv.FormatInt(v, 10))
		}
	}
	return strings.Join(set, ",")
}

func (f kernelLimitFlag) Set(v string) error { return f.l.Set(v) }

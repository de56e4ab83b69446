package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// sizeFlag parses byte sizes: 1048576, 512KiB, 512MiB, 1GiB, and the
// decimal-looking 512K, 512M, 1G, 512MB (all read as powers of 1024, which
// is what people mean by them for memory).
type sizeFlag int64

func (s *sizeFlag) String() string { return formatSize(int64(*s)) }

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

func parseSize(v string) (int64, error) {
	t := strings.TrimSpace(strings.ToLower(v))
	units := []struct {
		suffix string
		mult   int64
	}{
		{"tib", 1 << 40}, {"gib", 1 << 30}, {"mib", 1 << 20}, {"kib", 1 << 10},
		{"tb", 1 << 40}, {"gb", 1 << 30}, {"mb", 1 << 20}, {"kb", 1 << 10},
		{"t", 1 << 40}, {"g", 1 << 30}, {"m", 1 << 20}, {"k", 1 << 10}, {"b", 1},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("invalid size %q (examples: 512MiB, 1GiB, 1048576)", v)
	}
	return int64(f * float64(mult)), nil
}

func formatSize(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return fmt.Sprintf("%d%s", n/u.mult, u.name)
		}
	}
	return strconv.FormatInt(n, 10)
}

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// ioFlags are the disk I/O limits of run, serve and mcp: each sandbox's
// rates on the disks behind the host's / and /usr, and the explicit
// option that accepts none (a host without the blkio/io controller).
type ioFlags struct {
	readBPS, writeBPS   sizeFlag
	readIOPS, writeIOPS int64
	none                bool
	diskOf              listFlag
	added               bool // diskOf given to cgroups
}

func (f *ioFlags) register(fs *flag.FlagSet, what string) {
	f.readBPS, f.writeBPS = sandbox.DefaultIOReadBPS, sandbox.DefaultIOWriteBPS
	fs.Var(&f.readBPS, "io-read", "disk reads of "+what+", bytes a `RATE` per second (cgroup blkio/io.max)")
	fs.Int64Var(&f.readIOPS, "io-read-iops", sandbox.DefaultIOReadIOPS, "disk reads of "+what+", operations a second")
	fs.Var(&f.writeBPS, "io-write", "disk writes of "+what+", bytes a `RATE` per second")
	fs.Int64Var(&f.writeIOPS, "io-write-iops", sandbox.DefaultIOWriteIOPS, "disk writes of "+what+", operations a second")
	fs.Var(&f.diskOf, "io-disk-of", "limit disk I/O on the disk that holds `DIR` too (repeatable): for a container, "+
		"whose / is an overlay of host paths it cannot see, a directory the host gives it on the node's disk (the chart: the data directory)")
	fs.BoolVar(&f.none, "insecure-no-io-limit", false,
		"run sandboxes without a disk I/O limit, on a host without the cgroup blkio (v1) or io (v2) controller: one sandbox can then take the whole disk")
}

// apply sets l's I/O rates from the flags, or none with
// --insecure-no-io-limit.
func (f *ioFlags) apply(l sandbox.Limits) (sandbox.Limits, error) {
	if f.none {
		return l.WithoutIOLimit(), nil
	}
	if len(f.diskOf) > 0 && !f.added {
		if err := cgroups.AddIODisksOf(f.diskOf...); err != nil {
			return l, fmt.Errorf("--io-disk-of: %w", err)
		}
		f.added = true
	}
	if f.readBPS <= 0 || f.writeBPS <= 0 || f.readIOPS <= 0 || f.writeIOPS <= 0 {
		return l, errors.New("--io-read, --io-write, --io-read-iops and --io-write-iops must be positive " +
			"(--insecure-no-io-limit runs without a disk I/O limit)")
	}
	l.IOReadBPS, l.IOWriteBPS = int64(f.readBPS), int64(f.writeBPS)
	l.IOReadIOPS, l.IOWriteIOPS = f.readIOPS, f.writeIOPS
	return l, nil
}

// String describes the limit for logs.
func (f *ioFlags) String() string {
	if f.none {
		return "none (--insecure-no-io-limit)"
	}
	return fmt.Sprintf("read %s/s %d/s, write %s/s %d/s", formatSize(int64(f.readBPS)), f.readIOPS,
		formatSize(int64(f.writeBPS)), f.writeIOPS)
}

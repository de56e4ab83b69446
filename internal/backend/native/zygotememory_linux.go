package native

// A sandbox forked from a zygote shares the zygote's memory copy-on-write:
// what the zygote's Python wrote before the fork (the interpreter's heap,
// the preloaded modules: some 55 MiB with pandas) its processes map and
// have not written, charged to the zygote's cgroup, not the sandbox's.
// A checkpoint saves those pages with the sandbox's own, and a restore
// writes them back as the sandbox's: from then on its cgroup is charged
// for them. Under its limit alone, a restored sandbox would have that much
// less room than its code had (a sandbox near its limit could pause but
// never resume: the restore was killed by the limit; a fork's copies ran
// out of memory where their source did not).
//
// So the pages are counted at the dump, under its locks (no execution
// runs, no command starts), before CRIU freezes the tree (sharedMemory:
// the pages of the tree's processes charged to another group, as
// /proc/kpagecgroup says; a fork's check of the host's memory is given
// the same count), kept with the checkpoint (tookOver,
// in a snapshot's manifest too), and the restored sandbox's memory limit
// is its spec's plus them, for as long as it lives. Its own memory stays
// within its limit; what the limit grows by is memory the sandbox already
// used, the zygote's copy of it, never more than the zygote's own; a
// fork's check of the host's memory counts it for every copy, and the
// tenants' ceilings bound it as any charge (docs/security.md).

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/cgroups"
)

// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pagePresent    = 1 << 63
	pageFileShared = 1 << 61 // a file page, or shared anonymous memory
	pageFrameMask  = 1<<55 - 1
)

// zygoteShare is what a restore of s's tree would be charged beyond its
// cgroup's usage now: the zygote's pages its processes share, for a
// sandbox forked from a zygote whose tree was never restored (0 for any
// other).
//
// A restored tree shares none: CRIU moves each restored process into the
// sandbox's cgroup before it writes the process's memory back, so every
// page of the tree was allocated there, and what its processes fork
// later shares only their pages (measured: 0 bytes, where the tree
// before its first pause shared 56 MiB with pandas). Its pages are not
// walked again (some 20 ms at every later pause, and at every fork of a
// fork's copy); what it took over at its restore stays in tookOver.
func (s *Sandbox) zygoteShare() (int64, error) {
	if s.cfg == nil || s.cfg.Role != roleForked || s.ownRunners.Load() {
		// ownRunners: a restored tree (adopt).
		return 0, nil
	}
	ms, ok := s.cg.(cgroups.MemorySetter)
	if s.cg == nil || !ok {
		return 0, nil
	}
	pids, err := s.cg.Procs()
	if err != nil {
		return 0, err
	}
	n, err := sharedMemory(pids, ms.MemoryDir())
	if err != nil {
		return 0, fmt.Errorf("the zygote's memory the sandbox shares: %w", err)
	}
	return n, nil
}

// memoryTookOver sets the memory limit of the sandbox's cgroup to its
// spec's plus tookOver (a checkpoint's), where it has one.
func (s *Sandbox) memoryTookOver(tookOver int64) error {
	ms, ok := s.cg.(cgroups.MemorySetter)
	if s.cg == nil || !ok || s.spec.Limits.Memory <= 0 {
		return nil
	}
	return ms.SetMemoryMax(s.spec.Limits.Memory + tookOver)
}

// sharedMemory returns the bytes of the private anonymous pages that the
// processes pids map, each page once, and that are charged to a memory
// cgroup other than the one whose directory is memcg (not to none).
func sharedMemory(pids []int, memcg string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(memcg, &st); err != nil {
		return 0, err
	}
	seen := map[uint64]bool{}
	var frames []uint64
	for _, pid := range pids {
		err := anonFrames(pid, func(pfn uint64) {
			if !seen[pfn] {
				seen[pfn] = true
				frames = append(frames, pfn)
			}
		})
		if err != nil && !gone(err) {
			return 0, err
		}
	}
	kpc, err := os.Open("/proc/kpagecgroup")
	if err != nil {
		return 0, err
	}
	defer kpc.Close()
	// One inode (8 bytes) per page frame, which the kernel looks up for
	// every frame read: runs of nearby frames are read at once, others
	// alone.
	slices.Sort(frames)
	buf := make([]byte, 4096)
	var n int64
	for i := 0; i < len(frames); {
		j := i
		for j+1 < len(frames) && frames[j+1]-frames[j] <= 4 && frames[j+1]-frames[i] < uint64(len(buf)/8) {
			j++
		}
		first := frames[i]
		want := (frames[j] - first + 1) * 8
		if got, err := kpc.ReadAt(buf[:want], int64(first*8)); uint64(got) < want {
			return 0, fmt.Errorf("/proc/kpagecgroup: %w", err)
		}
		for _, pfn := range frames[i : j+1] {
			// 0: charged to no group, as the shared zero page that a
			// read of untouched memory maps is.
			if ino := binary.NativeEndian.Uint64(buf[(pfn-first)*8:]); ino != st.Ino && ino != 0 {
				n++
			}
		}
		i = j + 1
	}
	return n * int64(os.Getpagesize()), nil
}

// anonFrames calls f with the page frame of every private anonymous page
// process pid has in memory (/proc/PID/pagemap: root sees the frames).
func anonFrames(pid int, f func(pfn uint64)) error {
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	defer maps.Close()
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return err
	}
	defer pm.Close()
	page := uint64(os.Getpagesize())
	buf := make([]byte, 64<<10)
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		// start-end perms offset dev inode [path]
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || len(fields[1]) < 4 || fields[1][3] != 'p' {
			continue // shared mappings are files', or the sandbox's own shmem
		}
		if len(fields) > 5 && fields[5] == "[vsyscall]" {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("/proc/%d/maps: %q", pid, sc.Text())
		}
		for off := start / page * 8; off < end/page*8; {
			want := min(uint64(len(buf)), end/page*8-off)
			got, err := pm.ReadAt(buf[:want], int64(off))
			if got == 0 {
				if err == nil || errors.Is(err, io.EOF) {
					break
				}
				return err
			}
			for i := 0; i+8 <= got; i += 8 {
				e := binary.NativeEndian.Uint64(buf[i:])
				if e&pagePresent == 0 || e&pageFileShared != 0 {
					continue
				}
				pfn := e & pageFrameMask
				if pfn == 0 {
					return errors.New("/proc/PID/pagemap shows no page frames (CAP_SYS_ADMIN is needed)")
				}
				f(pfn)
			}
			off += uint64(got)
		}
	}
	return sc.Err()
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/hostdisk"
	"github.com/vivarium-sandbox/vivarium/internal/hostmem"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// W5's rows: what an idle stateful sandbox that imported pandas costs,
// and how many of them this host holds, live and paused. Every live
// figure comes from one census of the server's sandboxes while N of them
// (--idle) are alive at once, taken by the reference row's iteration; the
// projection row of the same round reads it, so that N sandboxes are made
// once a round, not once a row.

// idleCode is what each idle sandbox ran: pandas imported, a DataFrame
// made.
const idleCode = "import pandas as pd\ndf = pd.DataFrame({'a': range(100)})"

// idleSandboxBudget bounds the sandboxes a W5 row makes over a run: with
// --idle N, the rows that make N sandboxes an iteration run at most
// idleSandboxBudget/N iterations (and no warm-up), at least one.
const idleSandboxBudget = 1000

// idleIterations is how many iterations a W5 row that makes n sandboxes
// an iteration runs at most.
func idleIterations(n int) int { return max(1, idleSandboxBudget/max(n, 1)) }

// census is what N idle sandboxes of a bench server take, read while they
// are alive.
type census struct {
	live   int   // sandboxes the iteration made
	groups int   // sandbox cgroups under the server's parent: live and the pool's
	pss    int64 // the PSS of the sandboxes' processes
	// zygotes is how many zygotes there were before the sandboxes were
	// made, zygoteCharge the memory charged to their cgroups then: their
	// own pages, which their sandboxes share. (What a sandbox's process
	// is charged before it moves to its own cgroup stays the zygote's
	// cgroup's: it is in charge, the parent's, and not counted twice.)
	zygotes      int
	zygoteCharge int64
	tasks        int // threads of the sandboxes' processes
	sandboxFiles int // open files of the sandboxes' processes
	// serverFiles is the server's open files, before the sandboxes were
	// made and while they live; serverMaxFiles its limit.
	serverFilesBefore, serverFiles int
	serverMaxFiles                 int64
	// charge is the memory charged to the server's cgroup parent
	// (sandboxes, zygotes, the kernel's memory for them), before and now;
	// ceiling is its limit (0: none).
	chargeBefore, charge, ceiling int64
	memAvailable, memTotal        int64
	hostTasks                     int // every task on the host now
	// namespaces are the distinct namespaces of the sandboxes' processes,
	// by kind ("user", "mnt", ...).
	namespaces map[string]int
}

// perSandboxMemory is the memory one more idle sandbox takes, and how it
// was reckoned: its own, the PSS of its processes or the memory charged
// to the server's cgroup parent per sandbox (its kernel memory, page
// tables and files in tmpfs included), whichever is more; and its share
// of its zygote's pages, which a zygote shares with the
// DefaultZygoteMaxSandboxes sandboxes it makes before it is replaced.
func (c *census) perSandboxMemory() (int64, string) {
	pss := c.pss / int64(c.groups)
	charge := (c.charge - c.chargeBefore) / int64(c.live)
	own, how := pss, "its PSS"
	if charge > pss {
		own, how = charge, fmt.Sprintf("charged to the server's cgroup (PSS %.1f MiB)", mib(pss))
	}
	if c.zygotes == 0 {
		return own, fmt.Sprintf("%.1f MiB a sandbox: %s", mib(own), how)
	}
	share := c.zygoteCharge / int64(c.zygotes*native.DefaultZygoteMaxSandboxes)
	return own + share, fmt.Sprintf("%.1f MiB a sandbox: %.1f MiB %s, and %.2f MiB of its zygote's %.0f MiB",
		mib(own+share), mib(own), how, mib(share), mib(c.zygoteCharge/int64(c.zygotes)))
}

// ceilDiv is what each of n sandboxes takes of a total, rounded up: a
// projection errs on the side of fewer.
func ceilDiv(total, n int) int64 { return int64((total + n - 1) / n) }

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// bound is one limit on how many idle sandboxes the host holds.
type bound struct {
	n    int
	what string
}

// bounds lists every limit on the number of idle sandboxes, projected
// from the census: N live plus what is left of each resource over what a
// sandbox takes of it. A limit that cannot be read is left out.
func (c *census) bounds() []bound {
	var out []bound
	more := func(left, each int64, what string) {
		if each > 0 {
			out = append(out, bound{c.live + int(max(left, 0)/each), what})
		}
	}
	per, how := c.perSandboxMemory()
	reserve := hostmem.Reserve(c.memTotal)
	more(c.memAvailable-reserve, per, fmt.Sprintf("host memory (MemAvailable %.1f GiB less the %.1f GiB a server keeps free, at %s)",
		float64(c.memAvailable)/(1<<30), float64(reserve)/(1<<30), how))
	if c.ceiling > 0 {
		more(c.ceiling-c.charge, per, fmt.Sprintf("the server's memory ceiling (--max-memory-total %.1f GiB)", float64(c.ceiling)/(1<<30)))
	}
	pidMax := min(readProcInt("/proc/sys/kernel/pid_max"), readProcInt("/proc/sys/kernel/threads-max"))
	if c.tasks > 0 && pidMax > 0 {
		each := ceilDiv(c.tasks, c.groups)
		more(pidMax-int64(c.hostTasks), each, fmt.Sprintf("tasks (kernel.pid_max %d, %d on the host now, %d a sandbox)", pidMax, c.hostTasks, each))
	}
	if files := c.serverFiles - c.serverFilesBefore; files > 0 && c.serverMaxFiles > 0 {
		each := ceilDiv(files, c.live)
		more(c.serverMaxFiles-int64(c.serverFiles), each, fmt.Sprintf("the server's open files (limit %d, %d a sandbox)", c.serverMaxFiles, each))
	}
	if nr := strings.Fields(readProc("/proc/sys/fs/file-nr")); len(nr) == 3 {
		used, _ := strconv.ParseInt(nr[0], 10, 64)
		limit, _ := strconv.ParseInt(nr[2], 10, 64)
		each := ceilDiv(c.sandboxFiles, c.groups) + ceilDiv(max(c.serverFiles-c.serverFilesBefore, 0), c.live)
		more(limit-used, each, fmt.Sprintf("the host's open files (fs.file-max %d, %d a sandbox)", limit, each))
	}
	// Of the namespaces, the kind that runs out first.
	var ns bound
	for kind, n := range c.namespaces {
		limit := readProcInt("/proc/sys/user/max_" + kind + "_namespaces")
		if each := ceilDiv(n, c.groups); limit > 0 && each > 0 && (ns.what == "" || int(limit/each) < ns.n) {
			ns = bound{int(limit / each), fmt.Sprintf("%s namespaces (user.max_%s_namespaces %d, %d a sandbox)", kind, kind, limit, each)}
		}
	}
	if ns.what != "" {
		out = append(out, ns)
	}
	// A server's own bounds, at its defaults: every sandbox and zygote is
	// a host user of the pool, and a zygote serves DefaultZygoteMaxSandboxes.
	z := native.DefaultZygoteMaxSandboxes
	out = append(out,
		bound{native.DefaultUIDRanges * z / (z + 1), fmt.Sprintf("host-user ranges (--uid-ranges %d by default, a zygote for each %d sandboxes)", native.DefaultUIDRanges, z)},
		maxSandboxesBound)
	slices.SortStableFunc(out, func(a, b bound) int { return a.n - b.n })
	return out
}

// defaultMaxSandboxes is `vivarium serve --max-sandboxes`'s default.
const defaultMaxSandboxes = 1000

// idleFleet makes a bench server's idle sandboxes and counts what they
// take: W5's rows.
type idleFleet struct {
	srv *server
	n   int

	mu   sync.Mutex
	last *census // the reference row's, until a projection reads it
	// What the last projection and the last fill said.
	projected, filled note
}

// note is what a row's last iteration said (Subject.Note).
type note struct {
	mu sync.Mutex
	s  string
}

func (n *note) set(s string) {
	n.mu.Lock()
	n.s = s
	n.mu.Unlock()
}

func (n *note) get() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.s
}

// hold makes n idle sandboxes on the server (4 at a time), calls look
// while they are all alive, and deletes them. The first refusal stops
// the making and is returned with how many were made before it.
func (f *idleFleet) hold(ctx context.Context, n int, look func(made int) error) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ids := make([]string, n)
	defer func() {
		// Deleted whatever the context: the bench's own, bounded.
		dctx, dcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer dcancel()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 16)
		for _, id := range ids {
			if id != "" {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					f.srv.post(dctx, "DELETE", "/v1/sandboxes/"+id, nil, nil)
				})
			}
		}
		wg.Wait()
	}()
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
		made     int
	)
	sem := make(chan struct{}, 4)
	for i := range ids {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			err := f.srv.makeIdle(ctx, &ids[i])
			errMu.Lock()
			defer errMu.Unlock()
			if err == nil {
				made++
			} else if firstErr == nil {
				firstErr = err
				cancel()
			}
		})
	}
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return made, fmt.Errorf("after %d idle sandboxes: %w%s", made, firstErr, f.nearBounds())
	}
	return made, look(made)
}

// nearBounds names the bounds that are nearly reached now, for an error
// that says why sandboxes stopped being made (a server at its memory
// ceiling stalls rather than refuses): "" when none is.
func (f *idleFleet) nearBounds() string {
	var near []string
	if charge, ceiling := parentMemory(f.srv.parent); ceiling > 0 && charge > ceiling/10*9 {
		near = append(near, fmt.Sprintf("the server's sandboxes hold %d MiB of its --max-memory-total %d MiB", charge>>20, ceiling>>20))
	}
	if available, total, err := hostmem.Read(); err == nil && available < 2*hostmem.Reserve(total) {
		near = append(near, fmt.Sprintf("the host has %d MiB of memory available", available>>20))
	}
	if tasks, limit := hostTasks(), readProcInt("/proc/sys/kernel/pid_max"); limit > 0 && tasks > limit/10*9 {
		near = append(near, fmt.Sprintf("the host runs %d tasks of kernel.pid_max %d", tasks, limit))
	}
	if open, limit := f.srv.openFiles(); limit > 0 && int64(open) > limit/10*9 {
		near = append(near, fmt.Sprintf("the server has %d files open of its limit %d", open, limit))
	}
	if len(near) == 0 {
		return ""
	}
	return " (" + strings.Join(near, "; ") + ")"
}

// hostTasks is the number of tasks (threads) on the host now, from
// /proc/loadavg; 0 when it cannot be read.
func hostTasks() int64 {
	if f := strings.Fields(readProc("/proc/loadavg")); len(f) >= 4 {
		_, total, _ := strings.Cut(f[3], "/")
		n, _ := strconv.ParseInt(total, 10, 64)
		return n
	}
	return 0
}

// makeIdle makes one idle sandbox that imported pandas; its id is set as
// soon as it exists, so that it is deleted whatever happens next.
func (s *server) makeIdle(ctx context.Context, id *string) error {
	var info struct{ ID string }
	if err := s.post(ctx, "POST", "/v1/sandboxes", map[string]any{"timeout_s": 3600}, &info); err != nil {
		return err
	}
	*id = info.ID
	var res sandbox.Result
	if err := s.post(ctx, "POST", "/v1/sandboxes/"+info.ID+"/execute", map[string]any{"code": idleCode}, &res); err != nil {
		return err
	}
	return checkResult(&res, "")
}

// memory is W5's reference row: the PSS per sandbox of f.n idle
// sandboxes alive at once (the pool's ready sandboxes, under the same
// parent, counted as what they are, sandboxes at rest). Its census is
// kept for the projection row of the same round.
func (f *idleFleet) memory(ctx context.Context) (float64, error) {
	before, maxFiles := f.srv.openFiles()
	chargeBefore, _ := parentMemory(f.srv.parent)
	zygotes := zygoteGroups(f.srv.parent)
	var zygoteCharge int64
	for _, z := range zygotes {
		zygoteCharge += groupMemory(z)
	}
	var c *census
	_, err := f.hold(ctx, f.n, func(made int) error {
		var err error
		c, err = f.count(made)
		return err
	})
	if err != nil {
		return 0, err
	}
	c.serverFilesBefore, c.serverMaxFiles, c.chargeBefore = before, maxFiles, chargeBefore
	c.zygotes, c.zygoteCharge = len(zygotes), zygoteCharge
	f.mu.Lock()
	f.last = c
	f.mu.Unlock()
	return mib(c.pss / int64(c.groups)), nil
}

// count takes the census of the server's sandboxes, made of them alive.
func (f *idleFleet) count(made int) (*census, error) {
	groups := sandboxGroups(f.srv.parent)
	if len(groups) == 0 {
		return nil, errors.New("no sandbox cgroup found")
	}
	c := &census{live: made, groups: len(groups), namespaces: map[string]int{}}
	seen := map[string]bool{}
	for _, pid := range groupProcesses(groups) {
		c.pss += sandbox.ProcessPSS(pid)
		c.tasks += countDir(fmt.Sprintf("/proc/%d/task", pid))
		c.sandboxFiles += countDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, kind := range []string{"user", "mnt", "pid", "net", "ipc", "uts", "cgroup"} {
			if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, kind)); err == nil && !seen[ns] {
				seen[ns] = true
				c.namespaces[kind]++
			}
		}
	}
	c.serverFiles, _ = f.srv.openFiles()
	c.charge, c.ceiling = parentMemory(f.srv.parent)
	c.memAvailable, c.memTotal, _ = hostmem.Read()
	c.hostTasks = int(hostTasks())
	return c, nil
}

// project is the projection row: how many idle sandboxes the host holds,
// from the census the reference row took in this round. The lowest bound
// wins; the note names it and the next.
func (f *idleFleet) project(context.Context) (float64, error) {
	f.mu.Lock()
	c := f.last
	f.last = nil
	f.mu.Unlock()
	if c == nil {
		return 0, errors.New("no census: the memory row's iteration of this round failed")
	}
	bs := c.bounds()
	f.projected.set(fmt.Sprintf("projected from %d live: %s", c.live, describe(bs)))
	return float64(bs[0].n), nil
}

// describe says which of bounds (sorted, the lowest first) binds, and
// the others.
func describe(bounds []bound) string {
	s := "bound by " + bounds[0].what
	for i, b := range bounds[1:] {
		s += map[bool]string{true: "; then ", false: ", "}[i == 0] + fmt.Sprintf("%d by %s", b.n, b.what)
	}
	return s
}

// maxSandboxesBound is --max-sandboxes at its default, which counts paused
// sandboxes as well as running ones.
var maxSandboxesBound = bound{defaultMaxSandboxes, fmt.Sprintf("--max-sandboxes (%d by default)", defaultMaxSandboxes)}

// fill is --fill's row: it makes n idle sandboxes at once for real, and
// is how many were alive at once (n, or how many were made before the
// first refusal, which the note then gives).
func (f *idleFleet) fill(n int) func(context.Context) (float64, error) {
	return func(ctx context.Context) (float64, error) {
		made, err := f.hold(ctx, n, func(int) error { return nil })
		if err != nil && made == 0 {
			return 0, err
		}
		said := fmt.Sprintf("all %d made, alive at once", n)
		if err != nil {
			said = oneLine(err.Error())
		}
		f.filled.set(said)
		return float64(made), nil
	}
}

// pausedDisk is the row of paused sandboxes: an idle sandbox that
// imported pandas is paused through the server, which keeps it on disk
// (under its data directory) once it has stayed paused 5 s and then
// releases it; the row is how many such copies the free space of that
// file system holds, less the reserve the server keeps free there, or
// fewer where a server at its defaults keeps fewer sandboxes.
type pausedDisk struct {
	srv  *server
	said note
}

func (p *pausedDisk) measure(ctx context.Context) (float64, error) {
	var id string
	defer func() {
		if id != "" {
			p.srv.post(context.Background(), "DELETE", "/v1/sandboxes/"+id, nil, nil)
		}
	}()
	if err := p.srv.makeIdle(ctx, &id); err != nil {
		return 0, err
	}
	if err := p.srv.post(ctx, "POST", "/v1/sandboxes/"+id+"/pause", nil, nil); err != nil {
		return 0, err
	}
	dir := filepath.Join(p.srv.data, "paused", id)
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("the paused sandbox was not kept on disk: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	size, err := diskUsage(dir)
	if err != nil {
		return 0, err
	}
	free, reserve, err := hostdisk.Free(dir)
	if err != nil {
		return 0, err
	}
	// A paused sandbox kept on disk and released holds no memory, host
	// user or cgroup; it is still one of the server's sandboxes.
	bs := []bound{maxSandboxesBound, {int(max(free-reserve, 0) / size), fmt.Sprintf("the disk of the data directory "+
		"(%.1f GiB free less %.1f GiB kept free, %.1f MiB a paused sandbox: its kept copy's images, files and record)",
		float64(free)/(1<<30), float64(reserve)/(1<<30), mib(size))}}
	slices.SortStableFunc(bs, func(a, b bound) int { return a.n - b.n })
	p.said.set(describe(bs))
	return float64(bs[0].n), nil
}

// diskUsage is the disk the files under dir take (their allocated
// blocks), as du counts it: what the file system loses, where
// fileutil.DirSize adds apparent sizes.
func diskUsage(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	return total, err
}

// idleSubjects are W5's rows, on srv.
func idleSubjects(srv *server, n, fill int, skip, pandasSkip, pauseSkip, python string) []Subject {
	w := W5.Label()
	f := &idleFleet{srv: srv, n: n}
	iters := idleIterations(n)
	out := []Subject{
		{Workload: w, Name: fmt.Sprintf("vivarium serve, %d idle sandboxes at once", n),
			Reference: true, Unit: "MiB", Skip: skip, Setup: srv.acquire, Measure: f.memory, Iterations: iters},
		{Workload: w, Name: fmt.Sprintf("idle sandboxes this host holds: a projection from the %d live", n),
			Unit: "sandboxes", Skip: skip, Setup: srv.acquire, Measure: f.project, Iterations: iters, Note: f.projected.get},
	}
	if fill > 0 {
		out = append(out, Subject{Workload: w, Name: fmt.Sprintf("idle sandboxes made and alive at once (--fill %d)", fill),
			Unit: "sandboxes", Skip: skip, Setup: srv.acquire, Measure: f.fill(fill), Iterations: 1, Note: f.filled.get})
	}
	p := &pausedDisk{srv: srv}
	return append(out,
		Subject{Workload: w, Name: "paused idle sandboxes this host keeps (each kept on disk, released)",
			Unit: "sandboxes", Skip: firstOf(skip, pauseSkip), Setup: srv.acquire, Measure: p.measure, Iterations: 3, Note: p.said.get},
		Subject{Workload: w, Name: "python3 with pandas imported (nothing shared)", Peer: true,
			Unit: "MiB", Skip: pandasSkip, Measure: pythonPandasPSS(python)},
	)
}

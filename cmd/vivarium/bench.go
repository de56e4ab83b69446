package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/bench"
	"github.com/vivarium-sandbox/vivarium/internal/criu"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

func cmdBench(args []string) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: vivarium bench [flags]

Times Vivarium against its peers in one run, on this machine: the same
Python run by vivarium, by python3 alone, in bubblewrap, in gVisor (runsc
do), in Docker and in Jupyter kernels, each peer only when this host has
it. Prints a table per workload with each row's median as a ratio to
Vivarium's. Progress goes to stderr. Needs root, as vivarium run does.

Flags:
`)
		fs.PrintDefaults()
	}
	short := fs.Bool("short", false, "a quick run (2 iterations, no warm-up, 2s throughput): checks that every row works, as CI does")
	n := fs.Int("n", 20, "measured iterations per row")
	warmUp := fs.Int("warmup", 2, "iterations per row before the measured ones, not counted")
	only := fs.String("only", "", "measure only rows whose \"WORKLOAD / SUBJECT\" matches `REGEX` (and each workload's Vivarium row)")
	asJSON := fs.Bool("json", false, "print the report as JSON instead of a table")
	concurrency := fs.Int("concurrency", 0, "also measure throughput with `K` concurrent clients per row (0: latency only)")
	duration := fs.Duration("duration", 10*time.Second, "how long each throughput row runs")
	timeout := fs.Duration("timeout", 2*time.Minute, "limit on one iteration")
	python := fs.String("python", sandbox.DefaultPython, "interpreter every subject runs")
	dockerImage := fs.String("docker-image", bench.DefaultDockerImage, "image for the docker row; built from the host's Python when missing")
	idle := fs.Int("idle", 20, "live stateful sandboxes the memory row (W5) holds at once, and projects how many the host holds from; "+
		"W5's rows that make them run at most 1000/N iterations")
	fill := fs.Int("fill", 0, "add a W5 row that makes `N` idle sandboxes at once, to check the projection (0: none; "+
		"give --timeout the time it takes)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "vivarium bench: unexpected arguments: %v\n", fs.Args())
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *short {
		if !set["n"] {
			*n = 2
		}
		if !set["warmup"] {
			*warmUp = 0
		}
		if !set["duration"] {
			*duration = 2 * time.Second
		}
	}
	switch {
	case *n < 1:
		fmt.Fprintln(os.Stderr, "vivarium bench: -n must be at least 1")
		return 2
	case *warmUp < 0 || *concurrency < 0:
		fmt.Fprintln(os.Stderr, "vivarium bench: --warmup and --concurrency must not be negative")
		return 2
	case *concurrency > 0 && *duration <= 0:
		fmt.Fprintln(os.Stderr, "vivarium bench: --duration must be positive")
		return 2
	case *idle < 1 || *fill < 0:
		fmt.Fprintln(os.Stderr, "vivarium bench: --idle must be at least 1 and --fill not negative")
		return 2
	case *timeout <= 0:
		fmt.Fprintln(os.Stderr, "vivarium bench: --timeout must be positive")
		return 2
	}
	opts := bench.Options{
		Iterations: *n, WarmUp: *warmUp, Concurrency: *concurrency, Duration: *duration,
		Timeout: *timeout, Progress: os.Stderr,
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			fmt.Fprintf(os.Stderr, "vivarium bench: --only: %v\n", err)
			return 2
		}
		opts.Only = re
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg := bench.Config{Python: *python, DockerImage: *dockerImage, IdleSandboxes: *idle, Fill: *fill}
	if exe, err := os.Executable(); err == nil {
		cfg.Vivarium = exe
	}
	// In-process rows use what `vivarium serve` uses by default: sandboxes
	// forked from a zygote with the data-science stack preloaded.
	if b, err := native.New(native.Config{Zygote: true, Preload: []string{"numpy", "pandas", "matplotlib"},
		CgroupParent: "vivarium-bench", UIDBase: native.DefaultUIDBase + 13<<24, UIDRanges: 256}); err != nil {
		cfg.BackendErr = err
	} else if err := b.Warm(ctx); err != nil {
		cfg.BackendErr = err
	} else {
		cfg.Backend = b
		defer b.Close()
	}
	// W7 pauses the same backend's sandboxes, with CRIU.
	if _, err := criu.Usable(); err != nil {
		cfg.PausingErr = fmt.Errorf("pausing needs CRIU (make criu): %v", err)
	} else {
		cfg.Pausing, cfg.PausingErr = cfg.Backend, cfg.BackendErr
	}
	// Read before the bench loads the machine: the load average then is
	// other work, which the figures suffer from.
	host := bench.ReadHost()
	host.Vivarium = version
	subjects, closeShared := bench.Subjects(ctx, cfg)
	rep := bench.Run(ctx, subjects, opts)
	closeShared()
	rep.Host = host

	var err error
	if *asJSON {
		err = rep.WriteJSON(os.Stdout)
	} else {
		err = rep.WriteTable(os.Stdout)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vivarium bench: %v\n", err)
		return 1
	}
	if ctx.Err() != nil {
		return 130
	}
	if problems := rep.VivariumProblems(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "vivarium bench: %s\n", p)
		}
		return 1
	}
	return 0
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/httpapi"
	"github.com/vivarium-sandbox/vivarium/internal/mcp"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/snapshot"
)

// mcpOwner owns the sandboxes of `vivarium mcp`: one local agent, no keys.
const mcpOwner = "local"

type mcpConfig struct {
	cgroupParent            string
	uidBase                 uint
	uidRanges               int
	kernelLimits            native.KernelLimits
	noCgroups               bool
	logLevel                string
	idle, lifetime          time.Duration
	maxSandboxes            int
	timeout, execTimeout    time.Duration
	memory, disk, maxOutput sizeFlag
	pids                    int
	io                      ioFlags
}

func mcpFlags(c *mcpConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: vivarium mcp [flags]

Serves sandboxes to one AI agent over the Model Context Protocol on
standard input and output: the agent starts this command itself (see the
README or docs/mcp.md for a config snippet). Needs root, like "vivarium run". Logs go to
standard error. Every sandbox is closed when the agent disconnects.
"vivarium serve" serves the same tools over HTTP at /mcp, with API keys.

Flags:
`)
		fs.PrintDefaults()
	}
	c.memory, c.disk, c.maxOutput = sandbox.DefaultMemory, sandbox.DefaultDisk, sandbox.DefaultMaxOutput
	fs.StringVar(&c.cgroupParent, "cgroup-parent", "", "cgroup sandboxes are created under (default: the one \"vivarium run\" uses)")
	addUIDFlags(fs, &c.uidBase, &c.uidRanges, &c.kernelLimits)
	fs.BoolVar(&c.noCgroups, "insecure-no-cgroups", false,
		"run without cgroups when the host has none: memory and process limits per process (rlimits), not per sandbox")
	fs.StringVar(&c.logLevel, "log-level", "warn", "log level on standard error: debug, info, warn or error")
	fs.DurationVar(&c.idle, "idle-timeout", 10*time.Minute, "a sandbox unused for this long is closed")
	fs.DurationVar(&c.lifetime, "lifetime", 2*time.Hour, "maximum lifetime of a sandbox")
	fs.IntVar(&c.maxSandboxes, "max-sandboxes", 8, "live sandboxes at once")
	fs.DurationVar(&c.execTimeout, "exec-timeout", sandbox.DefaultTimeout, "wall-clock limit of an execution when the agent gives none")
	fs.DurationVar(&c.timeout, "max-exec-timeout", 5*time.Minute, "longest execution the agent may ask for")
	fs.Var(&c.memory, "memory", "memory limit of each sandbox, swap off")
	fs.Var(&c.disk, "disk", "size of each sandbox's /workspace, /tmp and /dev/shm together")
	fs.Var(&c.maxOutput, "max-output", "bytes of output kept per stream and execution")
	fs.IntVar(&c.pids, "pids", sandbox.DefaultPids, "processes and threads at once in each sandbox")
	c.io.register(fs, "each sandbox")
	return fs
}

func cmdMCP(args []string) int {
	var c mcpConfig
	fs := mcpFlags(&c)
	if err := envDefaults(fs); err != nil {
		fmt.Fprintf(os.Stderr, "vivarium mcp: %v\n", err)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "vivarium mcp: unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return 2
	}
	level, err := parseLevel(c.logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vivarium mcp: --log-level must be debug, info, warn or error")
		return 2
	}
	limits, err := c.io.apply(sandbox.Limits{Memory: int64(c.memory), Disk: int64(c.disk), MaxOutput: int64(c.maxOutput),
		Pids: c.pids, Timeout: c.timeout})
	if err != nil {
		fmt.Fprintf(os.Stderr, "vivarium mcp: %v\n", err)
		return 2
	}
	if err := limits.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "vivarium mcp: %v\n", err)
		return 2
	}
	if c.idle <= 0 || c.lifetime < c.idle || c.maxSandboxes < 1 || c.execTimeout <= 0 || c.execTimeout > c.timeout {
		fmt.Fprintln(os.Stderr, "vivarium mcp: --idle-timeout must be positive and at most --lifetime; --exec-timeout "+
			"positive and at most --max-exec-timeout; --max-sandboxes at least 1")
		return 2
	}
	// Standard output is the protocol's: logs go to standard error only.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	b, err := native.New(native.Config{CgroupParent: c.cgroupParent, UIDBase: uint32(c.uidBase), UIDRanges: c.uidRanges,
		KernelLimits: c.kernelLimits, InsecureNoCgroups: c.noCgroups, Logger: log})
	if err != nil {
		// The agent shows this to its user: say what to do.
		log.Error("vivarium mcp: cannot create sandboxes on this host", "err", err)
		return 1
	}
	// Every sandbox gets the flags' limits; only the timeout of an
	// execution may be asked for, up to --max-exec-timeout.
	each := limits
	each.Timeout = c.execTimeout
	svcCfg := service.Config{
		Backend: b, MaxLimits: limits, DefaultIdle: c.idle, MaxIdle: c.lifetime, DefaultLifetime: c.lifetime,
		MaxLifetime: c.lifetime, MaxPerOwner: c.maxSandboxes, MaxTotal: c.maxSandboxes, Logger: log,
	}
	// create_sandbox's templates are those of vivarium serve's store.
	if images, err := openImages(defaultDataDir()); err == nil {
		svcCfg.Images = images
	} else {
		log.Warn("templates cannot be used: create_sandbox will say so", "err", err)
	}
	// snapshot_sandbox keeps its snapshots where vivarium serve keeps
	// its own (another owner's: neither sees the other's).
	if key, err := snapshot.LoadKey(filepath.Join(defaultDataDir(), "snapshot.key")); err == nil {
		svcCfg.SnapshotDir, svcCfg.SnapshotKey = filepath.Join(defaultDataDir(), "snapshots"), key
	} else {
		log.Warn("snapshots cannot be kept: snapshot_sandbox will say so", "err", err)
	}
	svc := service.New(svcCfg)
	defer svc.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("vivarium mcp serving on stdio", "cgroup_version", b.CgroupVersion())
	if err := mcp.ServeStdio(ctx, mcp.Config{Service: svc, Logger: log, Version: version, Limits: each}, mcpOwner); err != nil {
		log.Error("vivarium mcp stopped", "err", err)
		return 1
	}
	return 0
}

// withMCP serves MCP over streamable HTTP at /mcp beside the API, behind
// the same keys. The returned function ends every MCP session, for the
// server's shutdown.
func withMCP(api http.Handler, svc *service.Service, auth httpapi.Authenticator, log *slog.Logger, node string) (http.Handler, func()) {
	var a mcp.Authenticator
	if auth != nil {
		a = auth
	}
	h := mcp.NewHandler(mcp.Config{Service: svc, Logger: log, Version: version, Node: node}, a, httpapi.DevOwner)
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	mux.Handle("/", api)
	return mux, h.Close
}

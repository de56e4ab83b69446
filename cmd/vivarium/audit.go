package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/store"
)

func cmdAudit(args []string) int {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: vivarium audit [flags]

Shows the audit log of a server, newest first: every execution, command
and one-shot run, with the key, the sandbox, the SHA-256 of the code, how
it ended and what it used; sandboxes' network connections and connections
to their ports. COUNT is how many connections a row stands for: refused
and failed egress connections and connections to ports are counted into
one row per sandbox, destination and outcome a minute (their bytes and
time added up), not written one row each.

Flags:
`)
		fs.PrintDefaults()
	}
	dataDir := fs.String("data-dir", defaultDataDir(), "the server's data `DIR`")
	var q store.Query
	fs.StringVar(&q.KeyID, "key", "", "only this key `ID`")
	fs.StringVar(&q.SandboxID, "sandbox", "", "only this sandbox `ID`")
	fs.StringVar(&q.Status, "status", "", "only this status (ok, error, timeout, memory_limit, killed, setup_failed; for net: allowed, refused, failed; for port: ok, refused, failed; for net_policy: changed, refused)")
	fs.StringVar(&q.Kind, "kind", "", "only this kind (execute, command, run_once, package, net, net_policy, port)")
	since := fs.Duration("since", 0, "only the last `DURATION` (e.g. 1h)")
	fs.IntVar(&q.Limit, "limit", 100, "at most `N` records")
	asJSON := fs.Bool("json", false, "print JSON lines")
	if err := envDefaults(fs); err != nil {
		fmt.Fprintf(os.Stderr, "vivarium audit: %v\n", err)
		return 2
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *since < 0 || q.Limit < 1 {
		fmt.Fprintln(os.Stderr, "vivarium audit: --since and --limit must be positive")
		return 2
	}
	if *since > 0 {
		q.Since = time.Now().Add(-*since)
	}
	st, err := store.Open(*dataDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vivarium audit: %v\n", err)
		return 1
	}
	defer st.Close()
	recs, err := st.Audit(context.Background(), q)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vivarium audit: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		for _, r := range recs {
			enc.Encode(r)
		}
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tKIND\tKEY\tSANDBOX\tCODE/HOST\tSTATUS\tCOUNT\tEXIT\tMS\tCPU MS\tPEAK MEM")
	for _, r := range recs {
		what := fmt.Sprintf("%.12s", r.CodeSHA256)
		switch r.Kind {
		case "net":
			// A connection: where to, and the bytes from it and to it.
			what = fmt.Sprintf("%s:%d in=%s out=%s", r.Host, r.Port, formatSize(r.BytesIn), formatSize(r.BytesOut))
		case "port":
			// A connection to a port of the sandbox, from outside.
			what = fmt.Sprintf("port %d in=%s out=%s", r.Port, formatSize(r.BytesIn), formatSize(r.BytesOut))
		case "net_policy":
			// A change of a sandbox's network: the policy granted, or why
			// it was refused (--json has all of it).
			what = fmt.Sprintf("%.60s", r.Detail)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%.1f\t%.1f\t%s\n", r.Time.Local().Format("2006-01-02 15:04:05.000"),
			r.Kind, r.KeyID, dash(r.SandboxID), what, r.Status, r.Count, r.ExitCode, r.DurationMS, r.CPUMS, formatSize(r.PeakMemoryBytes))
	}
	tw.Flush()
	return 0
}

// auditServeFlags bound a server's audit log (vivarium serve).
type auditServeFlags struct {
	retention time.Duration
	maxRows   int64
}

func (f *auditServeFlags) register(fs *flag.FlagSet) {
	fs.DurationVar(&f.retention, "audit-retention", store.DefaultAuditRetention,
		"how long audit records are kept; older ones are deleted in the background (0: no age bound)")
	fs.Int64Var(&f.maxRows, "audit-max-rows", store.DefaultAuditMaxRows,
		"most `N` rows the audit log keeps, the newest; older ones are deleted in the background (0: no bound)")
}

func (f *auditServeFlags) options() store.AuditOptions {
	return store.AuditOptions{Retention: f.retention, MaxRows: f.maxRows}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

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

const keysUsage = `Usage:
  vivarium keys create [--max-sandboxes N] [--max-executions N] NAME
  vivarium keys list [--json]
  vivarium keys revoke [--close-sandboxes] ID|NAME

Manages the API keys of a server (its --data-dir, or VIVARIUM_DATA_DIR).
The token is printed once, at creation; only its hash is stored. Works
while the server runs: a revoked key, and every token made from it (E2B
access tokens, port tokens, signed URLs, volume tokens), stops working
within seconds. Its sandboxes run on until their timeout, unreachable,
unless --close-sandboxes (which a key revoked before may be given by ID).
With --cluster, the keys of a cluster's nodes (vivarium serve --cluster):
a Secret each in --namespace, made through --kubeconfig.
`

func cmdKeys(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(os.Stderr, keysUsage)
		return 2
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("keys "+sub, flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), keysUsage+"\nFlags:\n"); fs.PrintDefaults() }
	dataDir := fs.String("data-dir", defaultDataDir(), "the server's data `DIR`")
	asJSON := fs.Bool("json", false, "print JSON")
	maxSandboxes := fs.Int("max-sandboxes", 0, "live sandboxes this key may hold (0: the server's default)")
	maxExecutions := fs.Int("max-executions", 0, "executions this key may run at once (0: the server's default)")
	closeSandboxes := fs.Bool("close-sandboxes", false, "revoke: the servers close the key's sandboxes too")
	var cc clusterConfig
	inCluster := fs.Bool("cluster", false, "the keys of a cluster (Secrets of --namespace), not of --data-dir")
	fs.StringVar(&cc.kubeconfig, "kubeconfig", "", "`FILE` with the Kubernetes API server's address and credentials (--cluster)")
	fs.StringVar(&cc.namespace, "namespace", "", "Kubernetes `NAMESPACE` of the cluster (--cluster; default $POD_NAMESPACE, else vivarium)")
	if err := envDefaults(fs); err != nil {
		fmt.Fprintf(os.Stderr, "vivarium keys: %v\n", err)
		return 2
	}
	positional, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *inCluster {
		return clusterKeys(&cc, sub, positional, *maxSandboxes, *maxExecutions, *closeSandboxes, *asJSON)
	}
	st, err := store.Open(*dataDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vivarium keys: %v\n", err)
		return 1
	}
	defer st.Close()
	ctx := context.Background()
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "vivarium keys %s: %v\n", sub, err)
		return 1
	}
	switch sub {
	case "create":
		if len(positional) != 1 {
			fmt.Fprint(os.Stderr, "vivarium keys create: give the key a NAME (who or what uses it)\n")
			return 2
		}
		token, k, err := st.CreateKey(ctx, positional[0], *maxSandboxes, *maxExecutions)
		if err != nil {
			return fail(err)
		}
		if *asJSON {
			json.NewEncoder(os.Stdout).Encode(map[string]any{"token": token, "key": k})
			return 0
		}
		fmt.Fprintf(os.Stderr, "created key %s (%s); the token is shown only this once:\n", k.ID, k.Name)
		fmt.Println(token)
	case "list":
		keys, err := st.Keys(ctx)
		if err != nil {
			return fail(err)
		}
		if *asJSON {
			if keys == nil {
				keys = []store.Key{}
			}
			json.NewEncoder(os.Stdout).Encode(keys)
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tNAME\tCREATED\tSTATE\tMAX SANDBOXES\tMAX EXECUTIONS")
		for _, k := range keys {
			state := "live"
			if k.RevokedAt != nil {
				state = "revoked " + k.RevokedAt.Format(time.DateTime)
				if k.CloseSandboxes {
					state += " with its sandboxes"
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, k.CreatedAt.Format(time.DateTime), state,
				quota(k.MaxSandboxes), quota(k.MaxExecutions))
		}
		tw.Flush()
	case "revoke":
		if len(positional) != 1 {
			fmt.Fprint(os.Stderr, "vivarium keys revoke: give the key's ID or NAME\n")
			return 2
		}
		k, err := st.RevokeKey(ctx, positional[0], *closeSandboxes)
		if err != nil {
			return fail(err)
		}
		if k.CloseSandboxes {
			fmt.Fprintf(os.Stderr, "revoked key %s (%s) with its sandboxes: the server closes them within seconds\n", k.ID, k.Name)
		} else {
			fmt.Fprintf(os.Stderr, "revoked key %s (%s); its sandboxes run on, unreachable, until their timeout "+
				"(vivarium keys revoke --close-sandboxes %s closes them)\n", k.ID, k.Name, k.ID)
		}
	default:
		fmt.Fprintf(os.Stderr, "vivarium keys: unknown subcommand %q\n\n%s", sub, keysUsage)
		return 2
	}
	return 0
}

func quota(n int) string {
	if n == 0 {
		return "default"
	}
	return fmt.Sprint(n)
}

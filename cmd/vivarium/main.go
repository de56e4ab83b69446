// Command vivarium runs untrusted Python in sandboxes.
//
//	vivarium run [flags] FILE | -c CODE | -   run code in a fresh sandbox
//	vivarium serve                            stateful sandboxes over HTTP
//	vivarium mcp                              sandboxes for an AI agent over MCP (stdio)
//	vivarium keys create|list|revoke          API keys of a server
//	vivarium audit                            what ran, by whom, at what cost
//	vivarium sandbox create|list|exec|...     use a running server by hand
//	vivarium volume ls|create|info|rm         a key's persistent volumes
//	vivarium doctor                           what this host supports
//	vivarium bench                            start-up against python3 and peers
//	vivarium image pull|import|ls|rm|build    OCI images on the host
//	vivarium template build|ls|inspect|rm     templates built from Dockerfiles
//
// The same binary is the sandbox's init: the native backend re-executes it
// inside new namespaces, and main hands over to the backend first thing.
package main

import (
	"fmt"
	"os"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
)

const usage = `vivarium runs untrusted Python in sandboxes.

Usage:
  vivarium run [flags] FILE       run a Python file in a fresh sandbox
  vivarium run [flags] -c CODE    run a string
  vivarium run [flags] -          run standard input
  vivarium serve [flags]          serve stateful sandboxes over HTTP (and MCP at /mcp)
  vivarium gateway [flags]        the one endpoint of a cluster of nodes (serve --cluster)
  vivarium mcp [flags]            serve sandboxes to an AI agent over MCP on stdio
  vivarium keys create NAME       create an API key (also: keys list, keys revoke ID)
  vivarium audit [flags]          show the audit log of executions
  vivarium sandbox SUBCOMMAND     use a running server: create, list, exec, files, kill
  vivarium volume SUBCOMMAND      a key's persistent volumes: ls, create, info, rm
  vivarium doctor                 show what this host supports
  vivarium bench [flags]          compare sandbox start-up with python3 and peers
  vivarium image SUBCOMMAND       OCI images on the host: pull, import, ls, rm (build: the docker backend's)
  vivarium template SUBCOMMAND    templates: build (from a Dockerfile), ls, inspect, rm
  vivarium version

Run "vivarium run -h" for the flags of run.
`

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if native.IsInit() {
		native.RunInit() // never returns
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:])
	case "doctor":
		return cmdDoctor(args[1:])
	case "serve":
		return cmdServe(args[1:])
	case "gateway":
		return cmdGateway(args[1:])
	case "mcp":
		return cmdMCP(args[1:])
	case "keys":
		return cmdKeys(args[1:])
	case "audit":
		return cmdAudit(args[1:])
	case "sandbox", "sb":
		return cmdSandbox(args[1:])
	case "volume", "volumes":
		return cmdVolume(args[1:])
	case "bench":
		return cmdBench(args[1:])
	case "image":
		return cmdImage(args[1:])
	case "template", "templates":
		return cmdTemplate(args[1:])
	case "version", "--version":
		fmt.Println("vivarium", version)
		return 0
	case "help", "-h", "--help":
		fmt.Print(usage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "vivarium: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

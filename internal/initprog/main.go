// Command initprog is the program every sandbox starts inside itself: the
// native backend's init (and a zygote's), and the agent the gvisor and
// docker backends start in theirs. It is the code of those packages and
// nothing else, so that a sandbox does not start and initialise the whole
// vivarium binary (its HTTP, SQLite, Kubernetes and MCP packages) each
// time: about a third of the CPU time of starting the whole binary.
//
// scripts/build.sh builds it and embeds it into vivarium (cmd/vivarium's
// initprog.go), which writes it out once and starts it. It is not meant to
// be run by hand.
package main

import (
	"fmt"
	"os"

	"github.com/vivarium-sandbox/vivarium/internal/agent"
	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
)

func main() {
	// The packages' init functions take over a sandbox's process before
	// main; these are for a binary started otherwise.
	if native.IsInit() {
		native.RunInit()
	}
	if agent.IsAgent() {
		os.Exit(agent.Run(os.Stdin, os.Stdout))
	}
	fmt.Fprintln(os.Stderr, "this is the program vivarium starts inside its sandboxes; run vivarium instead")
	os.Exit(2)
}

package main

import (
	"fmt"
	"os"
)

func cmdBench(args []string) int { fmt.Fprintln(os.Stderr, "bench: not yet"); return 1 }

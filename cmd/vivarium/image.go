package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
)

// cmdImage builds the docker backend's image ahead of time (the backend
// builds it on first use otherwise): progress on standard error, the
// image's name on standard output.
func cmdImage(args []string) int {
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(os.Stderr, "usage: vivarium image build [--docker-host ADDRESS]")
		return 2
	}
	fs := flag.NewFlagSet("image build", flag.ContinueOnError)
	host := fs.String("docker-host", "", "the Docker daemon's `ADDRESS` (unix:///PATH); default $DOCKER_HOST, else unix:///var/run/docker.sock")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	name, err := docker.BuildImage(ctx, *host, func(step string) {
		fmt.Fprintln(os.Stderr, "vivarium image build:", step)
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "vivarium image build: %v\n", err)
		return 1
	}
	fmt.Println(name)
	return 0
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/template"
)

const templateUsage = `Usage: vivarium template SUBCOMMAND [flags] ...

Templates are images of the data directory's image store (DIR/images),
built on this host from a Dockerfile: each RUN in a sandbox of the image
built so far, with the walls of any sandbox and no network. Sandboxes of
a template: vivarium run --template NAME, "template" on /v1. Needs root,
as the server does.

  build -t NAME[:TAG] [-f Dockerfile] [--build-arg K=V] DIR
                    build a template from DIR's Dockerfile and files
  ls                the store's templates and images
  inspect NAME      a template's configuration, as JSON
  rm NAME ...       remove templates (sandboxes of them go on)

Each subcommand takes its own flags, which "vivarium template SUBCOMMAND -h"
lists.
`

// templateSubcommands are `vivarium template`'s subcommands, aliases
// included.
var templateSubcommands = []string{"build", "inspect", "ls", "list", "rm"}

// cmdTemplate is `vivarium template`.
func cmdTemplate(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(os.Stderr, templateUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	switch sub, args := args[0], args[1:]; sub {
	case "build":
		return templateBuild(args)
	case "inspect":
		return templateInspect(args)
	case "ls", "list", "rm":
		return cmdImage(append([]string{sub}, args...))
	default:
		fmt.Fprintf(os.Stderr, "vivarium template: unknown subcommand %q\n\n%s", sub, templateUsage)
		return 2
	}
}

// templateBuild is `vivarium template build`.
func templateBuild(args []string) int {
	fs := flag.NewFlagSet("template build", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir(), "the server's data `DIR`; templates are kept in DIR/images")
	name := fs.String("t", "", "the template's `NAME[:TAG]` (required)")
	file := fs.String("f", "", "the Dockerfile's `PATH` (default DIR/Dockerfile)")
	noCache := fs.Bool("no-cache", false, "run every step again, whatever the build cache holds")
	var buildArgs listFlag
	fs.Var(&buildArgs, "build-arg", "`K=V`: a value for the Dockerfile's ARG K (repeatable)")
	var allowNet ruleList
	fs.Var(&allowNet, "allow-net", "`RULE` a RUN step may reach through its sandbox's HTTP(S) proxy (repeatable): "+
		"HOST, *.DOMAIN, CIDR or [IPV6-CIDR], each with :PORTS (80,443 when none); default: no network")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *name == "" || len(pos) != 1 {
		fmt.Fprint(os.Stderr, "vivarium template build: give -t NAME and one build directory\n\n"+templateUsage)
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "vivarium template build: %v\n", err)
		return 1
	}
	values := map[string]string{}
	for _, kv := range buildArgs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fail(fmt.Errorf("--build-arg %q: want K=V", kv))
		}
		values[k] = v
	}
	dockerfile := *file
	if dockerfile == "" {
		dockerfile = filepath.Join(pos[0], "Dockerfile")
	}
	f, err := os.Open(dockerfile)
	if err != nil {
		return fail(err)
	}
	spec, notes, err := template.ParseDockerfile(f, values)
	f.Close()
	if err != nil {
		return fail(err)
	}
	for _, n := range notes {
		fmt.Fprintf(os.Stderr, "vivarium template build: note: %s\n", n)
	}
	if *noCache {
		for i := range spec.Steps {
			spec.Steps[i].Force = true
		}
	}
	files, err := template.OpenContext(pos[0])
	if err != nil {
		return fail(err)
	}
	defer files.Close()
	images, err := openImages(*dataDir)
	if err != nil {
		return fail(err)
	}
	b, err := native.New(native.Config{CgroupParent: "vivarium-build"})
	if err != nil {
		return fail(err)
	}
	defer b.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if e, err := runEgress(allowNet); err != nil {
		return fail(err) // the rules, checked before the first step
	} else if e != nil {
		e.Close()
	}
	sandboxes := &buildSandboxes{backend: b, store: images}
	if len(allowNet) > 0 {
		sandboxes.egress = func() (sandbox.Egress, error) { return runEgress(allowNet) }
	}
	builder := &template.Builder{Store: images, Sandboxes: sandboxes, CacheDir: filepath.Join(*dataDir, "build-cache")}
	im, err := builder.Build(ctx, *name, spec, files, os.Stderr)
	if err != nil {
		return fail(err)
	}
	fmt.Printf("%s %s\n", im.Name, im.Digest)
	return 0
}

// templateInspect is `vivarium template inspect`.
func templateInspect(args []string) int {
	fs := flag.NewFlagSet("template inspect", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir(), "the server's data `DIR`; templates are kept in DIR/images")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if len(pos) != 1 {
		fmt.Fprint(os.Stderr, "vivarium template inspect: give one NAME\n\n"+templateUsage)
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "vivarium template inspect: %v\n", err)
		return 1
	}
	images, err := openImages(*dataDir)
	if err != nil {
		return fail(err)
	}
	im, err := images.Get(pos[0])
	if err != nil {
		return fail(err)
	}
	cfg, err := images.ConfigFile(im)
	if err != nil {
		return fail(err)
	}
	out := struct {
		Name       string            `json:"name"`
		Digest     string            `json:"digest"`
		Layers     []string          `json:"layers"`
		Size       int64             `json:"size"`
		Env        []string          `json:"env"`
		WorkingDir string            `json:"working_dir"`
		User       string            `json:"user"`
		Cmd        []string          `json:"cmd"`
		Labels     map[string]string `json:"labels"`
	}{im.Name, im.Digest, im.Layers, im.Size, cfg.Config.Env, cfg.Config.WorkingDir, cfg.Config.User,
		cfg.Config.Cmd, cfg.Config.Labels}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(out)
	return 0
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/vivarium-sandbox/vivarium/internal/backend/docker"
	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/template"
)

const imageUsage = `Usage: vivarium image SUBCOMMAND [flags] ...

Keeps OCI images in the data directory's image store (DIR/images): each
layer once, by its digest, unpacked and checked. Needs root, as the
server does.

  pull REF                 an image from its registry (or a mirror)
  push REF DEST            an image of the store (a template) to a
                           registry, as DEST
  import FILE [--tag REF]  an image from a docker save archive or an OCI
                           image layout tar
  ls                       the store's images
  rm REF ...               remove images, and the layers no other uses
  build                    build the docker backend's image (needs Docker)

Each subcommand takes its own flags, which "vivarium image SUBCOMMAND -h"
lists.
`

// imageSubcommands are `vivarium image`'s subcommands, aliases included.
var imageSubcommands = []string{"pull", "push", "import", "ls", "list", "rm", "build"}

// cmdImage is `vivarium image`.
func cmdImage(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(os.Stderr, imageUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	sub, args := args[0], args[1:]
	switch {
	case sub == "build":
		return imageBuild(args)
	case !slices.Contains(imageSubcommands, sub):
		fmt.Fprintf(os.Stderr, "vivarium image: unknown subcommand %q\n\n%s", sub, imageUsage)
		return 2
	}
	fs := flag.NewFlagSet("image "+sub, flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir(), "the server's data `DIR`; images are kept in DIR/images")
	var insecure, mirrors listFlag
	var authFile, user *string
	var passStdin, asJSON *bool
	var tag *string
	switch sub {
	case "pull", "push":
		fs.Var(&insecure, "insecure-registry", "a registry `HOST[:PORT]` reached over plain HTTP (repeatable); no other is")
		if sub == "pull" {
			fs.Var(&mirrors, "registry-mirror", "`REGISTRY=MIRROR`: pull REGISTRY's images from MIRROR first (repeatable; docker.io is index.docker.io)")
		}
		authFile = fs.String("auth-file", "", "credentials from this Docker `config.json` (default $DOCKER_CONFIG/config.json, else ~/.docker/config.json)")
		user = fs.String("username", "", "the registry's `USER` (with --password-stdin)")
		passStdin = fs.Bool("password-stdin", false, "read the password for --username from standard input")
	case "import":
		tag = fs.String("tag", "", "name the image `REF` (default: the name the archive gives)")
	case "ls", "list":
		asJSON = fs.Bool("json", false, "print the images as JSON")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	pos := fs.Args()
	want := map[string]int{"pull": 1, "push": 2, "import": 1}[sub]
	if (want > 0 && len(pos) != want) || (sub == "rm" && len(pos) == 0) || ((sub == "ls" || sub == "list") && len(pos) > 0) {
		fmt.Fprintf(os.Stderr, "vivarium image %s: wrong arguments\n\n%s", sub, imageUsage)
		return 2
	}
	s, err := openImages(*dataDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vivarium image %s: %v\n", sub, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "vivarium image %s: %v\n", sub, err)
		return 1
	}
	// registry is how pull and push reach a registry.
	registry := func() (image.PullOptions, error) {
		o, err := pullOptions(insecure, mirrors)
		if err == nil {
			o.Keychain, err = pullKeychain(*authFile, *user, *passStdin, os.Stdin)
		}
		return o, err
	}
	switch sub {
	case "pull":
		o, err := registry()
		if err != nil {
			return fail(err)
		}
		im, err := image.Pull(ctx, s, pos[0], o, imageProgress("pull"))
		if err != nil {
			return fail(err)
		}
		fmt.Println(im.Name, im.Digest)
	case "push":
		o, err := registry()
		if err != nil {
			return fail(err)
		}
		var last time.Time
		digest, err := template.Push(ctx, s, pos[0], pos[1], o, func(sent, total int64) {
			if time.Since(last) >= time.Second || sent == total {
				last = time.Now()
				fmt.Fprintf(os.Stderr, "vivarium image push: %s of %s\n", image.FormatBytes(sent), image.FormatBytes(total))
			}
		})
		if err != nil {
			return fail(err)
		}
		fmt.Println(pos[1], digest)
	case "import":
		im, err := image.Import(ctx, s, pos[0], *tag, imageProgress("import"))
		if err != nil {
			return fail(err)
		}
		fmt.Println(im.Name, im.Digest)
	case "ls", "list":
		list, err := s.List()
		if err != nil {
			return fail(err)
		}
		if *asJSON {
			b, _ := json.MarshalIndent(list, "", "  ")
			fmt.Println(string(b))
			return 0
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tDIGEST\tLAYERS\tSIZE\tSTORED")
		for _, im := range list {
			fmt.Fprintf(tw, "%s\t%.19s\t%d\t%s\t%s\n", im.Name, im.Digest, len(im.Layers), image.FormatBytes(im.Size),
				im.Stored.Local().Format(time.DateTime))
		}
		tw.Flush()
	case "rm":
		code := 0
		for _, ref := range pos {
			if err := s.Remove(ref); err != nil {
				fail(err)
				code = 1
			}
		}
		return code
	}
	return 0
}

// pullKeychain is where a pull takes credentials: a user and password
// given, a Docker config.json named, or Docker's own.
func pullKeychain(authFile, user string, passStdin bool, stdin io.Reader) (authn.Keychain, error) {
	switch {
	case user != "":
		if !passStdin {
			return nil, errors.New("--username needs --password-stdin (a password on the command line would be seen by every user of the host)")
		}
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && line == "" {
			return nil, fmt.Errorf("read the password from standard input: %w", err)
		}
		return staticKeychain{authn.FromConfig(authn.AuthConfig{Username: user, Password: strings.TrimRight(line, "\r\n")})}, nil
	case passStdin:
		return nil, errors.New("--password-stdin needs --username")
	case authFile != "":
		if _, err := os.Stat(authFile); err != nil {
			return nil, fmt.Errorf("--auth-file: %w", err)
		}
		// Docker's keychain reads $DOCKER_CONFIG/config.json.
		if filepath.Base(authFile) != "config.json" {
			return nil, fmt.Errorf("--auth-file %s: name a Docker config.json", authFile)
		}
		os.Setenv("DOCKER_CONFIG", filepath.Dir(authFile))
	}
	return authn.DefaultKeychain, nil
}

// staticKeychain gives the same credentials for every registry of one
// pull (the registry and its mirror).
type staticKeychain struct{ a authn.Authenticator }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) { return k.a, nil }

// imageProgress prints a pull's or an import's progress on standard
// error: each layer as it ends, and at most a line a second while one
// unpacks.
func imageProgress(what string) func(image.Progress) {
	var last time.Time
	return func(p image.Progress) {
		switch {
		case p.Done:
			fmt.Fprintf(os.Stderr, "vivarium image %s: layer %d/%d: %s\n", what, p.Layer, p.Layers, image.FormatBytes(p.Bytes))
		case time.Since(last) >= time.Second:
			last = time.Now()
			fmt.Fprintf(os.Stderr, "vivarium image %s: layer %d/%d: %s so far\n", what, p.Layer, p.Layers, image.FormatBytes(p.Bytes))
		}
	}
}

// imageBuild builds the docker backend's image ahead of time (the backend
// builds it on first use otherwise): progress on standard error, the
// image's name on standard output.
func imageBuild(args []string) int {
	fs := flag.NewFlagSet("image build", flag.ContinueOnError)
	host := fs.String("docker-host", "", "the Docker daemon's `ADDRESS` (unix:///PATH); default $DOCKER_HOST, else unix:///var/run/docker.sock")
	if err := fs.Parse(args); err != nil {
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

// openImages opens the image store of a data directory, which holds the
// templates sandboxes are made of.
func openImages(dataDir string) (*image.Store, error) {
	return image.Open(filepath.Join(dataDir, "images"), image.DefaultLimits)
}

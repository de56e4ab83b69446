package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"text/tabwriter"
	"time"
)

const volumeUsage = `Usage: vivarium volume SUBCOMMAND [flags] ...

Manages the API key's persistent volumes on a running server (VIVARIUM_URL,
default http://127.0.0.1:8080; VIVARIUM_API_KEY). A sandbox mounts them
with "vivarium sandbox create --volume NAME:PATH".

  ls                        the key's volumes
  create [--size SIZE] NAME a new volume (default size: the server's)
  info NAME|ID              one volume
  rm NAME|ID                delete a volume and its files (not while a sandbox mounts it)

Every subcommand takes --json to print the server's answer as it is.
`

func cmdVolume(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(os.Stderr, volumeUsage)
		return 2
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("volume "+sub, flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), volumeUsage+"\nFlags:\n"); fs.PrintDefaults() }
	asJSON := fs.Bool("json", false, "print the server's JSON answer")
	var size sizeFlag
	fs.Var(&size, "size", "the volume's size (create): 256MiB, 1GiB ...")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	fail := func(err error) int { return clientFail("volume "+sub, err) }
	printed := func(raw []byte, err error) int {
		if err != nil {
			return fail(err)
		}
		os.Stdout.Write(raw)
		return 0
	}
	if sub != "ls" && sub != "list" && len(pos) != 1 {
		fmt.Fprintf(os.Stderr, "vivarium volume %s: want one volume NAME\n", sub)
		return 2
	}
	c := newAPIClient()
	type vol struct {
		ID        string    `json:"id"`
		Name      string    `json:"name"`
		Size      int64     `json:"size"`
		CreatedAt time.Time `json:"created_at"`
	}
	switch sub {
	case "ls", "list":
		var out struct{ Volumes []vol }
		raw, err := c.call("GET", "/v1/volumes", nil, &out)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tID\tSIZE\tCREATED")
		for _, v := range out.Volumes {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Name, v.ID, formatSize(v.Size), v.CreatedAt.Local().Format(time.DateTime))
		}
		tw.Flush()
	case "create":
		req := map[string]any{"name": pos[0]}
		if size > 0 {
			req["size"] = int64(size)
		}
		var v vol
		raw, err := c.call("POST", "/v1/volumes", req, &v)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		fmt.Println(v.ID)
	case "info":
		return printed(c.call("GET", "/v1/volumes/"+url.PathEscape(pos[0]), nil, nil))
	case "rm":
		if _, err := c.call("DELETE", "/v1/volumes/"+url.PathEscape(pos[0]), nil, nil); err != nil {
			return fail(err)
		}
	default:
		fmt.Fprintf(os.Stderr, "vivarium volume: unknown subcommand %q\n\n%s", sub, volumeUsage)
		return 2
	}
	return 0
}

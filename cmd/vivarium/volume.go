package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"text/tabwriter"
	"time"
)

// volumeCmd is `vivarium volume`.
var volumeCmd = &subcommands[volumeOpts]{cmd: "volume", aliases: map[string]string{"list": "ls"},
	intro: `Manages the API key's persistent volumes on a running server (VIVARIUM_URL,
default http://127.0.0.1:8080; VIVARIUM_API_KEY). A sandbox mounts them
with "vivarium sandbox create --volume NAME:PATH".`,
	subs: []subcommand[volumeOpts]{
		{"ls", "", "the key's volumes", volumeJSON, volumeLs},
		{"create", "NAME [--size SIZE]", "a new volume (default size: the server's); prints its id",
			[]func(*volumeOpts, *flag.FlagSet){volumeJSONFlag, volumeSizeFlag}, volumeCreate},
		{"info", "NAME|ID", "one volume", volumeJSON, volumeInfo},
		{"rm", "NAME|ID", "delete a volume and its files (not while a sandbox mounts it)", nil, volumeRm},
	},
}

func cmdVolume(args []string) int { return volumeCmd.main(args) }

// volumeOpts holds the values of every flag a subcommand may take.
type volumeOpts struct {
	json bool
	size sizeFlag
}

var volumeJSON = []func(*volumeOpts, *flag.FlagSet){volumeJSONFlag}

func volumeJSONFlag(o *volumeOpts, fs *flag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, jsonUsage)
}

func volumeSizeFlag(o *volumeOpts, fs *flag.FlagSet) {
	fs.Var(&o.size, "size", "the volume's `SIZE`: 256MiB, 1GiB ... (default: the server's)")
}

type volumeCall = subcall[volumeOpts]

// volumeAnswer is a volume as the server describes it.
type volumeAnswer struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"created_at"`
}

// oneVolume says whether the call names exactly one volume.
func oneVolume(x *volumeCall) bool {
	if len(x.pos) != 1 {
		fmt.Fprintf(os.Stderr, "vivarium %s: want one volume NAME\n", x.what())
		return false
	}
	return true
}

// volumePath is the API path of volume name (a name or an id).
func volumePath(name string) string { return "/v1/volumes/" + url.PathEscape(name) }

func volumeLs(x *volumeCall) int {
	var out struct{ Volumes []volumeAnswer }
	raw, err := x.c.call("GET", "/v1/volumes", nil, &out)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tSIZE\tCREATED")
	for _, v := range out.Volumes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.Name, v.ID, formatSize(v.Size), v.CreatedAt.Local().Format(time.DateTime))
	}
	tw.Flush()
	return 0
}

func volumeCreate(x *volumeCall) int {
	if !oneVolume(x) {
		return 2
	}
	req := map[string]any{"name": x.pos[0]}
	if x.o.size > 0 {
		req["size"] = int64(x.o.size)
	}
	var v volumeAnswer
	raw, err := x.c.call("POST", "/v1/volumes", req, &v)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	fmt.Println(v.ID)
	return 0
}

func volumeInfo(x *volumeCall) int {
	if !oneVolume(x) {
		return 2
	}
	return x.printed(x.c.call("GET", volumePath(x.pos[0]), nil, nil))
}

func volumeRm(x *volumeCall) int {
	if !oneVolume(x) {
		return 2
	}
	if _, err := x.c.call("DELETE", volumePath(x.pos[0]), nil, nil); err != nil {
		return x.fail(err)
	}
	return 0
}

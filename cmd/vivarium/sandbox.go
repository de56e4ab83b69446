package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// sandboxCmd is `vivarium sandbox`.
var sandboxCmd = &subcommands[sandboxOpts]{cmd: "sandbox", subs: sandboxSubs,
	intro: `Uses a running server (VIVARIUM_URL, default http://127.0.0.1:8080) with
an API key (VIVARIUM_API_KEY).`}

func cmdSandbox(args []string) int { return sandboxCmd.main(args) }

type (
	sandboxSub  = subcommand[sandboxOpts]
	sandboxCall = subcall[sandboxOpts]
	// flagGroup registers flags of one concern into a subcommand's set.
	flagGroup = func(*sandboxOpts, *flag.FlagSet)
)

// sandboxSubs are the subcommands, in the order the usage lists them.
var sandboxSubs = []sandboxSub{
	{"create", "[flags]", "a new sandbox; prints its id", []flagGroup{jsonFlag, createFlags, envFlag, limitFlags, netFlags}, sbCreate},
	{"list", "", "the key's sandboxes", jsonOnly, sbList},
	{"info", "ID", "one sandbox", jsonOnly, sbInfo},
	{"exec", "ID [-c CODE | FILE | -]", "run Python, keeping state; output streams", []flagGroup{jsonFlag, codeFlag, timeoutFlag, envFlag}, sbExec},
	{"run", "[-c CODE | FILE | -]", "run Python in a fresh sandbox destroyed afterwards", []flagGroup{jsonFlag, codeFlag, timeoutFlag, envFlag, limitFlags, netFlags}, sbExec},
	{"sh", "ID COMMAND", "run a shell command", []flagGroup{jsonFlag, timeoutFlag, envFlag}, sbSh},
	{"term", "ID ['COMMAND']", "a terminal in the sandbox (default: a login shell), attached\n" +
		"to this one as ssh does; exits with its status", nil, sbTerm},
	{"install", "ID NAME[==VERSION]", "install one of the server's allowed packages", jsonOnly, sbInstall},
	{"network", "ID [flags]", "replace what the sandbox may reach (no flags: nothing)", []flagGroup{jsonFlag, netFlags}, sbNetwork},
	{"files", "ID [DIR]", "list files", jsonOnly, sbFiles},
	{"put", "ID LOCAL [REMOTE]", "upload a file", jsonOnly, sbPut},
	{"get", "ID REMOTE [LOCAL]", `download a file (LOCAL "-": standard output)`, nil, sbGet},
	{"rm", "ID PATH", "delete a file or directory", nil, sbRm},
	{"interrupt", "ID", "interrupt the running execution", jsonOnly, sbPost},
	{"restart", "ID", "fresh Python state, files kept", jsonOnly, sbPost},
	{"pause", "ID", "save its processes' state to disk and free their memory\n" +
		"(native backend, with CRIU)", jsonOnly, sbPost},
	{"resume", "ID", "bring a paused sandbox back where it was", jsonOnly, sbPost},
	{"fork", "ID [--count N] [--same-random]", "copies of the running sandbox, each a sandbox of its own;\n" +
		"prints their ids", []flagGroup{jsonFlag, forkFlags}, sbFork},
	{"snapshot", "ID [--name NAME]", "save the running sandbox as a snapshot (it goes on); prints\n" +
		"the snapshot's id; create --from-snapshot SNAP makes sandboxes of it\n" +
		"(SNAP: its id, or its name: the newest snapshot of that name)",
		[]flagGroup{jsonFlag, snapshotFlags}, sbSnapshot},
	{"snapshots", "", "the key's snapshots", jsonOnly, sbSnapshots},
	{"snapshot-rm", "SNAP", "delete a snapshot (SNAP a name: every snapshot of that name)", nil, sbSnapshotRm},
	{"snapshot-export", "SNAP FILE", `download a snapshot (a tar file; FILE "-": standard output)`, nil, sbSnapshotExport},
	{"snapshot-import", "FILE", "upload a snapshot a server sharing this one's snapshot key\n" +
		"exported; prints its new id", jsonOnly, sbSnapshotImport},
	{"kill", "ID...", "close the sandboxes", nil, sbKill},
}

var jsonOnly = []flagGroup{jsonFlag}

// sandboxOpts holds the values of every flag a subcommand may take; each
// subcommand registers only those it uses.
type sandboxOpts struct {
	json    bool
	code    string
	timeout time.Duration
	env     listFlag

	memory, disk sizeFlag
	pids         int

	allowNet, denyNet, exceptNet ruleList
	allNet, packages             bool

	idle                 time.Duration
	onTimeout            string
	autoResume, pausable bool
	fromSnapshot         string
	volumes              listFlag

	count      int
	sameRandom bool
	name       string
}

func jsonFlag(o *sandboxOpts, fs *flag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, jsonUsage)
}

func codeFlag(o *sandboxOpts, fs *flag.FlagSet) {
	fs.StringVar(&o.code, "c", "", "`CODE` to run, instead of a FILE or standard input (-)")
}

func timeoutFlag(o *sandboxOpts, fs *flag.FlagSet) {
	fs.DurationVar(&o.timeout, "timeout", 0, "wall-clock limit of this run (default: the server's)")
}

func envFlag(o *sandboxOpts, fs *flag.FlagSet) {
	fs.Var(&o.env, "env", "`K=V` environment variable (repeatable)")
}

func limitFlags(o *sandboxOpts, fs *flag.FlagSet) {
	fs.Var(&o.memory, "memory", "memory limit, a `SIZE` such as 512MiB or 1GiB (default: the server's)")
	fs.Var(&o.disk, "disk", "`SIZE` the sandbox's files may take (default: the server's)")
	fs.IntVar(&o.pids, "pids", 0, "at most `N` processes and threads at once (default: the server's)")
}

func netFlags(o *sandboxOpts, fs *flag.FlagSet) {
	fs.Var(&o.allowNet, "allow-net", "`RULE` the sandbox may reach through its proxy, within the server's allowlist (repeatable)")
	fs.BoolVar(&o.allNet, "all-net", false, "the sandbox may reach all that the server's allowlist allows")
	fs.Var(&o.denyNet, "deny-net", "`RULE` refused even where allowed; without ports, every port (repeatable)")
	fs.Var(&o.exceptNet, "except-net", "`RULE` exempt from --deny-net, within the server's allowlist (repeatable)")
	fs.BoolVar(&o.packages, "packages", false, "the sandbox may install the server's allowed packages")
}

func createFlags(o *sandboxOpts, fs *flag.FlagSet) {
	fs.DurationVar(&o.idle, "idle-timeout", 0, "idle timeout (default: the server's)")
	fs.StringVar(&o.onTimeout, "on-timeout", "", "`WHAT` the idle timeout does: kill (the default) or pause")
	fs.BoolVar(&o.autoResume, "auto-resume", false, "a call on the paused sandbox resumes it")
	fs.BoolVar(&o.pausable, "pausable", false, "a sandbox that can be paused: native makes it without the zygote")
	fs.StringVar(&o.fromSnapshot, "from-snapshot", "", "make the sandbox from snapshot `SNAP` (its id, or its name: the newest "+
		"snapshot of that name), with its memory, files, limits and environment")
	fs.Var(&o.volumes, "volume", "`NAME:PATH`: mount the key's volume NAME at PATH (repeatable)")
}

func forkFlags(o *sandboxOpts, fs *flag.FlagSet) {
	fs.IntVar(&o.count, "count", 1, "`N` copies")
	fs.BoolVar(&o.sameRandom, "same-random", false, "the copies keep the source's random generators")
}

func snapshotFlags(o *sandboxOpts, fs *flag.FlagSet) {
	fs.StringVar(&o.name, "name", "", "`NAME` of the snapshot, which finds it as its id does")
}

// envMap is --env as the API's map.
func (o *sandboxOpts) envMap() (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range o.env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--env %q: want K=V", kv)
		}
		m[k] = v
	}
	return m, nil
}

// limits is --memory, --disk and --pids as the API's limits.
func (o *sandboxOpts) limits() map[string]any {
	l := map[string]any{}
	if o.memory > 0 {
		l["memory"] = int64(o.memory)
	}
	if o.disk > 0 {
		l["disk"] = int64(o.disk)
	}
	if o.pids > 0 {
		l["pids"] = o.pids
	}
	return l
}

// network is the network flags as the API's network request.
func (o *sandboxOpts) network() map[string]any {
	n := map[string]any{}
	if len(o.allowNet) > 0 {
		n["allow"] = []string(o.allowNet)
	}
	if o.packages {
		n["packages"] = true
	}
	if o.allNet {
		n["all"] = true
	}
	if len(o.denyNet) > 0 {
		n["deny"] = []string(o.denyNet)
	}
	if len(o.exceptNet) > 0 {
		n["except"] = []string(o.exceptNet)
	}
	return n
}

// sandboxPath is the API path of sandbox id.
func sandboxPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) }

func sbCreate(x *sandboxCall) int {
	o := x.o
	env, err := o.envMap()
	if err != nil {
		return x.usageError(err)
	}
	req := map[string]any{"limits": o.limits(), "env": env, "network": o.network()}
	if o.fromSnapshot != "" {
		// The server refuses limits, env, network or volumes beside it.
		req["from_snapshot"] = o.fromSnapshot
	}
	var mounts []map[string]string
	for _, v := range o.volumes {
		name, p, ok := strings.Cut(v, ":")
		if !ok || name == "" || p == "" {
			return x.usageError(fmt.Errorf("--volume %q: want NAME:PATH", v))
		}
		mounts = append(mounts, map[string]string{"name": name, "path": p})
	}
	if len(mounts) > 0 {
		req["volumes"] = mounts
	}
	if o.idle > 0 {
		req["timeout_s"] = o.idle.Seconds()
	}
	if o.onTimeout != "" {
		req["on_timeout"] = o.onTimeout
	}
	if o.autoResume {
		req["auto_resume"] = true
	}
	if o.pausable {
		req["pausable"] = true
	}
	var info struct{ ID string }
	raw, err := x.c.call("POST", "/v1/sandboxes", req, &info)
	if err != nil || o.json {
		return x.printed(raw, err)
	}
	fmt.Println(info.ID)
	return 0
}

func sbList(x *sandboxCall) int {
	var out struct {
		Sandboxes []struct {
			ID             string    `json:"id"`
			CreatedAt      time.Time `json:"created_at"`
			ExpiresAt      time.Time `json:"expires_at"`
			State          string    `json:"state"`
			ExecutionCount int       `json:"execution_count"`
		}
	}
	raw, err := x.c.call("GET", "/v1/sandboxes", nil, &out)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tEXECUTIONS\tCREATED\tEXPIRES")
	for _, s := range out.Sandboxes {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", s.ID, s.State, s.ExecutionCount,
			s.CreatedAt.Local().Format(time.DateTime), s.ExpiresAt.Local().Format(time.DateTime))
	}
	tw.Flush()
	return 0
}

func sbInfo(x *sandboxCall) int {
	if !x.need(1, "sandbox ID") {
		return 2
	}
	return x.printed(x.c.call("GET", sandboxPath(x.pos[0]), nil, nil))
}

// sbExec is exec (in a sandbox) and run (in a fresh one).
func sbExec(x *sandboxCall) int {
	o, pos := x.o, x.pos
	var id string
	if x.sub == "exec" {
		if !x.need(1, "sandbox ID") {
			return 2
		}
		id, pos = pos[0], pos[1:]
	}
	src, err := codeFrom(o.code, pos)
	if err != nil {
		return x.usageError(err)
	}
	env, err := o.envMap()
	if err != nil {
		return x.usageError(err)
	}
	req := map[string]any{"code": src, "env": env}
	if o.timeout > 0 {
		req["timeout_s"] = o.timeout.Seconds()
	}
	p := "/v1/execute"
	if x.sub == "exec" {
		p = sandboxPath(id) + "/execute"
	} else {
		req["limits"] = o.limits()
		req["network"] = o.network()
	}
	if o.json {
		return x.printed(x.c.call("POST", p, req, nil))
	}
	return x.c.stream(x.what(), p, req)
}

func sbSh(x *sandboxCall) int {
	if !x.need(2, "sandbox ID and COMMAND") {
		return 2
	}
	env, err := x.o.envMap()
	if err != nil {
		return x.usageError(err)
	}
	req := map[string]any{"cmd": strings.Join(x.pos[1:], " "), "env": env}
	if x.o.timeout > 0 {
		req["timeout_s"] = x.o.timeout.Seconds()
	}
	if x.o.json {
		return x.printed(x.c.call("POST", sandboxPath(x.pos[0])+"/commands", req, nil))
	}
	return x.c.stream(x.what(), sandboxPath(x.pos[0])+"/commands", req)
}

func sbTerm(x *sandboxCall) int {
	if !x.need(1, "sandbox ID") {
		return 2
	}
	command := "command -v bash >/dev/null && exec bash -l; exec sh -l"
	if len(x.pos) > 1 {
		command = strings.Join(x.pos[1:], " ")
	}
	return x.c.terminal(sandboxPath(x.pos[0]), command)
}

func sbInstall(x *sandboxCall) int {
	if !x.need(2, "sandbox ID and package NAME[==VERSION]") {
		return 2
	}
	name, version, _ := strings.Cut(x.pos[1], "==")
	var res struct {
		Status, Output, Error string
	}
	raw, err := x.c.call("POST", sandboxPath(x.pos[0])+"/packages", map[string]any{"name": name, "version": version}, &res)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	os.Stdout.WriteString(res.Output)
	if res.Status != "ok" {
		fmt.Fprintf(os.Stderr, "vivarium %s: %s\n", x.what(), res.Error)
		return 1
	}
	return 0
}

func sbNetwork(x *sandboxCall) int {
	if !x.need(1, "sandbox ID") {
		return 2
	}
	var info struct {
		Network json.RawMessage `json:"network"`
	}
	raw, err := x.c.call("PUT", sandboxPath(x.pos[0])+"/network", x.o.network(), &info)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	fmt.Printf("%s\n", info.Network)
	return 0
}

func sbFiles(x *sandboxCall) int {
	if !x.need(1, "sandbox ID") {
		return 2
	}
	dir := "."
	if len(x.pos) > 1 {
		dir = x.pos[1]
	}
	var out struct {
		Entries []struct {
			Path     string    `json:"path"`
			Size     int64     `json:"size"`
			Type     string    `json:"type"`
			Modified time.Time `json:"modified"`
		}
	}
	raw, err := x.c.call("GET", sandboxPath(x.pos[0])+"/files?path="+url.QueryEscape(dir), nil, &out)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	for _, e := range out.Entries {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.Type, e.Size, e.Modified.Local().Format(time.DateTime), e.Path)
	}
	tw.Flush()
	return 0
}

func sbPut(x *sandboxCall) int {
	if !x.need(2, "sandbox ID and LOCAL file") {
		return 2
	}
	remote := filepath.Base(x.pos[1])
	if len(x.pos) > 2 {
		remote = x.pos[2]
	}
	f, err := os.Open(x.pos[1])
	if err != nil {
		return x.fail(err)
	}
	defer f.Close()
	resp, err := x.c.do("PUT", sandboxPath(x.pos[0])+"/files/"+escapePath(remote), f, "application/octet-stream", "")
	if err != nil {
		return x.fail(err)
	}
	defer resp.Body.Close()
	if x.o.json {
		io.Copy(os.Stdout, resp.Body)
	}
	return 0
}

func sbGet(x *sandboxCall) int {
	if !x.need(2, "sandbox ID and REMOTE path") {
		return 2
	}
	local := path.Base(x.pos[1])
	if len(x.pos) > 2 {
		local = x.pos[2]
	}
	resp, err := x.c.do("GET", sandboxPath(x.pos[0])+"/files/"+escapePath(x.pos[1]), nil, "", "")
	if err != nil {
		return x.fail(err)
	}
	defer resp.Body.Close()
	return x.save(resp.Body, local, 0o644, "the download ended short")
}

func sbRm(x *sandboxCall) int {
	if !x.need(2, "sandbox ID and PATH") {
		return 2
	}
	if _, err := x.c.call("DELETE", sandboxPath(x.pos[0])+"/files/"+escapePath(x.pos[1]), nil, nil); err != nil {
		return x.fail(err)
	}
	return 0
}

// sbPost is interrupt, restart, pause and resume: a POST of the
// subcommand's name.
func sbPost(x *sandboxCall) int {
	if !x.need(1, "sandbox ID") {
		return 2
	}
	raw, err := x.c.call("POST", sandboxPath(x.pos[0])+"/"+x.sub, nil, nil)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	return 0
}

func sbFork(x *sandboxCall) int {
	if !x.need(1, "sandbox ID") {
		return 2
	}
	var out struct {
		Sandboxes []struct{ ID string }
	}
	raw, err := x.c.call("POST", sandboxPath(x.pos[0])+"/fork", map[string]any{"count": x.o.count, "same_random_state": x.o.sameRandom}, &out)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	for _, s := range out.Sandboxes {
		fmt.Println(s.ID)
	}
	return 0
}

func sbSnapshot(x *sandboxCall) int {
	if !x.need(1, "sandbox ID") {
		return 2
	}
	var out struct{ ID string }
	var body any
	if x.o.name != "" {
		body = map[string]string{"name": x.o.name}
	}
	raw, err := x.c.call("POST", sandboxPath(x.pos[0])+"/snapshots", body, &out)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	fmt.Println(out.ID)
	return 0
}

func sbSnapshots(x *sandboxCall) int {
	var out struct {
		Snapshots []struct {
			ID        string    `json:"id"`
			Name      string    `json:"name"`
			SandboxID string    `json:"sandbox_id"`
			CreatedAt time.Time `json:"created_at"`
			SizeBytes int64     `json:"size_bytes"`
		}
	}
	raw, err := x.c.call("GET", "/v1/snapshots", nil, &out)
	if err != nil || x.o.json {
		return x.printed(raw, err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SNAPSHOT\tNAME\tFROM\tCREATED\tSIZE")
	for _, s := range out.Snapshots {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d MiB\n", s.ID, cmp.Or(s.Name, "-"), s.SandboxID, s.CreatedAt.Local().Format(time.DateTime), s.SizeBytes>>20)
	}
	tw.Flush()
	return 0
}

func sbSnapshotRm(x *sandboxCall) int {
	if !x.need(1, "snapshot ID") {
		return 2
	}
	if _, err := x.c.call("DELETE", "/v1/snapshots/"+url.PathEscape(x.pos[0]), nil, nil); err != nil {
		return x.fail(err)
	}
	return 0
}

func sbSnapshotExport(x *sandboxCall) int {
	if !x.need(2, "snapshot ID and FILE") {
		return 2
	}
	resp, err := x.c.do("GET", "/v1/snapshots/"+url.PathEscape(x.pos[0])+"/export", nil, "", "")
	if err != nil {
		return x.fail(err)
	}
	defer resp.Body.Close()
	return x.save(resp.Body, x.pos[1], 0o600, "the export ended short")
}

func sbSnapshotImport(x *sandboxCall) int {
	if !x.need(1, "FILE") {
		return 2
	}
	f, err := os.Open(x.pos[0])
	if err != nil {
		return x.fail(err)
	}
	defer f.Close()
	resp, err := x.c.do("POST", "/v1/snapshots/import", f, "application/x-tar", "")
	if err != nil {
		return x.fail(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out struct{ ID string }
	if x.o.json || json.Unmarshal(raw, &out) != nil {
		os.Stdout.Write(raw)
		return 0
	}
	fmt.Println(out.ID)
	return 0
}

func sbKill(x *sandboxCall) int {
	if !x.need(1, "sandbox ID") {
		return 2
	}
	for _, id := range x.pos {
		if _, err := x.c.call("DELETE", sandboxPath(id), nil, nil); err != nil {
			return x.fail(err)
		}
	}
	return 0
}

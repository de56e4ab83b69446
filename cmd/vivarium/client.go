package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

const sandboxUsage = `Usage: vivarium sandbox SUBCOMMAND [flags] ...

Uses a running server (VIVARIUM_URL, default http://127.0.0.1:8080) with
an API key (VIVARIUM_API_KEY).

  create [--idle-timeout D] [--memory SIZE] [--pids N] [--disk SIZE] [--env K=V]   print the new sandbox's id
         [--from-snapshot SNAP]         made from a snapshot: its memory, files, limits and environment
         [--allow-net RULE] [--packages]  with network access, within the server's allowlist
         [--all-net] [--deny-net RULE] [--except-net RULE]  all of it, less what --deny-net refuses
         [--volume NAME:PATH]           with the key's volume mounted at PATH (repeatable)
         [--pausable] [--on-timeout pause] [--auto-resume]  a sandbox that can be paused; its idle
                                        timeout pauses it instead of closing it; the next call resumes it
  list                                  the key's sandboxes
  info ID                               one sandbox
  exec ID [-c CODE | FILE | -]          run Python, keeping state; output streams
  run [-c CODE | FILE | -]              run Python in a fresh sandbox destroyed afterwards
  sh ID COMMAND                         run a shell command
  term ID ['COMMAND']                   a terminal in the sandbox (default: a login shell), attached
                                        to this one as ssh does; exits with its status
  install ID NAME[==VERSION]            install one of the server's allowed packages
  network ID [--allow-net RULE] [--all-net] [--deny-net RULE] [--except-net RULE]
                                        replace what the sandbox may reach (none of them: nothing)
  files ID [DIR]                        list files
  put ID LOCAL [REMOTE]                 upload a file
  get ID REMOTE [LOCAL]                 download a file (LOCAL "-": standard output)
  rm ID PATH                            delete a file or directory
  interrupt ID                          interrupt the running execution
  restart ID                            fresh Python state, files kept
  pause ID                              save its processes' state to disk and free their memory
                                        (native backend, with CRIU)
  resume ID                             bring a paused sandbox back where it was
  fork ID [--count N] [--same-random]   copies of the running sandbox, each a sandbox of its own;
                                        prints their ids
  snapshot ID [--name NAME]             save the running sandbox as a snapshot (it goes on); prints
                                        the snapshot's id; create --from-snapshot SNAP makes sandboxes of it
                                        (SNAP: its id, or its name: the newest snapshot of that name)
  snapshots                             the key's snapshots
  snapshot-rm SNAP                      delete a snapshot (SNAP a name: every snapshot of that name)
  snapshot-export SNAP FILE             download a snapshot (a tar file; FILE "-": standard output)
  snapshot-import FILE                  upload a snapshot a server sharing this one's snapshot key
                                        exported; prints its new id
  kill ID                               close the sandbox

Every subcommand takes --json to print the server's answer as it is.
`

// apiClient speaks to a server's /v1 API.
type apiClient struct {
	base, key string
	http      *http.Client
}

func newAPIClient() *apiClient {
	base := os.Getenv("VIVARIUM_URL")
	if base == "" {
		base = "http://127.0.0.1:8080"
	}
	return &apiClient{base: strings.TrimSuffix(base, "/"), key: os.Getenv("VIVARIUM_API_KEY"), http: &http.Client{}}
}

// apiError is an error answer of the server.
type apiError struct {
	Status  int
	Code    string
	Message string
}

func (e *apiError) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.Message, e.Status) }

func (c *apiClient) do(method, p string, body io.Reader, contentType string, accept string) (*http.Response, error) {
	req, err := http.NewRequest(method, c.base+p, body)
	if err != nil {
		return nil, err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the server at %s (set VIVARIUM_URL): %w", c.base, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		var e struct {
			Error struct{ Code, Message string }
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if json.Unmarshal(b, &e) != nil || e.Error.Message == "" {
			e.Error.Message = strings.TrimSpace(string(b))
		}
		return nil, &apiError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	return resp, nil
}

// call sends v as JSON (if not nil) and decodes the answer into out (if
// not nil), or returns it raw.
func (c *apiClient) call(method, p string, v any, out any) ([]byte, error) {
	var body io.Reader
	ct := ""
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		body, ct = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(method, p, body, ct, "")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return raw, fmt.Errorf("unexpected answer from the server: %w", err)
		}
	}
	return raw, nil
}

func cmdSandbox(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(os.Stderr, sandboxUsage)
		return 2
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("sandbox "+sub, flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), sandboxUsage+"\nFlags:\n"); fs.PrintDefaults() }
	asJSON := fs.Bool("json", false, "print the server's JSON answer")
	code := fs.String("c", "", "`CODE` to run (exec, run)")
	timeout := fs.Duration("timeout", 0, "execution timeout (exec, run, sh)")
	idle := fs.Duration("idle-timeout", 0, "idle timeout (create)")
	onTimeout := fs.String("on-timeout", "", "what the idle timeout does: kill or pause (create)")
	autoResume := fs.Bool("auto-resume", false, "a call on the paused sandbox resumes it (create)")
	count := fs.Int("count", 1, "how many copies (fork)")
	sameRandom := fs.Bool("same-random", false, "the copies keep the source's random generators (fork)")
	fromSnapshot := fs.String("from-snapshot", "", "`SNAP`: make the sandbox from this snapshot, an id or a name (create)")
	snapName := fs.String("name", "", "`NAME` of the snapshot, which finds it as its id does (snapshot)")
	pausable := fs.Bool("pausable", false, "a sandbox that can be paused: native makes it without the zygote (create)")
	var memory, disk sizeFlag
	fs.Var(&memory, "memory", "memory limit (create, run)")
	fs.Var(&disk, "disk", "disk limit (create, run)")
	pids := fs.Int("pids", 0, "pids limit (create, run)")
	var env listFlag
	fs.Var(&env, "env", "`K=V` environment variable (repeatable)")
	var allowNet ruleList
	fs.Var(&allowNet, "allow-net", "`RULE` the sandbox may reach through its proxy, within the server's allowlist (create, run; repeatable)")
	var volumes listFlag
	fs.Var(&volumes, "volume", "`NAME:PATH`: mount the key's volume NAME at PATH (create; repeatable)")
	packages := fs.Bool("packages", false, "the sandbox may install the server's allowed packages (create)")
	allNet := fs.Bool("all-net", false, "the sandbox may reach all the server's allowlist allows (create, run, network)")
	var denyNet, exceptNet ruleList
	fs.Var(&denyNet, "deny-net", "`RULE` refused even where allowed; without ports, every port (create, run, network; repeatable)")
	fs.Var(&exceptNet, "except-net", "`RULE` exempt from --deny-net, within the server's allowlist (create, run, network; repeatable)")
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	envMap := map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			fmt.Fprintf(os.Stderr, "vivarium sandbox: --env %q: want K=V\n", kv)
			return 2
		}
		envMap[k] = v
	}
	limits := map[string]any{}
	if memory > 0 {
		limits["memory"] = int64(memory)
	}
	if disk > 0 {
		limits["disk"] = int64(disk)
	}
	if *pids > 0 {
		limits["pids"] = *pids
	}
	network := map[string]any{}
	if len(allowNet) > 0 {
		network["allow"] = []string(allowNet)
	}
	if *packages {
		network["packages"] = true
	}
	if *allNet {
		network["all"] = true
	}
	if len(denyNet) > 0 {
		network["deny"] = []string(denyNet)
	}
	if len(exceptNet) > 0 {
		network["except"] = []string(exceptNet)
	}
	need := func(n int, what string) bool {
		if len(pos) < n {
			fmt.Fprintf(os.Stderr, "vivarium sandbox %s: missing %s\n", sub, what)
			return false
		}
		return true
	}
	c := newAPIClient()
	printed := func(raw []byte, err error) int {
		if err != nil {
			return clientFail(sub, err)
		}
		os.Stdout.Write(raw)
		return 0
	}
	sb := func(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) }

	switch sub {
	case "create":
		req := map[string]any{"limits": limits, "env": envMap, "network": network}
		var mounts []map[string]string
		for _, v := range volumes {
			name, p, ok := strings.Cut(v, ":")
			if !ok || name == "" || p == "" {
				fmt.Fprintf(os.Stderr, "vivarium sandbox create: --volume %q: want NAME:PATH\n", v)
				return 2
			}
			mounts = append(mounts, map[string]string{"name": name, "path": p})
		}
		if len(mounts) > 0 {
			req["volumes"] = mounts
		}
		if *idle > 0 {
			req["timeout_s"] = idle.Seconds()
		}
		if *onTimeout != "" {
			req["on_timeout"] = *onTimeout
		}
		if *fromSnapshot != "" {
			req["from_snapshot"] = *fromSnapshot
			delete(req, "limits")
			delete(req, "env")
			delete(req, "network")
		}
		if *autoResume {
			req["auto_resume"] = true
		}
		if *pausable {
			req["pausable"] = true
		}
		var info struct{ ID string }
		raw, err := c.call("POST", "/v1/sandboxes", req, &info)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		fmt.Println(info.ID)
	case "list":
		var out struct {
			Sandboxes []struct {
				ID             string    `json:"id"`
				CreatedAt      time.Time `json:"created_at"`
				ExpiresAt      time.Time `json:"expires_at"`
				State          string    `json:"state"`
				ExecutionCount int       `json:"execution_count"`
			}
		}
		raw, err := c.call("GET", "/v1/sandboxes", nil, &out)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATE\tEXECUTIONS\tCREATED\tEXPIRES")
		for _, s := range out.Sandboxes {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", s.ID, s.State, s.ExecutionCount,
				s.CreatedAt.Local().Format(time.DateTime), s.ExpiresAt.Local().Format(time.DateTime))
		}
		tw.Flush()
	case "info":
		if !need(1, "sandbox ID") {
			return 2
		}
		return printed(c.call("GET", sb(pos[0]), nil, nil))
	case "exec", "run":
		var id string
		if sub == "exec" {
			if !need(1, "sandbox ID") {
				return 2
			}
			id, pos = pos[0], pos[1:]
		}
		src, err := codeFrom(*code, pos)
		if err != nil {
			fmt.Fprintf(os.Stderr, "vivarium sandbox %s: %v\n", sub, err)
			return 2
		}
		req := map[string]any{"code": src, "env": envMap}
		if *timeout > 0 {
			req["timeout_s"] = timeout.Seconds()
		}
		p := "/v1/execute"
		if sub == "exec" {
			p = sb(id) + "/execute"
		} else {
			req["limits"] = limits
			req["network"] = network
		}
		if *asJSON {
			return printed(c.call("POST", p, req, nil))
		}
		return c.stream(p, req)
	case "sh":
		if !need(2, "sandbox ID and COMMAND") {
			return 2
		}
		req := map[string]any{"cmd": strings.Join(pos[1:], " "), "env": envMap}
		if *timeout > 0 {
			req["timeout_s"] = timeout.Seconds()
		}
		if *asJSON {
			return printed(c.call("POST", sb(pos[0])+"/commands", req, nil))
		}
		return c.stream(sb(pos[0])+"/commands", req)
	case "term":
		if !need(1, "sandbox ID") {
			return 2
		}
		command := "command -v bash >/dev/null && exec bash -l; exec sh -l"
		if len(pos) > 1 {
			command = strings.Join(pos[1:], " ")
		}
		return c.terminal(sb(pos[0]), command)
	case "install":
		if !need(2, "sandbox ID and package NAME[==VERSION]") {
			return 2
		}
		name, version, _ := strings.Cut(pos[1], "==")
		var res struct {
			Status, Output, Error string
		}
		raw, err := c.call("POST", sb(pos[0])+"/packages", map[string]any{"name": name, "version": version}, &res)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		os.Stdout.WriteString(res.Output)
		if res.Status != "ok" {
			fmt.Fprintf(os.Stderr, "vivarium sandbox install: %s\n", res.Error)
			return 1
		}
	case "network":
		if !need(1, "sandbox ID") {
			return 2
		}
		var info struct {
			Network json.RawMessage `json:"network"`
		}
		raw, err := c.call("PUT", sb(pos[0])+"/network", network, &info)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		fmt.Printf("%s\n", info.Network)
	case "files":
		if !need(1, "sandbox ID") {
			return 2
		}
		dir := "."
		if len(pos) > 1 {
			dir = pos[1]
		}
		var out struct {
			Entries []struct {
				Path     string    `json:"path"`
				Size     int64     `json:"size"`
				Type     string    `json:"type"`
				Modified time.Time `json:"modified"`
			}
		}
		raw, err := c.call("GET", sb(pos[0])+"/files?path="+url.QueryEscape(dir), nil, &out)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		for _, e := range out.Entries {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.Type, e.Size, e.Modified.Local().Format(time.DateTime), e.Path)
		}
		tw.Flush()
	case "put":
		if !need(2, "sandbox ID and LOCAL file") {
			return 2
		}
		remote := filepath.Base(pos[1])
		if len(pos) > 2 {
			remote = pos[2]
		}
		f, err := os.Open(pos[1])
		if err != nil {
			return clientFail(sub, err)
		}
		defer f.Close()
		resp, err := c.do("PUT", sb(pos[0])+"/files/"+escapePath(remote), f, "application/octet-stream", "")
		if err != nil {
			return clientFail(sub, err)
		}
		defer resp.Body.Close()
		if *asJSON {
			io.Copy(os.Stdout, resp.Body)
		}
	case "get":
		if !need(2, "sandbox ID and REMOTE path") {
			return 2
		}
		local := path.Base(pos[1])
		if len(pos) > 2 {
			local = pos[2]
		}
		resp, err := c.do("GET", sb(pos[0])+"/files/"+escapePath(pos[1]), nil, "", "")
		if err != nil {
			return clientFail(sub, err)
		}
		defer resp.Body.Close()
		var w io.Writer = os.Stdout
		if local != "-" {
			f, err := os.OpenFile(local, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				return clientFail(sub, fmt.Errorf("%w (not overwriting an existing file)", err))
			}
			defer f.Close()
			w = f
		}
		if _, err := io.Copy(w, resp.Body); err != nil {
			return clientFail(sub, err)
		}
	case "rm":
		if !need(2, "sandbox ID and PATH") {
			return 2
		}
		_, err := c.call("DELETE", sb(pos[0])+"/files/"+escapePath(pos[1]), nil, nil)
		if err != nil {
			return clientFail(sub, err)
		}
	case "interrupt", "restart", "pause", "resume":
		if !need(1, "sandbox ID") {
			return 2
		}
		raw, err := c.call("POST", sb(pos[0])+"/"+sub, nil, nil)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
	case "fork":
		if !need(1, "sandbox ID") {
			return 2
		}
		var out struct {
			Sandboxes []struct{ ID string }
		}
		raw, err := c.call("POST", sb(pos[0])+"/fork", map[string]any{"count": *count, "same_random_state": *sameRandom}, &out)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		for _, s := range out.Sandboxes {
			fmt.Println(s.ID)
		}
	case "snapshot":
		if !need(1, "sandbox ID") {
			return 2
		}
		var out struct{ ID string }
		var body any
		if *snapName != "" {
			body = map[string]string{"name": *snapName}
		}
		raw, err := c.call("POST", sb(pos[0])+"/snapshots", body, &out)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		fmt.Println(out.ID)
	case "snapshots":
		var out struct {
			Snapshots []struct {
				ID        string    `json:"id"`
				Name      string    `json:"name"`
				SandboxID string    `json:"sandbox_id"`
				CreatedAt time.Time `json:"created_at"`
				SizeBytes int64     `json:"size_bytes"`
			}
		}
		raw, err := c.call("GET", "/v1/snapshots", nil, &out)
		if err != nil || *asJSON {
			return printed(raw, err)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SNAPSHOT\tNAME\tFROM\tCREATED\tSIZE")
		for _, x := range out.Snapshots {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d MiB\n", x.ID, cmp.Or(x.Name, "-"), x.SandboxID, x.CreatedAt.Local().Format(time.DateTime), x.SizeBytes>>20)
		}
		tw.Flush()
	case "snapshot-rm":
		if !need(1, "snapshot ID") {
			return 2
		}
		if _, err := c.call("DELETE", "/v1/snapshots/"+url.PathEscape(pos[0]), nil, nil); err != nil {
			return clientFail(sub, err)
		}
	case "snapshot-export":
		if !need(2, "snapshot ID and FILE") {
			return 2
		}
		resp, err := c.do("GET", "/v1/snapshots/"+url.PathEscape(pos[0])+"/export", nil, "", "")
		if err != nil {
			return clientFail(sub, err)
		}
		defer resp.Body.Close()
		var w io.Writer = os.Stdout
		if pos[1] != "-" {
			f, err := os.OpenFile(pos[1], os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return clientFail(sub, fmt.Errorf("%w (not overwriting an existing file)", err))
			}
			defer f.Close()
			w = f
		}
		if _, err := io.Copy(w, resp.Body); err != nil {
			return clientFail(sub, fmt.Errorf("the export ended short: %w", err))
		}
	case "snapshot-import":
		if !need(1, "FILE") {
			return 2
		}
		f, err := os.Open(pos[0])
		if err != nil {
			return clientFail(sub, err)
		}
		defer f.Close()
		resp, err := c.do("POST", "/v1/snapshots/import", f, "application/x-tar", "")
		if err != nil {
			return clientFail(sub, err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out struct{ ID string }
		if *asJSON || json.Unmarshal(raw, &out) != nil {
			os.Stdout.Write(raw)
			return 0
		}
		fmt.Println(out.ID)
	case "kill":
		if !need(1, "sandbox ID") {
			return 2
		}
		for _, id := range pos {
			if _, err := c.call("DELETE", sb(id), nil, nil); err != nil {
				return clientFail(sub, err)
			}
		}
	default:
		fmt.Fprintf(os.Stderr, "vivarium sandbox: unknown subcommand %q\n\n%s", sub, sandboxUsage)
		return 2
	}
	return 0
}

func clientFail(sub string, err error) int {
	fmt.Fprintf(os.Stderr, "vivarium sandbox %s: %v\n", sub, err)
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return 3
	}
	return 1
}

func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i, s := range parts {
		parts[i] = url.PathEscape(s)
	}
	return strings.Join(parts, "/")
}

// codeFrom reads code from -c, a file, or standard input ("-").
func codeFrom(code string, pos []string) (string, error) {
	switch {
	case code != "" && len(pos) > 0:
		return "", errors.New("give either -c CODE or a file, not both")
	case code != "":
		return code, nil
	case len(pos) == 0:
		return "", errors.New("nothing to run: give a FILE, -c CODE, or - for standard input")
	case pos[0] == "-":
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 32<<20))
		return string(b), err
	default:
		b, err := os.ReadFile(pos[0])
		return string(b), err
	}
}

// stream runs an execution or command with NDJSON streaming, printing
// output as it arrives, and returns the exit status to use.
func (c *apiClient) stream(p string, req map[string]any) int {
	body, _ := json.Marshal(req)
	resp, err := c.do("POST", p, bytes.NewReader(body), "application/json", "application/x-ndjson")
	if err != nil {
		return clientFail("exec", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev struct {
			Type   string          `json:"type"`
			Text   string          `json:"text"`
			Result sandbox.Output  `json:"result"`
			Error  json.RawMessage `json:"error"`
			// The summary of an execution or a command.
			Summary *struct {
				Status   sandbox.Status `json:"status"`
				ExitCode int            `json:"exit_code"`
				Error    any            `json:"error"`
			} `json:"summary"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			fmt.Fprintf(os.Stderr, "vivarium: malformed event from the server: %v\n", err)
			return 1
		}
		switch ev.Type {
		case "stdout":
			os.Stdout.WriteString(ev.Text)
		case "stderr":
			os.Stderr.WriteString(ev.Text)
		case "result":
			showResult(ev.Result)
		case "error":
			var e sandbox.Error
			if json.Unmarshal(ev.Error, &e) == nil && e.Traceback != "" {
				fmt.Fprint(os.Stderr, strings.TrimSuffix(e.Traceback, "\n")+"\n")
			} else if e.Name != "" {
				fmt.Fprintf(os.Stderr, "%s: %s\n", e.Name, e.Value)
			}
		case "end":
			if ev.Summary == nil {
				var e struct {
					Message string
					Status  int
				}
				json.Unmarshal(ev.Error, &e)
				return clientFail("exec", &apiError{Status: e.Status, Message: e.Message})
			}
			if s := ev.Summary.Status; s == sandbox.StatusTimeout || s == sandbox.StatusMemoryLimit || s == sandbox.StatusKilled {
				fmt.Fprintf(os.Stderr, "vivarium: %s\n", s)
			}
			return ev.Summary.ExitCode
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "vivarium: %v\n", err)
	} else {
		fmt.Fprintln(os.Stderr, "vivarium: the server ended the stream early")
	}
	return 1
}

// showResult prints a rich result the way a terminal can: its text, and
// where an image was produced, a note (images are kept with --json).
func showResult(o sandbox.Output) {
	if o.Text != "" {
		fmt.Println(o.Text)
	}
	if o.PNG != "" {
		n := base64.StdEncoding.DecodedLen(len(o.PNG))
		fmt.Fprintf(os.Stderr, "[image/png, about %s; use --json to keep it]\n", formatSize(int64(n)))
	}
}

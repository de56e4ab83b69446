package main

import (
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// recorder is a server that answers every request of `vivarium sandbox`
// as a server would in form (JSON, an NDJSON stream, a file), and keeps
// what it was asked.
type recorder struct {
	mu   sync.Mutex
	reqs []string // "METHOD PATH BODY"
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rec.mu.Lock()
	rec.reqs = append(rec.reqs, r.Method+" "+r.URL.RequestURI()+" "+string(body))
	rec.mu.Unlock()
	switch {
	case r.Header.Get("Accept") == "application/x-ndjson":
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"end","summary":{"status":"ok","exit_code":0}}`+"\n")
	case r.Method == "DELETE":
		w.WriteHeader(http.StatusNoContent)
	case r.Method == "GET" && (strings.Contains(r.URL.Path, "/files/") || strings.HasSuffix(r.URL.Path, "/export")):
		io.WriteString(w, "file contents")
	default:
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"sb_recorded"}`)
	}
}

func (rec *recorder) take() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	r := rec.reqs
	rec.reqs = nil
	return r
}

// TestSandboxSubcommandFlags runs each subcommand of `vivarium sandbox`
// against a recording server: a flag it takes reaches the request, one it
// does not take is refused (exit status 2, its own flags listed) before
// anything is sent.
func TestSandboxSubcommandFlags(t *testing.T) {
	rec := &recorder{}
	hs := httptest.NewServer(rec)
	defer hs.Close()
	srv := &server{url: hs.URL, dataDir: t.TempDir()}
	dir := t.TempDir()
	local := filepath.Join(dir, "local.txt")
	if err := os.WriteFile(local, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		sub string
		// takes is a call with a flag the subcommand takes, or its
		// arguments alone where it takes none (nil: not run here); want
		// is what its requests must hold.
		takes []string
		want  string
		// refused is a call with a flag it does not take.
		refused []string
	}{
		{"create", []string{"--memory", "1GiB", "--idle-timeout", "90s"}, `POST /v1/sandboxes {`, []string{"--count", "2"}},
		{"list", []string{"--json"}, `GET /v1/sandboxes `, []string{"--timeout", "1s"}},
		{"info", []string{"sb_1", "--json"}, `GET /v1/sandboxes/sb_1 `, []string{"sb_1", "--env", "A=b"}},
		{"exec", []string{"sb_1", "--timeout", "2s", "-c", "1"}, `POST /v1/sandboxes/sb_1/execute {"code":"1","env":{},"timeout_s":2}`, []string{"sb_1", "--memory", "1G", "-c", "1"}},
		{"run", []string{"--pids", "5", "-c", "1"}, `"limits":{"pids":5}`, []string{"--volume", "v:/mnt/v", "-c", "1"}},
		{"sh", []string{"sb_1", "--env", "A=b", "true"}, `POST /v1/sandboxes/sb_1/commands {"cmd":"true","env":{"A":"b"}}`, []string{"sb_1", "-c", "true"}},
		{"term", nil, "", []string{"sb_1", "--json"}},
		{"install", []string{"sb_1", "pkg==1.0", "--json"}, `POST /v1/sandboxes/sb_1/packages {"name":"pkg","version":"1.0"}`, []string{"sb_1", "pkg", "--memory", "1G"}},
		{"network", []string{"sb_1", "--deny-net", "10.0.0.0/8", "--all-net"}, `PUT /v1/sandboxes/sb_1/network {"all":true,"deny":["10.0.0.0/8"]}`, []string{"sb_1", "--memory", "1G"}},
		{"files", []string{"sb_1", "--json", "data"}, `GET /v1/sandboxes/sb_1/files?path=data `, []string{"sb_1", "--env", "A=b"}},
		{"put", []string{"sb_1", local, "x/y.txt", "--json"}, `PUT /v1/sandboxes/sb_1/files/x/y.txt data`, []string{"sb_1", local, "--name", "n"}},
		{"get", []string{"sb_1", "x/y.txt", "-"}, `GET /v1/sandboxes/sb_1/files/x/y.txt `, []string{"sb_1", "x/y.txt", "-", "--json"}},
		{"rm", []string{"sb_1", "x/y.txt"}, `DELETE /v1/sandboxes/sb_1/files/x/y.txt `, []string{"sb_1", "x/y.txt", "-", "--json"}},
		{"interrupt", []string{"sb_1", "--json"}, `POST /v1/sandboxes/sb_1/interrupt `, []string{"sb_1", "--timeout", "1s"}},
		{"restart", []string{"sb_1", "--json"}, `POST /v1/sandboxes/sb_1/restart `, []string{"sb_1", "--env", "A=b"}},
		{"pause", []string{"sb_1", "--json"}, `POST /v1/sandboxes/sb_1/pause `, []string{"sb_1", "--idle-timeout", "1m"}},
		{"resume", []string{"sb_1", "--json"}, `POST /v1/sandboxes/sb_1/resume `, []string{"sb_1", "--count", "2"}},
		{"fork", []string{"sb_1", "--count", "3", "--same-random"}, `POST /v1/sandboxes/sb_1/fork {"count":3,"same_random_state":true}`, []string{"sb_1", "--name", "n"}},
		{"snapshot", []string{"sb_1", "--name", "ready"}, `POST /v1/sandboxes/sb_1/snapshots {"name":"ready"}`, []string{"sb_1", "--count", "2"}},
		{"snapshots", []string{"--json"}, `GET /v1/snapshots `, []string{"--name", "n"}},
		{"snapshot-rm", []string{"snap_1"}, `DELETE /v1/snapshots/snap_1 `, []string{"snap_1", "--json"}},
		{"snapshot-export", []string{"snap_1", "-"}, `GET /v1/snapshots/snap_1/export `, []string{"snap_1", "-", "--json"}},
		{"snapshot-import", []string{local, "--json"}, `POST /v1/snapshots/import data`, []string{local, "--name", "n"}},
		{"kill", []string{"sb_1", "sb_2"}, `DELETE /v1/sandboxes/sb_2 `, []string{"sb_1", "--json"}},
	}
	tested := map[string]bool{}
	for _, c := range cases {
		tested[c.sub] = true
	}
	for _, s := range sandboxSubs {
		if !tested[s.name] {
			t.Errorf("no case for subcommand %s", s.name)
		}
	}

	for _, c := range cases {
		t.Run(c.sub, func(t *testing.T) {
			s := findSandboxSub(c.sub)
			if s == nil {
				t.Fatalf("no subcommand %s", c.sub)
			}
			var flags []string
			s.flagSet(&sandboxOpts{}).VisitAll(func(f *flag.Flag) { flags = append(flags, "-"+f.Name) })

			if c.takes != nil {
				r := srv.cliAs(t, "", "", append([]string{"sandbox", c.sub}, c.takes...)...)
				reqs := rec.take()
				if r.code != 0 {
					t.Fatalf("%v: exit status %d: %s", c.takes, r.code, r.stderr)
				}
				if !strings.Contains(strings.Join(reqs, "\n"), c.want) {
					t.Errorf("%v: the requests %q hold no %q", c.takes, reqs, c.want)
				}
			}

			r := srv.cliAs(t, "", "", append([]string{"sandbox", c.sub}, c.refused...)...)
			if reqs := rec.take(); len(reqs) > 0 {
				t.Errorf("%v: sent %q", c.refused, reqs)
			}
			if r.code != 2 || !strings.Contains(r.stderr, "vivarium sandbox "+c.sub+": "+c.sub+" takes no -") ||
				!strings.Contains(r.stderr, "Usage: vivarium sandbox "+c.sub) {
				t.Fatalf("%v: exit status %d, want 2 and a usage error: %s", c.refused, r.code, r.stderr)
			}
			if len(flags) == 0 && !strings.Contains(r.stderr, "It takes no flags.") {
				t.Errorf("%v: the usage does not say it takes no flags: %s", c.refused, r.stderr)
			}
			for _, f := range flags {
				if !strings.Contains(r.stderr, "\n  "+f+" ") && !strings.Contains(r.stderr, "\n  "+f+"\n") {
					t.Errorf("%v: the usage does not list %s: %s", c.refused, f, r.stderr)
				}
			}
		})
	}

}

// TestSandboxSubcommandHelp: -h prints the subcommand's own usage and
// flags, none of another's.
func TestSandboxSubcommandHelp(t *testing.T) {
	for _, args := range [][]string{{"sandbox", "exec", "-h"}, {"sandbox", "help", "exec"}} {
		r := vivarium(t, "", args...)
		if r.code != 0 || !strings.Contains(r.stderr, "Usage: vivarium sandbox exec ID") ||
			!strings.Contains(r.stderr, "-timeout") || strings.Contains(r.stderr, "-memory") {
			t.Errorf("%v: exit status %d: %s", args, r.code, r.stderr)
		}
	}
	r := vivarium(t, "", "sandbox", "kill", "-h")
	if r.code != 0 || !strings.Contains(r.stderr, "It takes no flags") {
		t.Errorf("kill -h: exit status %d: %s", r.code, r.stderr)
	}
	// A wrong value is a usage error too.
	r = vivarium(t, "", "sandbox", "create", "--memory", "lots")
	if r.code != 2 || !strings.Contains(r.stderr, "invalid size") || !strings.Contains(r.stderr, "Usage: vivarium sandbox create") {
		t.Errorf("create --memory lots: exit status %d: %s", r.code, r.stderr)
	}
}

// TestDocsSandboxFlags checks the table of `vivarium sandbox`'s flags in
// the docs against the flag sets: every flag there, with exactly the
// subcommands that take it, and the subcommands that take none.
func TestDocsSandboxFlags(t *testing.T) {
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		if filepath.Dir(root) == root {
			t.Fatal("no go.mod above the test's directory")
		}
		root = filepath.Dir(root)
	}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	const marker = "`vivarium sandbox SUBCOMMAND -h`"
	var text, where string
	for _, p := range docs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if i := strings.Index(string(b), marker); i >= 0 {
			text, where = string(b[i:]), filepath.Base(p)
			break
		}
	}
	if text == "" {
		t.Fatalf("no docs/*.md says %s with the table of its flags", marker)
	}
	ticked := func(s string) []string {
		var out []string
		parts := strings.Split(s, "`")
		for i := 1; i < len(parts); i += 2 {
			out = append(out, strings.Fields(parts[i])[0])
		}
		return out
	}

	// The paragraph: "Subcommands that take none: `term`, ... ."
	para, table, _ := strings.Cut(text, "\n\n")
	_, none, ok := strings.Cut(para, "take none:")
	if !ok {
		t.Fatalf("%s: the paragraph with %s does not list the subcommands that take no flags", where, marker)
	}
	want := map[string]bool{}
	for _, s := range sandboxSubs {
		if len(takenByFlags(s.name)) == 0 {
			want[s.name] = true
		}
	}
	for _, name := range ticked(none) {
		if !want[name] {
			t.Errorf("%s says %s takes no flags; it takes %v", where, name, takenByFlags(name))
		}
		delete(want, name)
	}
	for name := range want {
		t.Errorf("%s does not say that %s takes no flags", where, name)
	}

	documented := map[string]bool{}
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "/"), "|")
		if len(cells) < 4 || !strings.Contains(cells[1], "`") {
			continue // the header and its rule
		}
		subs := ticked(cells[2])
		slices.Sort(subs)
		for _, f := range ticked(cells[1]) {
			name := strings.TrimLeft(f, "-")
			documented[name] = true
			if got := slices.Sorted(slices.Values(takenBy(name))); !slices.Equal(got, subs) {
				t.Errorf("%s: %s is taken by %s, not %s", where, f, got, subs)
			}
		}
	}
	for _, s := range sandboxSubs {
		for _, name := range takenByFlags(s.name) {
			if !documented[name] {
				t.Errorf("%s: the table of vivarium sandbox's flags has no --%s (%s takes it)", where, name, s.name)
			}
		}
	}
}

// takenByFlags lists the flags subcommand name takes.
func takenByFlags(name string) []string {
	var names []string
	if s := findSandboxSub(name); s != nil {
		s.flagSet(&sandboxOpts{}).VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	}
	return names
}

package main

import (
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
// and `vivarium volume` as a server would in form (JSON, an NDJSON
// stream, a file), and keeps what it was asked.
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

// subcommandCase is a run of one subcommand of a command.
type subcommandCase struct {
	sub string
	// takes is a call with a flag the subcommand takes, or its
	// arguments alone where it takes none (nil: not run here); want
	// is what its requests must hold.
	takes []string
	want  string
	// refused is a call with a flag it does not take.
	refused []string
}

// testSubcommandFlags runs each case against a recording server: a flag
// the subcommand takes reaches the request, one it does not take is
// refused (exit status 2, its own flags listed) before anything is sent.
// Every subcommand of c must have a case.
func testSubcommandFlags[O any](t *testing.T, c *subcommands[O], cases []subcommandCase) {
	t.Helper()
	rec := &recorder{}
	hs := httptest.NewServer(rec)
	defer hs.Close()
	srv := &server{url: hs.URL, dataDir: t.TempDir()}
	tested := map[string]bool{}
	for _, sc := range cases {
		tested[sc.sub] = true
	}
	for _, s := range c.subs {
		if !tested[s.name] {
			t.Errorf("no case for subcommand %s", s.name)
		}
	}

	for _, sc := range cases {
		t.Run(sc.sub, func(t *testing.T) {
			if c.find(sc.sub) == nil {
				t.Fatalf("no subcommand %s", sc.sub)
			}
			var flags []string
			for _, f := range c.flagsOf(sc.sub) {
				flags = append(flags, "-"+f)
			}

			if sc.takes != nil {
				r := srv.cliAs(t, "", "", append([]string{c.cmd, sc.sub}, sc.takes...)...)
				reqs := rec.take()
				if r.code != 0 {
					t.Fatalf("%v: exit status %d: %s", sc.takes, r.code, r.stderr)
				}
				if !strings.Contains(strings.Join(reqs, "\n"), sc.want) {
					t.Errorf("%v: the requests %q hold no %q", sc.takes, reqs, sc.want)
				}
			}

			r := srv.cliAs(t, "", "", append([]string{c.cmd, sc.sub}, sc.refused...)...)
			if reqs := rec.take(); len(reqs) > 0 {
				t.Errorf("%v: sent %q", sc.refused, reqs)
			}
			if r.code != 2 || !strings.Contains(r.stderr, "vivarium "+c.cmd+" "+sc.sub+": "+sc.sub+" takes no -") ||
				!strings.Contains(r.stderr, "Usage: vivarium "+c.cmd+" "+sc.sub) {
				t.Fatalf("%v: exit status %d, want 2 and a usage error: %s", sc.refused, r.code, r.stderr)
			}
			if len(flags) == 0 && !strings.Contains(r.stderr, "It takes no flags.") {
				t.Errorf("%v: the usage does not say it takes no flags: %s", sc.refused, r.stderr)
			}
			for _, f := range flags {
				if !strings.Contains(r.stderr, "\n  "+f+" ") && !strings.Contains(r.stderr, "\n  "+f+"\n") {
					t.Errorf("%v: the usage does not list %s: %s", sc.refused, f, r.stderr)
				}
			}
		})
	}
}

// names are the subcommands' names and aliases.
func (c *subcommands[O]) names() []string {
	var names []string
	for _, s := range c.subs {
		names = append(names, s.name)
	}
	for alias := range c.aliases {
		names = append(names, alias)
	}
	return names
}

// testDocsSubcommandFlags checks the table of `vivarium CMD`'s flags in
// the docs, after the paragraph that names `vivarium CMD SUBCOMMAND -h`,
// against the flag sets: every flag there, with exactly the subcommands
// that take it, and the subcommands that take none.
func testDocsSubcommandFlags[O any](t *testing.T, c *subcommands[O]) {
	t.Helper()
	docs, _ := filepath.Glob(filepath.Join(moduleRoot(t), "docs", "*.md"))
	marker := "`vivarium " + c.cmd + " SUBCOMMAND -h`"
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
	want := map[string]bool{}
	for _, s := range c.subs {
		if len(c.flagsOf(s.name)) == 0 {
			want[s.name] = true
		}
	}
	_, none, ok := strings.Cut(para, "take none:")
	if !ok && len(want) > 0 {
		t.Fatalf("%s: the paragraph with %s does not list the subcommands that take no flags", where, marker)
	}
	for _, name := range ticked(none) {
		if !want[name] {
			t.Errorf("%s says %s takes no flags; it takes %v", where, name, c.flagsOf(name))
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
			if got := slices.Sorted(slices.Values(c.takenBy(name))); !slices.Equal(got, subs) {
				t.Errorf("%s: %s is taken by %s, not %s", where, f, got, subs)
			}
		}
	}
	for _, s := range c.subs {
		for _, name := range c.flagsOf(s.name) {
			if !documented[name] {
				t.Errorf("%s: the table of vivarium %s's flags has no --%s (%s takes it)", where, c.cmd, name, s.name)
			}
		}
	}
}

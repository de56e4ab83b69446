package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/mcp"
)

// The docs checks (`make check-docs`: go test -short -run '^TestDocs'
// ./...) hold the manual to the code where a machine can tell: every
// flag the docs name exists in the flag set of the command they name it
// for, every MCP tool the server registers is in docs/mcp.md and counted
// right in the README, and every relative link leads to a page and a
// heading that exist. They need no root: the commands' flag sets are
// read from their -h, the tools from a session with the MCP server.

// docPages are the pages the checks read: the README, the security
// policy and the manual. docs/notes/ is left out: it is a dated record of
// how things were, and names flags as they were then.
func docPages(t *testing.T) []string {
	t.Helper()
	root := moduleRoot(t)
	pages := []string{filepath.Join(root, "README.md"), filepath.Join(root, "SECURITY.md")}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(more) == 0 {
		t.Fatalf("no docs/*.md under %s (%v)", root, err)
	}
	return append(pages, more...)
}

// moduleRoot is the directory of go.mod above the test's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// flagExceptions are flags the docs name that are not vivarium's, with
// whose they are. They excuse a flag only where the docs do not name it
// in a vivarium command line (`vivarium serve --x` must be serve's).
var flagExceptions = map[string]string{
	"--network":                          "runsc's (gVisor): --network=none, how gVisor sandboxes are started",
	"--iptables":                         "dockerd's: the tests' daemon runs without iptables",
	"--bridge":                           "dockerd's: the tests' daemon runs without a bridge",
	"--ip-masq":                          "dockerd's, in the benchmarks' daemon command",
	"--ip-forward":                       "dockerd's, in the benchmarks' daemon command",
	"--unshare-all":                      "bubblewrap's, the benchmark's peer",
	"--die-with-parent":                  "bubblewrap's, the benchmark's peer",
	"--new-session":                      "bubblewrap's, the benchmark's peer",
	"--proc":                             "bubblewrap's, the benchmark's peer",
	"--dev":                              "bubblewrap's --dev /dev in the benchmark's peer (vivarium serve --dev is checked where a command is named)",
	"--tmpfs":                            "bubblewrap's, the benchmark's peer",
	"--expose-internals":                 "node's: how the JavaScript kernel runs",
	"--user":                             "nsenter's: the restore's budgets are written with nsenter --user",
	"--empty-ns":                         "criu's: the network namespace is not saved",
	"--leave-running":                    "criu's: a fork's or snapshot's dump leaves the sandbox running",
	"--tree":                             "criu's",
	"--external":                         "criu's",
	"--restore-sibling":                  "criu's",
	"--root":                             "criu's",
	"--cgroup-root":                      "criu's",
	"--cgroup-dump-controller":           "criu's: a dump saves only the sandbox's own cgroup hierarchies",
	"--tcp-established":                  "criu's: established connections make a dump fail",
	"--inherit-fd":                       "criu's",
	"--bind-address":                     "kube-apiserver's, started by the Kubernetes test harness",
	"--advertise-address":                "kube-apiserver's",
	"--secure-port":                      "kube-apiserver's and the controllers'",
	"--cert-dir":                         "kube-apiserver's",
	"--token-auth-file":                  "kube-apiserver's",
	"--authorization-mode":               "kube-apiserver's",
	"--service-account-issuer":           "kube-apiserver's",
	"--api-audiences":                    "kube-apiserver's",
	"--service-account-signing-key-file": "kube-apiserver's",
	"--service-account-key-file":         "kube-apiserver's",
	"--service-cluster-ip-range":         "kube-apiserver's",
	"--allow-privileged":                 "kube-apiserver's",
	"--profiling":                        "kube-apiserver's",
	"--endpoint-reconciler-type":         "kube-apiserver's",
	"--root-ca-file":                     "kube-controller-manager's",
	"--root-dir":                         "the kubelet's",
	"--pod-infra-container-image":        "the kubelet's",
	"--rm":                               "docker run's, the benchmark's peer",
	"--variant":                          "debootstrap's: the node image is built with --variant=minbase",
	"--url":                              "scripts/soak.py's",
	"--seconds":                          "scripts/soak.py's",
	"--workers":                          "scripts/soak.py's",
	"--pid":                              "scripts/soak.py's",
	"--pause":                            "scripts/soak.py's",
	"--volumes":                          "scripts/soak.py's",
	"--trace":                            "scripts/soak.py's",
	"--now":                              "systemctl's: systemctl enable --now vivarium",
	"--no-audit":                         "npm's",
	"--no-fund":                          "npm's",
	"--loglevel":                         "npm's",
	"--tls":                              "scripts/registry.sh's",
	"--auth":                             "scripts/registry.sh's",
}

// pageCommands are the commands a page is about: a flag named outside a
// vivarium command line (a table of serve's flags) must be one of theirs
// or of a command its paragraph names. Pages not listed take every
// command.
var pageCommands = map[string][]string{
	"api.md":        {"serve", "sandbox", "volume"},
	"backends.md":   {"run", "serve", "doctor", "image build"},
	"e2b.md":        {"serve"},
	"kubernetes.md": {"serve", "gateway", "keys"},
	"mcp.md":        {"mcp", "serve"},
	"network.md":    {"serve", "run", "sandbox"},
	"operations.md": {"serve", "keys", "audit", "doctor"},
	"ports.md":      {"serve"},
	"python.md":     {"serve"},
	"run.md":        {"run"},
	"security.md":   {"serve", "run", "mcp"},
	"snapshots.md":  {"serve", "sandbox"},
	"templates.md":  {"image", "template", "run", "serve"},
	"benchmarks.md": {"bench", "serve", "template"},
}

// commandFlags finds the flags of a vivarium command as the command
// itself defines them: serve, run and mcp from their flag functions, the
// others from the flag list their -h prints.
type commandFlags struct {
	t     *testing.T
	cache map[string]map[string]bool
}

func (c *commandFlags) of(cmd string) map[string]bool {
	if fl, ok := c.cache[cmd]; ok {
		return fl
	}
	fl := map[string]bool{}
	var fs *flag.FlagSet
	switch cmd {
	case "serve":
		fs = serveFlags(&serveConfig{})
	case "run":
		fs = runFlags(&runOptions{})
	case "mcp":
		fs = mcpFlags(&mcpConfig{})
	case "sandbox", "volume", "image", "template":
		// Named without a subcommand: any of them.
		for _, sub := range subcommandNames(cmd) {
			for f := range c.of(cmd + " " + sub) {
				fl[f] = true
			}
		}
	case "keys":
		// One flag set for every subcommand; the bare command prints
		// only its usage.
		fl = helpFlags(c.t, cmd, "create")
	default:
		fl = helpFlags(c.t, strings.Fields(cmd)...)
	}
	if fs != nil {
		fs.VisitAll(func(f *flag.Flag) { fl["--"+f.Name] = true })
	}
	c.cache[cmd] = fl
	return fl
}

// subcommandNames are the subcommands (and their aliases) of cmd, if
// its flags differ by subcommand.
func subcommandNames(cmd string) []string {
	switch cmd {
	case "sandbox":
		return sandboxCmd.names()
	case "volume":
		return volumeCmd.names()
	case "image":
		return imageSubcommands
	case "template":
		return templateSubcommands
	}
	return nil
}

// helpFlag is a flag line of flag.PrintDefaults: two spaces, the flag.
var helpFlag = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9-]*)\b`)

// helpFlags runs `vivarium ARGS -h` and reads the flags it lists (none,
// for a command without flags).
func helpFlags(t *testing.T, args ...string) map[string]bool {
	t.Helper()
	r := vivarium(t, "", append(args, "-h")...)
	fl := map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(r.stdout+r.stderr, -1) {
		fl["--"+m[1]] = true
	}
	return fl
}

// commandRef finds "vivarium CMD" (with the subcommand of those whose
// flags differ by subcommand) in docs.
var commandRef = regexp.MustCompile(`(?:^|[^A-Za-z0-9_.-])vivarium (run|serve|gateway|mcp|keys|audit|sandbox|sb|volumes?|doctor|bench|image|template)\b(?: ([a-z][a-z-]*))?`)

// flagRef is a flag in docs: two dashes and a name, not part of a word.
var flagRef = regexp.MustCompile(`(?:^|[^A-Za-z0-9_-])(--[a-z][a-z0-9]*(?:-[a-z0-9]+)*)`)

// commandName turns a reference's command and next word into the key of
// its flag set.
func commandName(cmd, next string) string {
	switch cmd {
	case "sb":
		cmd = "sandbox"
	case "volumes":
		cmd = "volume"
	}
	switch cmd {
	case "sandbox", "volume", "image", "template":
		if slices.Contains(subcommandNames(cmd), next) {
			return cmd + " " + next
		}
	}
	return cmd
}

// docBlock is a unit of a page within which a flag is read as belonging
// to a command the block names: a paragraph, a list item, a table row, or
// one command line of a code block.
type docBlock struct {
	line int
	text string
	code bool
}

// docBlocks splits a markdown page into blocks.
func docBlocks(text string) []docBlock {
	var blocks []docBlock
	var cur *docBlock
	flush := func() {
		if cur != nil && strings.TrimSpace(cur.text) != "" {
			blocks = append(blocks, *cur)
		}
		cur = nil
	}
	inCode := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			flush()
			inCode = !inCode
		case inCode:
			// A command line, with its continuation lines.
			if cur == nil {
				cur = &docBlock{line: n, code: true}
			}
			cur.text += strings.TrimSuffix(line, `\`) + " "
			if !strings.HasSuffix(trimmed, `\`) {
				flush()
			}
		case trimmed == "":
			flush()
		case strings.HasPrefix(trimmed, "|"), strings.HasPrefix(trimmed, "#"):
			flush()
			blocks = append(blocks, docBlock{line: n, text: line})
		case strings.HasPrefix(trimmed, "- "), strings.HasPrefix(trimmed, "* "), numbered.MatchString(trimmed):
			flush()
			cur = &docBlock{line: n, text: line + " "}
		default:
			if cur == nil {
				cur = &docBlock{line: n}
			}
			cur.text += line + " "
		}
	}
	flush()
	return blocks
}

var (
	codeSpan   = regexp.MustCompile("`[^`]*`")
	commandEnd = regexp.MustCompile(`\||;|&&|\s#|\$\(`)
	numbered   = regexp.MustCompile(`^\d+\. `)
)

// strictSpans are the parts of a block that are one vivarium command
// line: a code block's line, or an inline code span, from "vivarium CMD"
// to the end of that command (a pipe, a ;, && or a comment ends it).
// Each flag in such a span is that command's, without exception.
func strictSpans(b docBlock) [][3]int {
	var pieces [][2]int
	if b.code {
		pieces = append(pieces, [2]int{0, len(b.text)})
	} else {
		for _, m := range codeSpan.FindAllStringIndex(b.text, -1) {
			pieces = append(pieces, [2]int{m[0], m[1]})
		}
	}
	var spans [][3]int // start, end, index of the command match
	for _, p := range pieces {
		seg := b.text[p[0]:p[1]]
		refs := commandRef.FindAllStringSubmatchIndex(seg, -1)
		for i, r := range refs {
			start := p[0] + r[2]
			end := p[1]
			if i+1 < len(refs) {
				end = p[0] + refs[i+1][0]
			}
			if stop := commandEnd.FindStringIndex(b.text[start:end]); stop != nil {
				end = start + stop[0]
			}
			spans = append(spans, [3]int{start, end, p[0] + r[0]})
		}
	}
	return spans
}

// TestDocsFlags checks that every --flag the docs name exists in the flag
// set of the vivarium command they name it for: the command of the
// vivarium command line it is on, else one of the commands the
// paragraph, list item or table row names or the page is about.
func TestDocsFlags(t *testing.T) {
	cf := &commandFlags{t: t, cache: map[string]map[string]bool{}}
	all := []string{"run", "serve", "gateway", "mcp", "keys", "audit", "volume", "doctor", "bench", "image", "template"}
	var problems []string
	checked := 0
	for _, page := range docPages(t) {
		raw, err := os.ReadFile(page)
		if os.IsNotExist(err) {
			problems = append(problems, fmt.Sprintf("%s is missing", filepath.Base(page)))
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(moduleRoot(t), page)
		for _, b := range docBlocks(string(raw)) {
			spans := strictSpans(b)
			var named []string
			for _, m := range commandRef.FindAllStringSubmatch(b.text, -1) {
				named = append(named, commandName(m[1], m[2]))
			}
			for _, m := range flagRef.FindAllStringSubmatchIndex(b.text, -1) {
				name := b.text[m[2]:m[3]]
				if rest := b.text[m[3]:]; strings.HasPrefix(rest, "*") || strings.HasPrefix(rest, "-*") {
					continue // a pattern of flags (--io-*), not a flag
				}
				checked++
				where := fmt.Sprintf("%s:%d", rel, b.line)
				strict := ""
				for _, s := range spans {
					if m[2] >= s[0] && m[2] < s[1] {
						r := commandRef.FindStringSubmatch(b.text[s[2]:s[1]])
						strict = commandName(r[1], r[2])
					}
				}
				if strict != "" {
					if !cf.of(strict)[name] {
						problems = append(problems, fmt.Sprintf("%s: `vivarium %s %s`: %s has no such flag%s",
							where, strict, name, strict, elsewhere(cf, all, name)))
					}
					continue
				}
				if b.code {
					continue // another program's command line: its flags are its own
				}
				page := pageCommands[filepath.Base(page)]
				if page == nil {
					page = all
				}
				cands := append(slices.Clone(named), page...)
				ok := false
				for _, c := range cands {
					if cf.of(c)[name] {
						ok = true
					}
				}
				if !ok && flagExceptions[name] != "" {
					continue
				}
				if !ok {
					problems = append(problems, fmt.Sprintf("%s: %s, named for %s, is a flag of none of them%s",
						where, name, strings.Join(dedupe(cands), ", "), elsewhere(cf, all, name)))
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no flag found in the docs: the check reads nothing")
	}
	for _, p := range problems {
		t.Error(p)
	}
}

// elsewhere says which commands do have the flag.
func elsewhere(cf *commandFlags, all []string, name string) string {
	var have []string
	for _, c := range all {
		if cf.of(c)[name] {
			have = append(have, c)
		}
	}
	if len(have) == 0 {
		return " (no vivarium command has it)"
	}
	return " (it is a flag of " + strings.Join(have, ", ") + ")"
}

func dedupe(s []string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return slices.Compact(s)
}

// TestDocsMCPTools checks that docs/mcp.md's table of tools lists exactly
// the tools the MCP server registers, and that the README counts them
// right.
func TestDocsMCPTools(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	serverT, clientT := sdk.NewInMemoryTransports()
	done := make(chan error, 1)
	go func() { done <- mcp.ServeTransport(ctx, mcp.Config{}, "docs", serverT) }()
	client := sdk.NewClient(&sdk.Implementation{Name: "docs-check", Version: "1"}, nil)
	cs, err := client.Connect(ctx, clientT, nil)
	if err != nil {
		t.Fatal(err)
	}
	var registered []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		registered = append(registered, tool.Name)
	}
	cs.Close()
	if err := <-done; err != nil {
		t.Fatalf("the MCP server: %v", err)
	}
	if len(registered) == 0 {
		t.Fatal("the MCP server registers no tool")
	}

	root := moduleRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "docs", "mcp.md"))
	if err != nil {
		t.Fatal(err)
	}
	// The table's rows: | `tool`, `tool` | arguments | what it does |
	listed := map[string]bool{}
	cell := regexp.MustCompile("`([a-z_]+)`")
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(line[1:], "|", 2)[0]
		for _, m := range cell.FindAllStringSubmatch(first, -1) {
			listed[m[1]] = true
		}
	}
	for _, name := range registered {
		if !listed[name] {
			t.Errorf("docs/mcp.md: the tool %s is registered but not in the table of tools", name)
		}
		delete(listed, name)
	}
	for name := range listed {
		t.Errorf("docs/mcp.md: the table lists %s, which the server does not register", name)
	}

	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	counts := regexp.MustCompile(`(\d+) (?:MCP )?tools`).FindAllStringSubmatch(string(readme), -1)
	if len(counts) == 0 {
		t.Errorf("README.md: no count of the MCP tools (\"%d tools\")", len(registered))
	}
	for _, m := range counts {
		if n, _ := strconv.Atoi(m[1]); n != len(registered) {
			t.Errorf("README.md says %q; the server registers %d tools", m[0], len(registered))
		}
	}
}

// mdLink is a markdown link or image: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinks checks that every relative link of the README, the
// security policy, the manual and its notes leads to a file that exists
// and, for a page's #anchor, to one of its headings.
func TestDocsLinks(t *testing.T) {
	root := moduleRoot(t)
	pages := docPages(t)
	notes, _ := filepath.Glob(filepath.Join(root, "docs", "notes", "*.md"))
	pages = append(pages, notes...)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		a := map[string]bool{}
		if raw, err := os.ReadFile(page); err == nil {
			a = headingAnchors(string(raw))
		}
		anchors[page] = a
		return a
	}
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			continue // TestDocsFlags names a missing page
		}
		rel, _ := filepath.Rel(root, page)
		inCode := false
		for n, line := range strings.Split(string(raw), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inCode = !inCode
			}
			if inCode {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				dest := page
				if file != "" {
					dest = filepath.Join(filepath.Dir(page), file)
				}
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: link to %s: no such file", rel, n+1, target)
					continue
				}
				if anchor != "" && strings.HasSuffix(dest, ".md") && !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: link to %s: no heading with that anchor", rel, n+1, target)
				}
			}
		}
	}
}

// headingAnchors are the anchors GitHub gives a page's headings: lower
// case, punctuation but '-' and '_' dropped, spaces as '-', a repeated
// one numbered.
func headingAnchors(text string) map[string]bool {
	a := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if k := seen[slug]; k > 0 {
			a[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			a[slug] = true
		}
		seen[slug]++
	}
	return a
}

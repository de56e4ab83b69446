package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// subcommands is a command made of subcommands that use a running server
// (`vivarium sandbox`, `vivarium volume`), each with flags of its own: a
// flag another subcommand takes is refused, not ignored. O holds the
// values of every flag of the command; each subcommand registers only
// those it uses.
type subcommands[O any] struct {
	cmd   string // "sandbox": what follows "vivarium"
	intro string // what the command is for, after its usage line
	// aliases are other names of subcommands ("list" for "ls").
	aliases map[string]string
	subs    []subcommand[O] // in the order the usage lists them
}

// jsonUsage is the usage of --json, the flag of the subcommands that
// print an answer of the server.
const jsonUsage = "print the server's JSON answer as it is"

// subcommand is one subcommand: its own flags, and what it does with them.
type subcommand[O any] struct {
	name  string
	args  string // what follows the name in its usage
	about string // what it does; later lines continue the first
	flags []func(*O, *flag.FlagSet)
	run   func(*subcall[O]) int
}

// usage is the overview `vivarium CMD -h` prints.
func (c *subcommands[O]) usage() string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: vivarium %s SUBCOMMAND [flags] ...\n\n%s\n\n", c.cmd, c.intro)
	for _, s := range c.subs {
		head := strings.TrimSpace(s.name + " " + s.args)
		lines := strings.Split(s.about, "\n")
		if len(head) > 36 {
			fmt.Fprintf(&b, "  %s\n", head)
		} else {
			fmt.Fprintf(&b, "  %-36s  %s\n", head, lines[0])
			lines = lines[1:]
		}
		for _, l := range lines {
			fmt.Fprintf(&b, "  %-36s  %s\n", "", l)
		}
	}
	fmt.Fprintf(&b, `
Each subcommand takes its own flags, which "vivarium %s SUBCOMMAND -h"
lists; those that print an answer of the server take --json to print it
as it is.
`, c.cmd)
	return b.String()
}

// find is the subcommand called name (or one of its aliases), or nil.
func (c *subcommands[O]) find(name string) *subcommand[O] {
	if to, ok := c.aliases[name]; ok {
		name = to
	}
	for i := range c.subs {
		if c.subs[i].name == name {
			return &c.subs[i]
		}
	}
	return nil
}

// flagSet is subcommand s's flags, registered into o.
func (c *subcommands[O]) flagSet(s *subcommand[O], o *O) *flag.FlagSet {
	fs := flag.NewFlagSet(c.cmd+" "+s.name, flag.ContinueOnError)
	for _, register := range s.flags {
		register(o, fs)
	}
	// main says what was wrong, then prints the usage itself.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// flagsOf lists the flags subcommand name takes (none for an unknown one).
func (c *subcommands[O]) flagsOf(name string) []string {
	var names []string
	if s := c.find(name); s != nil {
		c.flagSet(s, new(O)).VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	}
	return names
}

// takenBy lists the subcommands that take flag name.
func (c *subcommands[O]) takenBy(name string) []string {
	var subs []string
	for i := range c.subs {
		if c.flagSet(&c.subs[i], new(O)).Lookup(name) != nil {
			subs = append(subs, c.subs[i].name)
		}
	}
	return subs
}

// subUsage is subcommand s's usage: what it takes and its flags (fs).
func (c *subcommands[O]) subUsage(s *subcommand[O], fs *flag.FlagSet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Usage: vivarium %s %s\n\n%s.\n", c.cmd, strings.TrimSpace(s.name+" "+s.args),
		strings.ReplaceAll(s.about, "\n", " "))
	has := false
	fs.VisitAll(func(*flag.Flag) { has = true })
	if !has {
		b.WriteString("\nIt takes no flags.\n")
		return b.String()
	}
	b.WriteString("\nFlags:\n")
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	return b.String()
}

// main runs `vivarium CMD args...` and returns its exit status: 2 for a
// mistake in the command line, said before anything is sent.
func (c *subcommands[O]) main(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, c.usage())
		return 2
	}
	switch args[0] {
	case "-h", "--help", "help":
		if len(args) > 1 {
			if s := c.find(args[1]); s != nil {
				fmt.Fprint(os.Stderr, c.subUsage(s, c.flagSet(s, new(O))))
				return 0
			}
		}
		fmt.Fprint(os.Stderr, c.usage())
		return 0
	}
	s := c.find(args[0])
	if s == nil {
		fmt.Fprintf(os.Stderr, "vivarium %s: unknown subcommand %q\n\n%s", c.cmd, args[0], c.usage())
		return 2
	}
	o := new(O)
	fs := c.flagSet(s, o)
	pos, err := parseInterleaved(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(os.Stderr, c.subUsage(s, fs))
		return 0
	}
	if err != nil {
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
			name = strings.TrimLeft(name, "-")
			dashes := "--"
			if len(name) == 1 {
				dashes = "-"
			}
			msg = fmt.Sprintf("%s takes no %s%s", s.name, dashes, name)
			// Say where it belongs, when that is a few subcommands.
			switch subs := c.takenBy(name); {
			case len(subs) == 1:
				msg += " (" + subs[0] + " takes it)"
			case len(subs) > 1 && len(subs) <= 4:
				msg += " (" + strings.Join(subs[:len(subs)-1], ", ") + " and " + subs[len(subs)-1] + " take it)"
			}
		}
		fmt.Fprintf(os.Stderr, "vivarium %s %s: %s\n\n%s", c.cmd, s.name, msg, c.subUsage(s, fs))
		return 2
	}
	return s.run(&subcall[O]{cmd: c.cmd, sub: s.name, o: o, pos: pos, c: newAPIClient()})
}

// subcall is one run of a subcommand.
type subcall[O any] struct {
	cmd, sub string // "sandbox", "exec"
	o        *O
	pos      []string // the arguments but the flags
	c        *apiClient
}

// what names the subcommand in messages: "sandbox exec".
func (x *subcall[O]) what() string { return x.cmd + " " + x.sub }

// need says whether there are n arguments, and what is missing if not.
func (x *subcall[O]) need(n int, what string) bool {
	if len(x.pos) < n {
		fmt.Fprintf(os.Stderr, "vivarium %s: missing %s\n", x.what(), what)
		return false
	}
	return true
}

// usageError reports a mistake in the command line: exit status 2.
func (x *subcall[O]) usageError(err error) int {
	fmt.Fprintf(os.Stderr, "vivarium %s: %v\n", x.what(), err)
	return 2
}

func (x *subcall[O]) fail(err error) int { return clientFail(x.what(), err) }

// printed prints the server's answer as it is.
func (x *subcall[O]) printed(raw []byte, err error) int {
	if err != nil {
		return x.fail(err)
	}
	os.Stdout.Write(raw)
	return 0
}

// save copies r to the new file local ("-": standard output), never over
// an existing file.
func (x *subcall[O]) save(r io.Reader, local string, perm os.FileMode, short string) int {
	var w io.Writer = os.Stdout
	if local != "-" {
		f, err := os.OpenFile(local, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if err != nil {
			return x.fail(fmt.Errorf("%w (not overwriting an existing file)", err))
		}
		defer f.Close()
		w = f
	}
	if _, err := io.Copy(w, r); err != nil {
		return x.fail(fmt.Errorf("%s: %w", short, err))
	}
	return 0
}

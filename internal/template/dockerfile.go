package template

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"regexp"
	"strings"
)

// maxDockerfile bounds a Dockerfile.
const maxDockerfile = 1 << 20

// ParseDockerfile reads a Dockerfile into a build. buildArgs are the
// values given for its ARGs (`--build-arg K=V`); one that no ARG
// declares is refused. It takes a single stage: FROM (an image), RUN,
// COPY and ADD (files of the build, never a URL), ENV, ARG, WORKDIR,
// USER, LABEL, and CMD and ENTRYPOINT as the start command. EXPOSE,
// VOLUME, MAINTAINER, STOPSIGNAL and HEALTHCHECK change nothing of a
// sandbox: they are left out, and notes says so. Anything else (a second
// FROM, SHELL, ONBUILD, RUN --mount, heredocs) is refused with an error
// that names it and its line.
func ParseDockerfile(r io.Reader, buildArgs map[string]string) (spec Spec, notes []string, err error) {
	data, err := io.ReadAll(io.LimitReader(r, maxDockerfile+1))
	if err != nil {
		return Spec{}, nil, err
	}
	if len(data) > maxDockerfile {
		return Spec{}, nil, fmt.Errorf("%w: the Dockerfile is larger than 1 MiB", ErrInvalid)
	}
	p := &dockerfile{args: map[string]string{}, env: map[string]string{}, workdir: "/", given: buildArgs,
		declared: map[string]bool{}}
	lines, err := logicalLines(string(data), &p.escape)
	if err != nil {
		return Spec{}, nil, err
	}
	for _, l := range lines {
		if err := p.instruction(l); err != nil {
			return Spec{}, nil, fmt.Errorf("%w: line %d: %v", ErrInvalid, l.n, err)
		}
	}
	if p.spec.FromImage == "" {
		return Spec{}, nil, fmt.Errorf("%w: the Dockerfile has no FROM", ErrInvalid)
	}
	for k := range buildArgs {
		if !p.declared[k] {
			return Spec{}, nil, fmt.Errorf("%w: --build-arg %s: the Dockerfile declares no ARG %s", ErrInvalid, k, k)
		}
	}
	p.spec.StartCmd = p.startCmd()
	return p.spec, p.notes, nil
}

// line is one instruction, its continuation lines joined.
type line struct {
	n    int // the line it starts on
	text string
}

var directive = regexp.MustCompile(`^#\s*([a-zA-Z]+)\s*=\s*(\S+)\s*$`)

// logicalLines splits a Dockerfile into instructions: parser directives
// (escape) at the top are read, comments and blank lines dropped, a line
// ending in the escape character continued by the next.
func logicalLines(src string, escape *byte) ([]line, error) {
	*escape = '\\'
	var out []line
	var cur *line
	directives := true
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(make([]byte, 64<<10), maxDockerfile)
	for n := 1; sc.Scan(); n++ {
		raw := sc.Text()
		trimmed := strings.TrimSpace(raw)
		if directives {
			if m := directive.FindStringSubmatch(trimmed); m != nil {
				if strings.EqualFold(m[1], "escape") {
					if m[2] != "\\" && m[2] != "`" {
						return nil, fmt.Errorf("%w: line %d: the escape directive takes \\ or `", ErrInvalid, n)
					}
					*escape = m[2][0]
				}
				continue
			}
			directives = false
		}
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue // comments go, inside a continuation too
		}
		text := strings.TrimRight(raw, " \t")
		cont := strings.HasSuffix(text, string(*escape))
		if cont {
			text = text[:len(text)-1]
		}
		if cur == nil {
			out = append(out, line{n: n})
			cur = &out[len(out)-1]
			text = strings.TrimLeft(text, " \t")
		}
		cur.text += text
		if !cont {
			cur = nil
		}
	}
	return out, sc.Err()
}

// dockerfile is the state of a Dockerfile being read.
type dockerfile struct {
	spec     Spec
	notes    []string
	escape   byte
	given    map[string]string // --build-arg
	declared map[string]bool   // ARGs declared anywhere
	global   map[string]string // ARGs before FROM
	args     map[string]string // ARGs of the stage
	argOrder []string
	env      map[string]string
	workdir  string
	ep, cmd  []string // ENTRYPOINT, CMD as an exec form
	epShell  bool     // ENTRYPOINT in shell form: CMD is left out
	cmdShell bool
}

var (
	heredoc   = regexp.MustCompile(`(^|\s)<<-?["']?[A-Za-z_]`)
	octalMode = regexp.MustCompile(`^0?[0-7]{3,4}$`)
)

func (p *dockerfile) instruction(l line) error {
	keyword, rest, _ := strings.Cut(l.text, " ")
	if i := strings.IndexAny(keyword, "\t"); i >= 0 {
		keyword, rest = keyword[:i], keyword[i+1:]+" "+rest
	}
	keyword = strings.ToUpper(keyword)
	rest = strings.TrimSpace(rest)
	if keyword != "FROM" && keyword != "ARG" && p.spec.FromImage == "" {
		return fmt.Errorf("%s before FROM", keyword)
	}
	if (keyword == "RUN" || keyword == "COPY" || keyword == "ADD") && heredoc.MatchString(rest) {
		return fmt.Errorf("%s with a heredoc (<<) is not supported", keyword)
	}
	switch keyword {
	case "FROM":
		return p.from(rest)
	case "ARG":
		return p.arg(rest)
	case "ENV":
		pairs, err := p.pairs(rest, true)
		if err != nil {
			return err
		}
		for i := 0; i < len(pairs); i += 2 {
			p.env[pairs[i]] = pairs[i+1]
		}
		p.step(Step{Type: Env, Args: pairs})
	case "LABEL":
		pairs, err := p.pairs(rest, false)
		if err != nil {
			return err
		}
		if p.spec.Labels == nil {
			p.spec.Labels = map[string]string{}
		}
		for i := 0; i < len(pairs); i += 2 {
			p.spec.Labels[pairs[i]] = pairs[i+1]
		}
	case "RUN":
		return p.run(rest)
	case "COPY", "ADD":
		return p.copy(keyword, rest)
	case "WORKDIR":
		dir, err := p.single(rest)
		if err != nil {
			return err
		}
		if !path.IsAbs(dir) {
			dir = path.Join(p.workdir, dir)
		}
		p.workdir = path.Clean(dir)
		p.step(Step{Type: Workdir, Args: []string{p.workdir}})
	case "USER":
		user, err := p.single(rest)
		if err != nil {
			return err
		}
		p.step(Step{Type: User, Args: []string{user}})
	case "CMD", "ENTRYPOINT":
		argv, shell, err := execForm(rest)
		if err != nil {
			return err
		}
		if shell {
			argv = []string{rest}
		}
		if keyword == "CMD" {
			p.cmd, p.cmdShell = argv, shell
		} else {
			p.ep, p.epShell = argv, shell
		}
	case "EXPOSE", "VOLUME", "MAINTAINER", "STOPSIGNAL", "HEALTHCHECK":
		p.notes = append(p.notes, fmt.Sprintf("line %d: %s changes nothing of a sandbox: left out", l.n, keyword))
	case "SHELL", "ONBUILD":
		return fmt.Errorf("%s is not supported", keyword)
	default:
		return fmt.Errorf("unknown instruction %q", keyword)
	}
	return nil
}

func (p *dockerfile) step(s Step) { p.spec.Steps = append(p.spec.Steps, s) }

func (p *dockerfile) from(rest string) error {
	if p.spec.FromImage != "" {
		return fmt.Errorf("a second FROM: multi-stage Dockerfiles are not supported")
	}
	words, err := p.words(rest, p.lookupGlobal)
	if err != nil {
		return err
	}
	var image string
	for i := 0; i < len(words); i++ {
		w := words[i]
		switch {
		case strings.HasPrefix(w, "--platform="):
		case strings.HasPrefix(w, "--"):
			return fmt.Errorf("FROM %s is not supported", w)
		case image == "":
			image = w
		case strings.EqualFold(w, "AS") && i+2 == len(words):
			i++ // a stage name: there is one stage
		default:
			return fmt.Errorf("FROM takes an image (and AS NAME): %q", rest)
		}
	}
	switch image {
	case "":
		return fmt.Errorf("FROM names no image")
	case "scratch":
		return fmt.Errorf("FROM scratch is not supported: a template needs an image with a shell")
	}
	p.spec.FromImage = image
	p.global, p.args = p.args, map[string]string{}
	p.argOrder = nil
	return nil
}

func (p *dockerfile) lookupGlobal(name string) (string, bool) {
	v, ok := p.args[name] // before FROM, the stage's args are the global ones
	return v, ok
}

// lookup is what a variable is in the stage: an ENV, else an ARG.
func (p *dockerfile) lookup(name string) (string, bool) {
	if v, ok := p.env[name]; ok {
		return v, true
	}
	v, ok := p.args[name]
	return v, ok
}

var argName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (p *dockerfile) arg(rest string) error {
	words, err := p.words(rest, p.lookup)
	if err != nil {
		return err
	}
	if len(words) == 0 {
		return fmt.Errorf("ARG names nothing")
	}
	for _, w := range words {
		name, def, hasDef := strings.Cut(w, "=")
		if !argName.MatchString(name) {
			return fmt.Errorf("ARG %q: not a name", name)
		}
		p.declared[name] = true
		v, given := p.given[name]
		switch {
		case given:
		case hasDef:
			v = def
		default:
			// A stage's ARG without a default takes the global one's value.
			v, given = p.global[name]
			if !given {
				v = ""
			}
		}
		if _, seen := p.args[name]; !seen {
			p.argOrder = append(p.argOrder, name)
		}
		p.args[name] = v
	}
	return nil
}

func (p *dockerfile) run(rest string) error {
	if strings.HasPrefix(rest, "--") {
		flag, _, _ := strings.Cut(rest, " ")
		return fmt.Errorf("RUN %s is not supported", flag)
	}
	argv, shell, err := execForm(rest)
	if err != nil {
		return err
	}
	cmd := rest
	if !shell {
		cmd = shellJoin(argv)
	}
	if cmd == "" {
		return fmt.Errorf("RUN runs nothing")
	}
	s := Step{Type: Run, Args: []string{cmd}}
	for _, name := range p.argOrder {
		if _, shadowed := p.env[name]; !shadowed {
			s.BuildArgs = append(s.BuildArgs, name+"="+p.args[name])
		}
	}
	p.step(s)
	return nil
}

func (p *dockerfile) copy(keyword, rest string) error {
	var chown, chmod string
	for strings.HasPrefix(rest, "--") {
		flag, after, _ := strings.Cut(rest, " ")
		rest = strings.TrimSpace(after)
		name, value, _ := strings.Cut(flag, "=")
		switch name {
		case "--chown":
			chown = value
		case "--chmod":
			if !octalMode.MatchString(value) {
				return fmt.Errorf("%s --chmod=%s: an octal mode is needed", keyword, value)
			}
			chmod = value
		case "--link":
		case "--from":
			return fmt.Errorf("%s --from: multi-stage Dockerfiles are not supported", keyword)
		default:
			return fmt.Errorf("%s %s is not supported", keyword, name)
		}
	}
	var words []string
	if argv, shell, err := execForm(rest); err == nil && !shell {
		words = argv
	} else if words, err = p.words(rest, p.lookup); err != nil {
		return err
	}
	if len(words) < 2 {
		return fmt.Errorf("%s needs a source and a destination", keyword)
	}
	srcs, dest := words[:len(words)-1], words[len(words)-1]
	if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
		return fmt.Errorf("%s of %d sources needs a destination directory ending in /", keyword, len(srcs))
	}
	if !path.IsAbs(dest) {
		trail := strings.HasSuffix(dest, "/")
		dest = path.Join(p.workdir, dest)
		if trail {
			dest += "/"
		}
	}
	t := Copy
	if keyword == "ADD" {
		t = Add
	}
	for _, src := range srcs {
		if strings.Contains(src, "://") || strings.HasPrefix(src, "git@") {
			return fmt.Errorf("%s of a URL (%s) is not supported: fetch it in a RUN step, through the network policy", keyword, src)
		}
		clean := path.Clean("/" + src)[1:]
		if clean == "" {
			clean = "."
		}
		if strings.HasPrefix(path.Clean(src), "..") {
			return fmt.Errorf("%s %s: a source outside the build's files", keyword, src)
		}
		p.step(Step{Type: t, Args: []string{clean, dest, chown, chmod}})
	}
	return nil
}

// single is an instruction's one argument, its variables expanded.
func (p *dockerfile) single(rest string) (string, error) {
	words, err := p.words(rest, p.lookup)
	if err != nil {
		return "", err
	}
	if len(words) == 0 {
		return "", fmt.Errorf("an argument is needed")
	}
	return strings.Join(words, " "), nil
}

// pairs reads KEY=VALUE pairs (and, for ENV, the old form KEY VALUE),
// flattened: [k1, v1, k2, v2 ...].
func (p *dockerfile) pairs(rest string, oldForm bool) ([]string, error) {
	first, after, _ := strings.Cut(rest, " ")
	if oldForm && !strings.Contains(first, "=") {
		words, err := p.words(after, p.lookup)
		if err != nil {
			return nil, err
		}
		if !argName.MatchString(first) {
			return nil, fmt.Errorf("%q: not a name", first)
		}
		return []string{first, strings.Join(words, " ")}, nil
	}
	words, err := p.words(rest, p.lookup)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: KEY=VALUE is needed", w)
		}
		out = append(out, k, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("KEY=VALUE is needed")
	}
	return out, nil
}

// words splits s as Docker's shell lexer does for instructions other
// than RUN, CMD and ENTRYPOINT: on unquoted blanks, quotes removed, the
// escape character taking the next character as it is, variables
// ($NAME, ${NAME}, ${NAME:-default}, ${NAME:+alternative}) expanded but
// inside single quotes.
func (p *dockerfile) words(s string, vars func(string) (string, bool)) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == 0 && (c == ' ' || c == '\t'):
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
			continue
		case c == p.escape && quote != '\'' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case quote == 0 && (c == '\'' || c == '"'):
			quote = c
		case c == quote:
			quote = 0
		case c == '$' && quote != '\'':
			v, n, err := expand(s[i:], vars)
			if err != nil {
				return nil, err
			}
			cur.WriteString(v)
			i += n - 1
		default:
			cur.WriteByte(c)
		}
		inWord = true
	}
	if quote != 0 {
		return nil, fmt.Errorf("an unclosed %c quote", quote)
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

var (
	plainVar = regexp.MustCompile(`^\$([A-Za-z_][A-Za-z0-9_]*)`)
	braceVar = regexp.MustCompile(`^\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:[-+])([^}]*))?\}`)
)

// expand reads the variable at the start of s ("$..."): its value and
// how many bytes it took. A lone $ is itself.
func expand(s string, vars func(string) (string, bool)) (string, int, error) {
	if m := plainVar.FindStringSubmatch(s); m != nil {
		v, _ := vars(m[1])
		return v, len(m[0]), nil
	}
	if strings.HasPrefix(s, "${") {
		m := braceVar.FindStringSubmatch(s)
		if m == nil {
			end := strings.IndexByte(s, '}')
			if end < 0 {
				end = len(s) - 1
			}
			return "", 0, fmt.Errorf("%s: not a variable this parser expands (${NAME}, ${NAME:-default}, ${NAME:+alternative})", s[:end+1])
		}
		v, _ := vars(m[1])
		switch m[2] {
		case ":-":
			if v == "" {
				v = m[3]
			}
		case ":+":
			if v != "" {
				v = m[3]
			}
		}
		return v, len(m[0]), nil
	}
	return "$", 1, nil
}

// execForm reads the JSON (exec) form ["a", "b"], or says the text is in
// shell form.
func execForm(rest string) (argv []string, shell bool, err error) {
	if !strings.HasPrefix(rest, "[") {
		return nil, true, nil
	}
	if json.Unmarshal([]byte(rest), &argv) != nil {
		return nil, true, nil // Docker reads it as a shell form then
	}
	return argv, false, nil
}

// startCmd is what CMD and ENTRYPOINT make the start command, as Docker
// combines them.
func (p *dockerfile) startCmd() string {
	switch {
	case p.ep != nil || p.epShell:
		if p.epShell {
			return p.shellOf(p.ep)
		}
		argv := append([]string{}, p.ep...)
		if p.cmdShell && p.cmd != nil {
			argv = append(argv, "/bin/sh", "-c", p.cmd[0])
		} else {
			argv = append(argv, p.cmd...)
		}
		return shellJoin(argv)
	case p.cmd != nil || p.cmdShell:
		if p.cmdShell {
			return p.shellOf(p.cmd)
		}
		return shellJoin(p.cmd)
	}
	return ""
}

func (p *dockerfile) shellOf(argv []string) string {
	if len(argv) == 0 {
		return ""
	}
	return argv[0]
}

var safeWord = regexp.MustCompile(`^[A-Za-z0-9_./:=@%+,-]+$`)

// shellJoin quotes argv for /bin/sh -c.
func shellJoin(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if safeWord.MatchString(a) {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

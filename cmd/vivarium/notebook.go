package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// `vivarium run notebook.ipynb --out executed.ipynb` runs a Jupyter
// notebook's code cells in order in one stateful sandbox, as a kernel
// would, and writes the notebook back with their outputs (nbformat 4).

// notebook is an nbformat 4 document. Cells are kept as raw JSON fields, so
// that everything this program does not change (ids, metadata, attachments,
// markdown) is written back as it came.
type notebook struct {
	Cells         []map[string]json.RawMessage `json:"cells"`
	Metadata      json.RawMessage              `json:"metadata"`
	NBFormat      int                          `json:"nbformat"`
	NBFormatMinor int                          `json:"nbformat_minor"`
}

func parseNotebook(b []byte) (*notebook, error) {
	var nb notebook
	if err := json.Unmarshal(b, &nb); err != nil {
		return nil, fmt.Errorf("not a Jupyter notebook (invalid JSON): %w", err)
	}
	if nb.NBFormat != 4 {
		return nil, fmt.Errorf("nbformat %d is not supported: only nbformat 4 notebooks (Jupyter 4 and later)", nb.NBFormat)
	}
	if len(nb.Metadata) == 0 {
		nb.Metadata = json.RawMessage("{}")
	}
	if nb.Cells == nil {
		nb.Cells = []map[string]json.RawMessage{}
	}
	// Fields nbformat requires that hand-written notebooks often lack.
	for i, c := range nb.Cells {
		if c == nil {
			return nil, fmt.Errorf("cell %d is not an object", i+1)
		}
		if _, ok := c["metadata"]; !ok {
			c["metadata"] = json.RawMessage("{}")
		}
		if _, ok := c["id"]; !ok && nb.NBFormatMinor >= 5 {
			c["id"] = json.RawMessage(fmt.Sprintf("%q", fmt.Sprintf("cell-%d", i+1)))
		}
	}
	return &nb, nil
}

// cellField decodes a field that nbformat allows as a string or a list of
// strings (source, text, and text MIME data).
func cellField(raw json.RawMessage) (string, error) {
	if len(raw) == 0 {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var lines []string
	if err := json.Unmarshal(raw, &lines); err != nil {
		return "", errors.New("expected a string or a list of strings")
	}
	return strings.Join(lines, ""), nil
}

func cellType(c map[string]json.RawMessage) string {
	var t string
	json.Unmarshal(c["cell_type"], &t)
	return t
}

// multiline is how Jupyter writes text: a list of lines, each with its
// newline.
func multiline(s string) []string {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if lines == nil {
		lines = []string{}
	}
	return lines
}

// kernelCode adapts a cell for plain Python: IPython's %matplotlib line
// magic is a no-op here (figures are always captured), so it becomes
// "pass"; other magics and shell escapes are left to fail with a
// SyntaxError that names them.
func kernelCode(src string) string {
	lines := strings.SplitAfter(src, "\n")
	for i, l := range lines {
		trimmed := strings.TrimLeft(l, " \t")
		if strings.HasPrefix(trimmed, "%matplotlib") || strings.HasPrefix(trimmed, "%config ") {
			nl := ""
			if strings.HasSuffix(l, "\n") {
				nl = "\n"
			}
			lines[i] = l[:len(l)-len(trimmed)] + "pass  # " + strings.TrimSpace(trimmed) + nl
		}
	}
	return strings.Join(lines, "")
}

// mimeBundle is an Output in nbformat's terms.
func mimeBundle(o sandbox.Output) map[string]any {
	data := map[string]any{}
	text := func(mime, s string) {
		if s != "" {
			data[mime] = multiline(s)
		}
	}
	text("text/plain", o.Text)
	text("text/html", o.HTML)
	text("text/markdown", o.Markdown)
	text("text/latex", o.LaTeX)
	text("image/svg+xml", o.SVG)
	text("application/javascript", o.JavaScript)
	if o.PNG != "" {
		data["image/png"] = o.PNG
	}
	if o.JPEG != "" {
		data["image/jpeg"] = o.JPEG
	}
	if len(o.JSON) > 0 && json.Valid(o.JSON) {
		data["application/json"] = o.JSON
	}
	return data
}

// cellOutputs collects one cell's outputs in the order they happen, and
// echoes streams to the terminal when asked.
type cellOutputs struct {
	count int
	echo  sandbox.Sink

	mu      sync.Mutex
	outputs []map[string]any
	results int
}

var _ sandbox.ResultSink = (*cellOutputs)(nil)

func (c *cellOutputs) stream(name string, p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.outputs); n > 0 && c.outputs[n-1]["output_type"] == "stream" && c.outputs[n-1]["name"] == name {
		c.outputs[n-1]["raw"] = c.outputs[n-1]["raw"].(string) + string(p)
		return
	}
	c.outputs = append(c.outputs, map[string]any{"output_type": "stream", "name": name, "raw": string(p)})
}

func (c *cellOutputs) Stdout(p []byte) {
	c.stream("stdout", p)
	if c.echo != nil {
		c.echo.Stdout(p)
	}
}

func (c *cellOutputs) Stderr(p []byte) {
	c.stream("stderr", p)
	if c.echo != nil {
		c.echo.Stderr(p)
	}
}

func (c *cellOutputs) Result(o sandbox.Output) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.results++
	c.add(o)
}

func (c *cellOutputs) add(o sandbox.Output) {
	out := map[string]any{"output_type": "display_data", "data": mimeBundle(o), "metadata": map[string]any{}}
	if o.IsMainResult {
		out["output_type"] = "execute_result"
		out["execution_count"] = c.count
	}
	c.outputs = append(c.outputs, out)
}

// finish completes the outputs with what the Result says and the sink
// could not: results it did not see, dropped output, the error.
func (c *cellOutputs) finish(res *sandbox.Result) []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.results == 0 {
		for _, o := range res.Results {
			c.add(o)
		}
	}
	var notes []string
	if res.StdoutTruncated || res.StderrTruncated {
		notes = append(notes, "[vivarium: output over --max-output was dropped]\n")
	}
	if res.StateLost {
		notes = append(notes, "[vivarium: the Python process was restarted: variables from earlier cells are gone, files are kept]\n")
	}
	for _, n := range notes {
		c.outputs = append(c.outputs, map[string]any{"output_type": "stream", "name": "stderr", "raw": n})
	}
	if res.Status != sandbox.StatusOK {
		e := res.Error
		if e == nil {
			e = &sandbox.Error{Name: string(res.Status), Value: fmt.Sprintf("exit status %d", res.ExitCode)}
		}
		tb := multiline(strings.TrimSuffix(e.Traceback, "\n"))
		if e.Traceback == "" {
			tb = []string{e.Name + ": " + e.Value}
		}
		for i := range tb {
			tb[i] = strings.TrimSuffix(tb[i], "\n") // nbformat: one line per entry, no newlines
		}
		c.outputs = append(c.outputs, map[string]any{"output_type": "error", "ename": e.Name, "evalue": e.Value, "traceback": tb})
	}
	for _, o := range c.outputs {
		if raw, ok := o["raw"]; ok {
			o["text"] = multiline(raw.(string))
			delete(o, "raw")
		}
	}
	return c.outputs
}

// notebookRun executes a notebook's code cells in one sandbox.
type notebookRun struct {
	backend     sandbox.Backend
	spec        sandbox.Spec
	files       []sandbox.InputFile
	allowErrors bool
	echo        sandbox.Sink // receives streams as they come; nil: none
}

// notebookReport says what a run did.
type notebookReport struct {
	codeCells, executed int
	failedCell          int             // 1-based index among all cells; 0: none
	failedCount         int             // its execution count, In[n]
	failed              *sandbox.Result // the first failing cell's result
}

// run fills nb's code cells with outputs and execution counts. An error
// means the sandbox could not do its job; failing code is in the report.
func (r *notebookRun) run(ctx context.Context, nb *notebook) (notebookReport, error) {
	var rep notebookReport
	spec := r.spec
	spec.OneShot = false
	sb, err := r.backend.Create(ctx, spec)
	if err != nil {
		return rep, err
	}
	defer sb.Close()
	disk := spec.Limits.WithDefaults().Disk
	for _, f := range r.files {
		rc, err := f.Open()
		if err != nil {
			return rep, fmt.Errorf("input file %s: %w", f.Name, err)
		}
		err = sb.Workspace().WriteFile(f.Name, rc, disk)
		rc.Close()
		if err != nil {
			return rep, fmt.Errorf("input file %s: %w", f.Name, err)
		}
	}

	stopped := false
	for i, cell := range nb.Cells {
		if cellType(cell) != "code" {
			continue
		}
		rep.codeCells++
		src, err := cellField(cell["source"])
		if err != nil {
			return rep, fmt.Errorf("cell %d: source: %w", i+1, err)
		}
		cell["outputs"] = json.RawMessage("[]")
		cell["execution_count"] = json.RawMessage("null")
		if stopped || strings.TrimSpace(src) == "" {
			continue
		}
		rep.executed++
		out := &cellOutputs{count: rep.executed, echo: r.echo}
		res, err := sb.Execute(ctx, sandbox.ExecRequest{Code: kernelCode(src), Filename: fmt.Sprintf("<In[%d]>", rep.executed)}, out)
		if err != nil {
			return rep, fmt.Errorf("cell %d: %w", i+1, err)
		}
		outputs, err := json.Marshal(out.finish(res))
		if err != nil {
			return rep, err
		}
		cell["outputs"] = outputs
		cell["execution_count"] = json.RawMessage(fmt.Sprint(rep.executed))
		if res.Status != sandbox.StatusOK && rep.failed == nil {
			rep.failed, rep.failedCell, rep.failedCount = res, i+1, rep.executed
			stopped = !r.allowErrors
		}
	}
	return rep, nil
}

func (nb *notebook) encode() ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(nb); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// cmdNotebook is `vivarium run NOTEBOOK.ipynb`: --out is the path of the
// executed notebook ("-": standard output), not a directory.
func cmdNotebook(o *runOptions, path string) int {
	fail := func(code int, format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "vivarium run: "+format+"\n", args...)
		return code
	}
	if o.asJSON {
		return fail(2, "--json is for code, not notebooks: give --out FILE.ipynb (or --out - for standard output)")
	}
	job, err := o.job([]string{path})
	if err != nil {
		return fail(2, "%v", err)
	}
	if job.Spec.Egress != nil {
		defer job.Spec.Egress.Close() // the sandbox closes it too, when one was made
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return fail(2, "%v", err)
	}
	nb, err := parseNotebook(src)
	if err != nil {
		return fail(2, "%s: %v", path, err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b, err := o.newBackend()
	if err != nil {
		return fail(sandbox.ExitSetupFailed, "%v", err)
	}
	defer closeBackend(b)
	r := &notebookRun{backend: b, spec: job.Spec, files: job.Files, allowErrors: o.allowErrors}
	if o.out != "-" {
		r.echo = passThrough{}
	}
	rep, err := r.run(ctx, nb)
	if err != nil {
		return fail(sandbox.ExitSetupFailed, "%v", err)
	}
	if rep.failed != nil {
		reportPlain(rep.failed)
	}

	code := 0
	if rep.failed != nil && !o.allowErrors {
		code = rep.failed.ExitCode
		if code == 0 {
			code = 1
		}
	}
	summary := fmt.Sprintf("ran %d of %d code cells", rep.executed, rep.codeCells)
	if rep.failed != nil {
		verb := "stopped at"
		if o.allowErrors {
			verb = "first error in"
		}
		summary += fmt.Sprintf("; %s In[%d] (cell %d of the notebook): %s", verb, rep.failedCount, rep.failedCell, rep.failed.Status)
	}
	switch o.out {
	case "":
		fmt.Fprintf(os.Stderr, "vivarium: %s; no --out given, so no notebook was written\n", summary)
		return code
	case "-":
		out, err := nb.encode()
		if err != nil {
			return fail(1, "%v", err)
		}
		os.Stdout.Write(out)
	default:
		out, err := nb.encode()
		if err != nil {
			return fail(1, "%v", err)
		}
		if err := os.WriteFile(o.out, out, 0o644); err != nil {
			return fail(1, "write the executed notebook: %v", err)
		}
		summary += "; wrote " + o.out
	}
	fmt.Fprintf(os.Stderr, "vivarium: %s\n", summary)
	return code
}

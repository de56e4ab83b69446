package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/backend/native"
	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// Notebook runs in this process use their own cgroup parent and uid range,
// apart from the other tests of this package.
const (
	notebookParent  = "vivarium-notebook-test"
	notebookUIDBase = native.DefaultUIDBase + 8<<24
)

// salesNotebook has what notebooks hold: markdown, a magic, prints, a
// DataFrame (HTML), a chart, stderr, an empty cell, an error and a cell
// after it. Sources come in both of nbformat's forms.
const salesNotebook = `{
 "cells": [
  {"cell_type": "markdown", "id": "m1", "metadata": {}, "source": ["# Sales\n", "A small report."]},
  {"cell_type": "code", "id": "c1", "metadata": {}, "execution_count": 7, "outputs": [{"output_type": "stream", "name": "stdout", "text": "stale\n"}],
   "source": ["%matplotlib inline\n", "import pandas as pd\n", "df = pd.DataFrame({'month': ['jan', 'feb', 'mar'], 'sales': [120, 135, 160]})\n", "print('rows:', len(df))"]},
  {"cell_type": "code", "id": "c2", "metadata": {"tags": ["table"]}, "execution_count": null, "outputs": [], "source": "df"},
  {"cell_type": "code", "id": "c3", "metadata": {}, "execution_count": null, "outputs": [],
   "source": "import matplotlib.pyplot as plt\nprint('before')\nax = df.plot(x='month', y='sales', kind='bar')\nplt.show()\nprint('after')"},
  {"cell_type": "code", "id": "c4", "metadata": {}, "execution_count": null, "outputs": [], "source": "   \n"},
  {"cell_type": "code", "id": "c5", "metadata": {}, "execution_count": null, "outputs": [],
   "source": "import sys\nprint('careful', file=sys.stderr)\ntotal = int(df['sales'].sum())\ntotal"},
  {"cell_type": "code", "id": "c6", "metadata": {}, "execution_count": null, "outputs": [], "source": "def f():\n    return total / 0\nf()"},
  {"cell_type": "raw", "id": "r1", "metadata": {}, "source": "raw text"},
  {"cell_type": "code", "id": "c7", "metadata": {}, "execution_count": null, "outputs": [], "source": "print('still', total)"}
 ],
 "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
 "nbformat": 4,
 "nbformat_minor": 5
}`

// validateNotebook checks a notebook with the reference implementation of
// the format, Debian's python3-nbformat.
func validateNotebook(t *testing.T, path string) {
	t.Helper()
	testutil.RequirePythonModules(t, "nbformat")
	out, err := exec.Command("/usr/bin/python3", "-c",
		"import sys, nbformat; nbformat.validate(nbformat.read(sys.argv[1], as_version=nbformat.NO_CONVERT)); print('valid')", path).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "valid" {
		t.Fatalf("nbformat.validate: %v\n%s", err, out)
	}
}

type nbOut struct {
	OutputType     string            `json:"output_type"`
	Name           string            `json:"name"`
	Text           []string          `json:"text"`
	Data           map[string]any    `json:"data"`
	ExecutionCount *int              `json:"execution_count"`
	Ename          string            `json:"ename"`
	Evalue         string            `json:"evalue"`
	Traceback      []string          `json:"traceback"`
	Metadata       map[string]string `json:"metadata"`
}

type nbCell struct {
	CellType       string          `json:"cell_type"`
	ID             string          `json:"id"`
	Metadata       json.RawMessage `json:"metadata"`
	ExecutionCount *int            `json:"execution_count"`
	Outputs        []nbOut         `json:"outputs"`
	Source         any             `json:"source"`
}

func readCells(t *testing.T, b []byte) []nbCell {
	t.Helper()
	var nb struct{ Cells []nbCell }
	if err := json.Unmarshal(b, &nb); err != nil {
		t.Fatal(err)
	}
	return nb.Cells
}

func runSales(t *testing.T, allowErrors bool) (notebookReport, []nbCell, string) {
	t.Helper()
	needSandbox(t)
	testutil.RequirePythonModules(t, "pandas", "matplotlib")
	b, err := native.New(native.Config{CgroupParent: notebookParent, UIDBase: notebookUIDBase, UIDRanges: testutil.UIDRanges})
	if err != nil {
		t.Fatal(err)
	}
	nb, err := parseNotebook([]byte(salesNotebook))
	if err != nil {
		t.Fatal(err)
	}
	r := &notebookRun{backend: b, allowErrors: allowErrors}
	rep, err := r.run(context.Background(), nb)
	if err != nil {
		t.Fatal(err)
	}
	if left := testutil.CgroupsUnder(notebookParent); len(left) > 0 {
		t.Errorf("the notebook's sandbox left cgroups: %v", left)
	}
	out, err := nb.encode()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "executed.ipynb")
	os.WriteFile(path, out, 0o644)
	validateNotebook(t, path)
	return rep, readCells(t, out), path
}

func TestNotebookStopsAtFirstError(t *testing.T) {
	rep, cells, _ := runSales(t, false)
	if rep.codeCells != 7 || rep.executed != 5 || rep.failedCell != 7 || rep.failedCount != 5 {
		t.Errorf("report %+v", rep)
	}
	count := func(c nbCell) int {
		if c.ExecutionCount == nil {
			return 0
		}
		return *c.ExecutionCount
	}
	// Execution counts number the cells that ran, in order.
	var counts []int
	for _, c := range cells {
		if c.CellType == "code" {
			counts = append(counts, count(c))
		}
	}
	if want := []int{1, 2, 3, 0, 4, 5, 0}; !reflect.DeepEqual(counts, want) {
		t.Errorf("execution counts %v, want %v", counts, want)
	}
	var md bytes.Buffer
	json.Compact(&md, cells[2].Metadata)
	if cells[0].CellType != "markdown" || cells[7].CellType != "raw" || cells[2].ID != "c2" || md.String() != `{"tags":["table"]}` {
		t.Errorf("cells other than outputs changed: %s %s %s %s", cells[0].CellType, cells[7].CellType, cells[2].ID, md.String())
	}

	// Stale outputs are replaced.
	if o := cells[1].Outputs; len(o) != 1 || o[0].OutputType != "stream" || strings.Join(o[0].Text, "") != "rows: 3\n" {
		t.Errorf("cell 1: %+v", o)
	}
	// The DataFrame: an execute_result with HTML and text.
	o := cells[2].Outputs
	if len(o) != 1 || o[0].OutputType != "execute_result" || *o[0].ExecutionCount != 2 || o[0].Data["text/html"] == nil ||
		!strings.Contains(strings.Join(toStrings(o[0].Data["text/plain"]), ""), "160") {
		t.Errorf("DataFrame: %+v", o)
	}
	// The chart: a display_data with a PNG, between the prints around it.
	o = cells[3].Outputs
	if len(o) != 3 || strings.Join(o[0].Text, "") != "before\n" || o[1].OutputType != "display_data" || strings.Join(o[2].Text, "") != "after\n" {
		t.Fatalf("chart cell: %+v", o)
	}
	if png, _ := o[1].Data["image/png"].(string); !strings.HasPrefix(png, "iVBORw0KGgo") {
		t.Errorf("chart is not a PNG: %.40s", png)
	}
	// An empty cell is not executed.
	if len(cells[4].Outputs) != 0 || cells[4].ExecutionCount != nil {
		t.Errorf("empty cell: %+v", cells[4])
	}
	o = cells[5].Outputs
	if len(o) != 2 || o[0].Name != "stderr" || o[1].OutputType != "execute_result" || toStrings(o[1].Data["text/plain"])[0] != "415" {
		t.Errorf("stderr and result: %+v", o)
	}
	// The error, with Python's traceback line by line.
	o = cells[6].Outputs
	if len(o) != 1 || o[0].OutputType != "error" || o[0].Ename != "ZeroDivisionError" || o[0].Evalue != "division by zero" {
		t.Fatalf("error: %+v", o)
	}
	tb := strings.Join(o[0].Traceback, "\n")
	if !strings.HasPrefix(tb, "Traceback (most recent call last):") || !strings.Contains(tb, `File "<In[5]>", line 2, in f`) ||
		!strings.Contains(tb, "return total / 0") {
		t.Errorf("traceback:\n%s", tb)
	}
	// Nothing ran after it.
	if c := cells[8]; len(c.Outputs) != 0 || c.ExecutionCount != nil {
		t.Errorf("a cell after the error ran: %+v", c)
	}
}

func TestNotebookAllowErrors(t *testing.T) {
	rep, cells, _ := runSales(t, true)
	if rep.executed != 6 || rep.failedCount != 5 {
		t.Errorf("report %+v", rep)
	}
	if c := cells[8]; *c.ExecutionCount != 6 || strings.Join(c.Outputs[0].Text, "") != "still 415\n" {
		t.Errorf("the cell after the error: %+v", c)
	}
}

func toStrings(v any) []string {
	var out []string
	switch v := v.(type) {
	case string:
		out = append(out, v)
	case []any:
		for _, s := range v {
			out = append(out, s.(string))
		}
	}
	return out
}

// The command line: --out is the executed notebook, the exit status says
// whether a cell failed, --allow-errors runs them all.
func TestNotebookCLI(t *testing.T) {
	needSandbox(t)
	testutil.RequirePythonModules(t, "pandas", "matplotlib", "nbformat")
	dir := t.TempDir()
	in := filepath.Join(dir, "sales.ipynb")
	os.WriteFile(in, []byte(salesNotebook), 0o644)
	out := filepath.Join(dir, "executed.ipynb")

	r := vivarium(t, "", "run", in, "--out", out)
	// Streams are echoed as cells run; the cell after the error never does.
	if r.code != 1 || !strings.HasPrefix(r.stdout, "rows: 3\nbefore\nafter\n") || strings.Contains(r.stdout, "still") ||
		!strings.Contains(r.stderr, "ZeroDivisionError") || !strings.Contains(r.stderr, "ran 5 of 7 code cells; stopped at In[5]") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	validateNotebook(t, out)

	r = vivarium(t, "", "run", "--allow-errors", "--out", "-", in)
	if r.code != 0 {
		t.Fatalf("--allow-errors: exit %d: %s", r.code, r.stderr)
	}
	cells := readCells(t, []byte(r.stdout))
	if c := cells[8]; c.ExecutionCount == nil || *c.ExecutionCount != 6 {
		t.Errorf("--allow-errors: last cell %+v", c)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", in, "--json"}, "--json is for code"},
		{[]string{"run", filepath.Join(dir, "missing.ipynb")}, "no such file"},
	} {
		if r := vivarium(t, "", c.args...); r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q", c.args, r.code, r.stderr)
		}
	}
	old := filepath.Join(dir, "v3.ipynb")
	os.WriteFile(old, []byte(`{"nbformat": 3, "nbformat_minor": 0, "worksheets": []}`), 0o644)
	if r := vivarium(t, "", "run", old); r.code != 2 || !strings.Contains(r.stderr, "only nbformat 4") {
		t.Errorf("nbformat 3: exit %d, %q", r.code, r.stderr)
	}
}

func TestKernelCode(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"%matplotlib inline\nx = 1", "pass  # %matplotlib inline\nx = 1"},
		{"if True:\n    %matplotlib inline\n", "if True:\n    pass  # %matplotlib inline\n"},
		{"x = 1 % 2", "x = 1 % 2"},
		{"%timeit f()", "%timeit f()"}, // left to fail, naming itself
	} {
		if got := kernelCode(c.in); got != c.want {
			t.Errorf("kernelCode(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestParseNotebook(t *testing.T) {
	for _, c := range []struct{ in, err string }{
		{`not json`, "invalid JSON"},
		{`{"nbformat": 3, "cells": []}`, "only nbformat 4"},
		{`{"nbformat": 4, "nbformat_minor": 5, "cells": [null]}`, "not an object"},
	} {
		if _, err := parseNotebook([]byte(c.in)); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %v, want %q", c.in, err, c.err)
		}
	}
	// Fields hand-written notebooks lack are added: metadata, and ids
	// from nbformat 4.5 on.
	nb, err := parseNotebook([]byte(`{"nbformat": 4, "nbformat_minor": 5, "cells": [{"cell_type": "code", "source": "1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(nb.Cells[0]["metadata"]) != "{}" || string(nb.Cells[0]["id"]) != `"cell-1"` || string(nb.Metadata) != "{}" {
		t.Errorf("%s", nb.Cells[0])
	}
	for _, c := range []struct{ raw, want string }{{`"a\nb"`, "a\nb"}, {`["a\n", "b"]`, "a\nb"}, {``, ""}} {
		if got, err := cellField(json.RawMessage(c.raw)); err != nil || got != c.want {
			t.Errorf("cellField(%s) = %q, %v", c.raw, got, err)
		}
	}
	if !reflect.DeepEqual(multiline("a\nb\n"), []string{"a\n", "b\n"}) || len(multiline("")) != 0 {
		t.Error("multiline")
	}
}

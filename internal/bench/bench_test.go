package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSummarize(t *testing.T) {
	var twenty []float64
	for i := 20; i >= 1; i-- { // unsorted on purpose
		twenty = append(twenty, float64(i))
	}
	for _, tc := range []struct {
		name   string
		values []float64
		want   Stats
	}{
		{"none", nil, Stats{}},
		{"one", []float64{5}, Stats{N: 1, P50: 5, P95: 5, Mean: 5, Min: 5, Max: 5}},
		{"odd", []float64{30, 10, 20}, Stats{N: 3, P50: 20, P95: 30, Mean: 20, Min: 10, Max: 30}},
		{"even: median between the middle two", []float64{40, 10, 20, 30},
			Stats{N: 4, P50: 25, P95: 40, Mean: 25, Min: 10, Max: 40}},
		{"twenty: p95 is the 19th", twenty, Stats{N: 20, P50: 10.5, P95: 19, Mean: 10.5, Min: 1, Max: 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := slices.Clone(tc.values)
			if got := Summarize(tc.values); got != tc.want {
				t.Errorf("Summarize = %+v, want %+v", got, tc.want)
			}
			if !slices.Equal(before, tc.values) {
				t.Error("Summarize reordered its argument")
			}
		})
	}
}

// counter is a subject whose iterations fail when fail says so.
type counter struct {
	mu        sync.Mutex
	calls     int
	setups    int
	teardowns int
	fail      func(call int) bool
}

func (c *counter) subject(workload, name string) Subject {
	return Subject{
		Workload: workload, Name: name,
		Setup: func(context.Context) error { c.setups++; return nil },
		Run: func(context.Context) error {
			c.mu.Lock()
			c.calls++
			call := c.calls
			c.mu.Unlock()
			if c.fail != nil && c.fail(call) {
				return errors.New("boom")
			}
			return nil
		},
		Teardown: func() error { c.teardowns++; return nil },
	}
}

func TestRunCountsIterations(t *testing.T) {
	var ok, flaky, broken counter
	flaky.fail = func(call int) bool { return call == 1 || call == 4 } // one warm-up, one measured
	broken.fail = func(int) bool { return true }
	subjects := []Subject{
		ok.subject("W", "ok"),
		flaky.subject("W", "flaky"),
		broken.subject("W", "broken"),
		{Workload: "W", Name: "absent", Skip: "not installed"},
		{Workload: "W", Name: "bad setup", Setup: func(context.Context) error { return errors.New("no image") },
			Run: func(context.Context) error { t.Error("Run after a failed Setup"); return nil }},
	}
	rep := Run(context.Background(), subjects, Options{Iterations: 5, WarmUp: 2})
	if len(rep.Latency) != 5 {
		t.Fatalf("%d rows, want 5", len(rep.Latency))
	}
	byName := map[string]Row{}
	for _, r := range rep.Latency {
		byName[r.Subject] = r
	}
	if r := byName["ok"]; r.N != 5 || r.Errors != 0 || r.Failed || ok.calls != 7 || ok.setups != 1 || ok.teardowns != 1 {
		t.Errorf("ok: row %+v, %d calls, %d setups, %d teardowns; want 5 measured of 7 calls, one setup and teardown",
			r, ok.calls, ok.setups, ok.teardowns)
	}
	if r := byName["flaky"]; r.N != 4 || r.Errors != 1 || r.FirstError != "boom" {
		t.Errorf("flaky: %+v, want 4 measured, 1 error (the warm-up failure is not counted)", r)
	}
	if r := byName["broken"]; !r.Failed || r.N != 0 || broken.calls != 3 || broken.teardowns != 1 {
		t.Errorf("broken: row %+v after %d calls, want failed after 3 (MaxConsecutiveErrors) and torn down", r, broken.calls)
	}
	if r := byName["absent"]; r.Skipped != "not installed" {
		t.Errorf("absent: %+v", r)
	}
	if r := byName["bad setup"]; !r.Failed || r.FirstError != "setup: no image" {
		t.Errorf("bad setup: %+v", r)
	}
}

func TestRunOnlyKeepsReference(t *testing.T) {
	var calls []string
	sub := func(workload, name string, ref bool) Subject {
		return Subject{Workload: workload, Name: name, Reference: ref, Run: func(context.Context) error {
			calls = append(calls, workload+"/"+name)
			return nil
		}}
	}
	subjects := []Subject{
		sub("W1", "vivarium", true), sub("W1", "python3", false), sub("W1", "runsc", false),
		sub("W2", "vivarium", true), sub("W2", "python3", false),
	}
	rep := Run(context.Background(), subjects, Options{Iterations: 1, Only: regexp.MustCompile(`W1 / runsc`)})
	var got []string
	for _, r := range rep.Latency {
		got = append(got, r.Workload+"/"+r.Subject)
	}
	if want := []string{"W1/vivarium", "W1/runsc"}; !slices.Equal(got, want) || !slices.Equal(calls, want) {
		t.Errorf("rows %v, runs %v; want %v", got, calls, want)
	}
}

func TestRatios(t *testing.T) {
	rep := &Report{
		Latency: []Row{
			{Workload: "W1", Subject: "vivarium", Reference: true, Stats: Stats{N: 3, P50: 100}},
			{Workload: "W1", Subject: "python3", Peer: true, Stats: Stats{N: 3, P50: 25}},
			{Workload: "W1", Subject: "runsc", Peer: true, Stats: Stats{N: 3, P50: 300}},
			{Workload: "W1", Subject: "docker", Peer: true, Skipped: "no daemon"},
			{Workload: "W2", Subject: "vivarium", Reference: true, Failed: true},
			{Workload: "W2", Subject: "python3", Peer: true, Stats: Stats{N: 3, P50: 500}},
		},
		Throughput: []ThroughputRow{
			{Workload: "W1", Subject: "vivarium", Reference: true, PerSecond: 20},
			{Workload: "W1", Subject: "runsc", Peer: true, PerSecond: 5},
		},
	}
	rep.computeRatios()
	for i, want := range []struct {
		ratio  float64
		versus string
	}{{1, "vivarium"}, {0.25, "vivarium"}, {3, "vivarium"}, {0, ""}, {0, ""}, {0, ""}} {
		if r := rep.Latency[i]; r.Ratio != want.ratio || r.Versus != want.versus {
			t.Errorf("%s/%s: ratio %v versus %q, want %v versus %q", r.Workload, r.Subject, r.Ratio, r.Versus, want.ratio, want.versus)
		}
	}
	if a, b := rep.Throughput[0].Ratio, rep.Throughput[1].Ratio; a != 1 || b != 0.25 {
		t.Errorf("throughput ratios %v, %v; want 1, 0.25", a, b)
	}
}

func testReport() *Report {
	rep := &Report{
		Date:       "2026-11-22",
		Host:       Host{Kernel: "6.1.0", Arch: "amd64", CPUs: 2, MemoryBytes: 24 << 30, Cgroup: "v1 (hybrid)", Vivarium: "dev"},
		Iterations: 20, WarmUp: 2,
		Latency: []Row{
			{Workload: "W1 print(1)", Subject: "vivarium run -c (CLI)", Reference: true, Unit: "ms",
				Stats: Stats{N: 20, P50: 120, P95: 150, Mean: 125, Min: 110, Max: 160}},
			{Workload: "W1 print(1)", Subject: "python3 -c", Peer: true, Unit: "ms",
				Stats:  Stats{N: 19, P50: 30, P95: 41.25, Mean: 31, Min: 28, Max: 45},
				Errors: 1, FirstError: "python3: exit status 1:\nboom"},
			{Workload: "W1 print(1)", Subject: "docker run", Peer: true, Skipped: "no docker daemon"},
			{Workload: "W1 print(1)", Subject: "runsc do", Peer: true, Failed: true, FirstError: "runsc: exit status 128"},
		},
	}
	rep.computeRatios()
	return rep
}

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	if err := testReport().WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	want := `vivarium bench, 2026-11-22: Linux 6.1.0 amd64, 2 CPUs, 24.0 GiB, cgroup v1 (hybrid), vivarium dev

Latency of one execution, end to end (start, run, check the output, clean up):
20 measured runs per row after 2 warm-up runs, never two at once; the rows of a workload take turns.
ratio = the row's p50 / the p50 of its workload's Vivarium row (marked *):
        above 1x the row takes longer than Vivarium, below 1x less (0.50x: half the time).

W1 print(1)
    subject                  n       p50       p95      mean       min  err   ratio
  * vivarium run -c (CLI)   20     120ms     150ms     125ms     110ms    0   1.00x
    python3 -c              19    30.0ms    41.2ms    31.0ms    28.0ms    1   0.25x
      first error: python3: exit status 1: boom
    docker run            skipped: no docker daemon
    runsc do              failed: runsc: exit status 128
`
	if got := b.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestWriteTableThroughput(t *testing.T) {
	rep := testReport()
	rep.Concurrency, rep.Duration = 4, Millis(10*time.Second)
	rep.Throughput = []ThroughputRow{
		{Workload: "W1 print(1)", Subject: "vivarium run -c (CLI)", Reference: true, Clients: 4, Completed: 200, PerSecond: 20},
		{Workload: "W1 print(1)", Subject: "python3 -c", Peer: true, Clients: 4, Completed: 800, PerSecond: 80},
	}
	rep.computeRatios()
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Throughput: 4 concurrent clients, each running executions back to back for 10s.",
		"  * vivarium run -c (CLI)       4       200    20.00    0   1.00x\n",
		"    python3 -c                  4       800    80.00    0   4.00x\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	if err := testReport().WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Date    string `json:"date"`
		Host    Host   `json:"host"`
		Latency []map[string]any
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if got.Date != "2026-11-22" || got.Host.CPUs != 2 || len(got.Latency) != 4 {
		t.Fatalf("decoded %+v", got)
	}
	py := got.Latency[1]
	if py["unit"] != "ms" || py["p50"] != 30.0 || py["p95"] != 41.25 || py["n"] != 19.0 || py["errors"] != 1.0 ||
		py["ratio"] != 0.25 || py["versus"] != "vivarium run -c (CLI)" || py["peer"] != true {
		t.Errorf("python3 row: %v", py)
	}
	if docker := got.Latency[2]; docker["skipped"] != "no docker daemon" || docker["ratio"] != nil {
		t.Errorf("docker row: %v", docker)
	}
	// What the JSON says reads back as the same report.
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Latency[1].P95 != 41.25 {
		t.Errorf("p95 read back as %v", back.Latency[1].P95)
	}
}

// Ready runs before every latency iteration, warm-up included, and its
// error is the iteration's; throughput runs never call it.
func TestReadyPrecedesEachLatencyIteration(t *testing.T) {
	var mu sync.Mutex
	var log []string
	readies := 0
	s := Subject{Workload: "W", Name: "pooled", Reference: true,
		Ready: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			readies++
			log = append(log, "ready")
			if readies == 3 {
				return errors.New("not ready")
			}
			return nil
		},
		Run: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			log = append(log, "run")
			return nil
		}}
	rep := Run(context.Background(), []Subject{s}, Options{Iterations: 4, WarmUp: 1, Concurrency: 2,
		Duration: 20 * time.Millisecond})
	want := []string{"ready", "run", "ready", "run", "ready", "ready", "run", "ready", "run"}
	mu.Lock()
	defer mu.Unlock()
	if len(log) < len(want) || !slices.Equal(log[:len(want)], want) {
		t.Errorf("iterations %v, want %v first", log, want)
	}
	if readies != 5 {
		t.Errorf("Ready called %d times, want 5 (the latency iterations only)", readies)
	}
	if r := rep.Latency[0]; r.N != 3 || r.Errors != 1 || r.FirstError != "not ready" {
		t.Errorf("row %+v, want 3 measured and Ready's error counted", r)
	}
	if len(rep.Throughput) != 1 || rep.Throughput[0].Completed == 0 {
		t.Errorf("throughput %+v, want iterations without Ready", rep.Throughput)
	}
}

func TestThroughput(t *testing.T) {
	var inFlight, most atomic.Int32
	s := Subject{Workload: "W", Name: "sleep", Reference: true, Run: func(context.Context) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		return nil
	}}
	rep := Run(context.Background(), []Subject{s}, Options{Iterations: 1, Concurrency: 4, Duration: 100 * time.Millisecond})
	if len(rep.Throughput) != 1 {
		t.Fatalf("%d throughput rows, want 1", len(rep.Throughput))
	}
	tp := rep.Throughput[0]
	if tp.Clients != 4 || tp.Completed == 0 || tp.Errors != 0 || most.Load() != 4 {
		t.Errorf("row %+v, %d at once; want 4 clients running at once, no errors", tp, most.Load())
	}
	if want := float64(tp.Completed) / tp.Duration.D().Seconds(); tp.PerSecond != want {
		t.Errorf("per second %v, want completed/duration = %v", tp.PerSecond, want)
	}
	if tp.Ratio != 1 {
		t.Errorf("reference ratio %v, want 1", tp.Ratio)
	}
}

func TestThroughputStopsFailingClients(t *testing.T) {
	var calls atomic.Int32
	s := Subject{Workload: "W", Name: "broken", Run: func(context.Context) error {
		if calls.Add(1) > 1 { // the latency iteration succeeds
			return errors.New("down")
		}
		return nil
	}}
	rep := Run(context.Background(), []Subject{s}, Options{Iterations: 1, Concurrency: 2, Duration: time.Minute})
	tp := rep.Throughput[0]
	// 2 warm-up calls, then each client stops after 3 failures in a row,
	// long before the minute is up.
	if tp.Completed != 0 || tp.Errors != 6 || tp.FirstError != "down" || tp.Duration.D() > 10*time.Second {
		t.Errorf("row %+v", tp)
	}
	if p := rep.VivariumProblems(); len(p) != 1 || !strings.Contains(p[0], "throughput: 6 errors: down") {
		t.Errorf("problems %q", p)
	}
}

func TestVivariumProblemsIgnorePeers(t *testing.T) {
	rep := testReport() // the python3 peer has an error, runsc failed, docker skipped
	if p := rep.VivariumProblems(); len(p) != 0 {
		t.Errorf("problems %q, want none: only peers failed", p)
	}
	rep.Latency[0].Errors, rep.Latency[0].FirstError = 2, "setup_failed"
	if p := rep.VivariumProblems(); len(p) != 1 || !strings.Contains(p[0], "vivarium run -c (CLI): 2 errors: setup_failed") {
		t.Errorf("problems %q", p)
	}
}

// A backend the host lacks is skipped without failing the bench; once it
// runs, its errors count.
func TestVivariumProblemsOptionalBackends(t *testing.T) {
	rep := testReport()
	rep.Latency = append(rep.Latency,
		Row{Workload: "W1", Subject: "vivarium docker RunOnce", Optional: true, Skipped: "no Docker daemon"},
		Row{Workload: "W1", Subject: "vivarium gvisor RunOnce", Optional: true, Errors: 1, FirstError: "runsc: boom"},
		Row{Workload: "W1", Subject: "vivarium RunOnce", Skipped: "not root"})
	p := rep.VivariumProblems()
	if len(p) != 2 || !strings.Contains(p[0], "gvisor RunOnce: 1 errors: runsc: boom") || !strings.Contains(p[1], "vivarium RunOnce: skipped: not root") {
		t.Errorf("problems %q, want the gvisor error and the skipped native row", p)
	}
}

func TestRunInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var ran []string
	run := func(name string) func(context.Context) error {
		return func(context.Context) error { ran = append(ran, name); return nil }
	}
	subjects := []Subject{
		{Workload: "W1", Name: "first", Run: func(context.Context) error { ran = append(ran, "first"); cancel(); return nil }},
		{Workload: "W1", Name: "second", Run: run("second")},
		{Workload: "W2", Name: "third", Run: run("third")},
	}
	rep := Run(ctx, subjects, Options{Iterations: 5})
	if !slices.Equal(ran, []string{"first"}) {
		t.Errorf("ran %v after the interrupt, want only first", ran)
	}
	if r := rep.Latency; r[0].N != 1 || !r[1].Failed || r[1].FirstError != "interrupted" || r[2].Skipped != "interrupted" {
		t.Errorf("rows %+v", rep.Latency)
	}
}

// Rows of a workload take turns, a round at a time, so that a change of
// load during the run weighs on all of them; setups come before the first
// round and teardowns after the last.
func TestRunInterleavesRows(t *testing.T) {
	var events []string
	sub := func(workload, name string) Subject {
		return Subject{Workload: workload, Name: name,
			Setup:    func(context.Context) error { events = append(events, "setup "+name); return nil },
			Run:      func(context.Context) error { events = append(events, name); return nil },
			Teardown: func() error { events = append(events, "teardown "+name); return nil },
		}
	}
	Run(context.Background(), []Subject{sub("W1", "a"), sub("W2", "c"), sub("W1", "b")}, Options{Iterations: 2, WarmUp: 1})
	want := []string{
		"setup a", "setup b", "a", "b", "a", "b", "a", "b", "teardown a", "teardown b",
		"setup c", "c", "c", "c", "teardown c",
	}
	if !slices.Equal(events, want) {
		t.Errorf("events\n%v\nwant\n%v", events, want)
	}
}

func TestPool(t *testing.T) {
	var opened, closed atomic.Int32
	p := newPool(func(context.Context) (*int, error) {
		n := int(opened.Add(1))
		return &n, nil
	}, func(*int) error { closed.Add(1); return nil })
	ctx := context.Background()

	// Callers at the same time get clients of their own.
	a, _ := p.get(ctx)
	b, _ := p.get(ctx)
	if a == b || opened.Load() != 2 {
		t.Fatalf("two callers shared a client")
	}
	p.put(a)
	p.put(b)
	// An idle client is reused; one that failed is closed, not reused.
	if err := p.with(ctx, func(*int) error { return errors.New("broken") }); err == nil {
		t.Fatal("with hid the error")
	}
	if opened.Load() != 2 || closed.Load() != 1 {
		t.Fatalf("opened %d closed %d, want 2 and 1", opened.Load(), closed.Load())
	}
	if err := p.closeAll(); err != nil || closed.Load() != 2 {
		t.Fatalf("closeAll: %v, closed %d, want 2", err, closed.Load())
	}
}

func TestCommand(t *testing.T) {
	ctx := context.Background()
	if err := (command{argv: []string{"/bin/sh", "-c", "echo 1"}, want: "1\n"}).run(ctx); err != nil {
		t.Errorf("matching output: %v", err)
	}
	err := command{argv: []string{"/bin/sh", "-c", "echo 2"}, want: "1\n"}.run(ctx)
	if !errors.Is(err, ErrOutput) {
		t.Errorf("wrong output: %v, want ErrOutput", err)
	}
	err = command{argv: []string{"/bin/sh", "-c", "echo noise >&2; echo 'Error: it broke' >&2; exit 3"}}.run(ctx)
	if err == nil || !strings.Contains(err.Error(), "exit status 3: Error: it broke") {
		t.Errorf("failing command: %v, want its status and last stderr line", err)
	}
}

func TestBuffers(t *testing.T) {
	var c capBuffer
	c.Write(bytes.Repeat([]byte("a"), capBufferSize-1))
	if n, _ := c.Write([]byte("bcd")); n != 3 || len(c.b) != capBufferSize || !strings.HasSuffix(c.String(), "ab") {
		t.Errorf("capBuffer kept %d bytes ending %q", len(c.b), c.String()[len(c.b)-2:])
	}
	var tb tailBuffer
	tb.Write(bytes.Repeat([]byte("a"), tailBufferSize))
	tb.Write([]byte("\nlast line\n"))
	if s := tb.String(); len(s) != tailBufferSize || lastLine(s) != "last line" {
		t.Errorf("tailBuffer kept %d bytes, last line %q", len(s), lastLine(s))
	}
	if got := lastLine("\n \n"); got != "(nothing on stderr)" {
		t.Errorf("lastLine of blank: %q", got)
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{fromMillis(0.754), "0.75ms"}, {fromMillis(13.34), "13.3ms"}, {fromMillis(262.4), "262ms"},
		{fromMillis(1440), "1.44s"}, {fromMillis(12345), "12.3s"},
	} {
		if got := formatDuration(tc.d); got != tc.want {
			t.Errorf("formatDuration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	for _, tc := range []struct {
		r    float64
		want string
	}{{0, "-"}, {1, "1.00x"}, {0.187, "0.19x"}, {17.65, "17.65x"}, {250, "250x"}, {0.004, "0.0040x"}} {
		if got := formatRatio(tc.r); got != tc.want {
			t.Errorf("formatRatio(%v) = %q, want %q", tc.r, got, tc.want)
		}
	}
}

func TestValueRows(t *testing.T) {
	mib := func(v float64) func(context.Context) (float64, error) {
		return func(context.Context) (float64, error) { return v, nil }
	}
	subjects := []Subject{
		{Workload: "idle", Name: "vivarium sandbox", Reference: true, Measure: mib(20), Unit: "MiB"},
		{Workload: "idle", Name: "jupyter kernel", Peer: true, Measure: mib(70), Unit: "MiB"},
		{Workload: "idle", Name: "docker", Peer: true, Skip: "no docker daemon", Unit: "MiB"},
	}
	rep := Run(context.Background(), subjects, Options{Iterations: 3, Concurrency: 2, Duration: time.Second})
	if len(rep.Latency) != 0 || len(rep.Throughput) != 0 || len(rep.Values) != 3 {
		t.Fatalf("latency %d, throughput %d, values %d rows; want only 3 value rows",
			len(rep.Latency), len(rep.Throughput), len(rep.Values))
	}
	if r := rep.Values[1]; r.N != 3 || r.P50 != 70 || r.Unit != "MiB" || r.Ratio != 3.5 {
		t.Errorf("jupyter row %+v", r)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	if strings.Contains(b.String(), "Latency") {
		t.Errorf("a report without latency rows has a latency header:\n%s", b.String())
	}
	for _, want := range []string{
		"Other measurements",
		"  * vivarium sandbox    3  20.0 MiB  20.0 MiB  20.0 MiB  20.0 MiB    0   1.00x\n",
		"    jupyter kernel      3  70.0 MiB  70.0 MiB  70.0 MiB  70.0 MiB    0   3.50x\n",
		"    docker           skipped: no docker daemon\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// A row with Iterations of its own runs that many, after the warm-up
// rounds and in the same rounds as the others (a row that reads what
// another made in its round relies on it), and its Note is printed.
func TestRowIterationsAndNote(t *testing.T) {
	var events []string
	value := func(name string) func(context.Context) (float64, error) {
		return func(context.Context) (float64, error) {
			events = append(events, name)
			return float64(len(events)), nil
		}
	}
	subjects := []Subject{
		{Workload: "W", Name: "costly", Reference: true, Unit: "MiB", Measure: value("costly"), Iterations: 2},
		{Workload: "W", Name: "reads it", Unit: "sandboxes", Measure: value("reads"), Iterations: 2,
			Note: func() string { return "bound by memory" }},
		{Workload: "W", Name: "cheap", Unit: "MiB", Measure: value("cheap")},
	}
	rep := Run(context.Background(), subjects, Options{Iterations: 3, WarmUp: 1})
	want := []string{"cheap", "costly", "reads", "cheap", "costly", "reads", "cheap", "cheap"}
	if !slices.Equal(events, want) {
		t.Errorf("iterations\n%v\nwant\n%v", events, want)
	}
	if n := []int{rep.Values[0].N, rep.Values[1].N, rep.Values[2].N}; !slices.Equal(n, []int{2, 2, 3}) {
		t.Errorf("measured iterations %v, want [2 2 3]", n)
	}
	var b bytes.Buffer
	rep.WriteTable(&b)
	if !strings.Contains(b.String(), "      bound by memory\n") || rep.Values[1].Note != "bound by memory" {
		t.Errorf("the note is not printed under its row:\n%s", b.String())
	}
}

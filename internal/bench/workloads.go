package bench

// Workload is a piece of Python every row of a group runs.
type Workload struct {
	ID    string // "W1"
	Title string // what the table shows after the ID; the code when empty
	Code  string
	// Want is what the code prints; an iteration whose stdout does not
	// contain it failed.
	Want string
	// Init runs once in each warm interpreter before the iterations
	// (warm workloads only).
	Init string
}

// Label is the workload's heading in the report.
func (w Workload) Label() string {
	if w.Title != "" {
		return w.ID + " " + w.Title
	}
	return w.ID + " " + w.Code
}

// The workloads `vivarium bench` measures. W1 is start-up alone; W2 adds
// the import most AI-generated analysis code begins with; W3 is a round trip
// to an interpreter that is already running, where state persists.
var (
	W1 = Workload{ID: "W1", Code: "print(1)", Want: "1\n"}
	W2 = Workload{ID: "W2",
		Code: "import pandas as pd; print(pd.DataFrame({'a': [1, 2]}).sum())",
		Want: "a    3"}
	W3 = Workload{ID: "W3", Title: "warm round trip: x += 1 in a running interpreter",
		Code: "x += 1", Init: "x = 0"}
	W4 = Workload{ID: "W4", Title: "create a stateful sandbox, ready for code"}
	W5 = Workload{ID: "W5", Title: "idle stateful sandboxes that imported pandas: memory (PSS) of one, how many a host holds"}
)

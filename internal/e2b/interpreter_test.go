package e2b

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A sandbox killed while an execution runs drops the connection, as E2B's
// does (the SDKs then raise "the sandbox was killed"); an execution that
// ends on its own ends its stream as usual.
func TestInterpreterKilledSandboxDropsConnection(t *testing.T) {
	ts, _ := newTestServer(t)
	c := client{t, ts.URL}
	sb := c.create("key-a", `{}`)
	h := sandboxHeaders(sb, interpreterPort)
	req, _ := http.NewRequest("POST", ts.URL+"/e2b/sandbox/execute", strings.NewReader(`{"code":"out started\nsleep 1000\nout after"}`))
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("execute: %d", resp.StatusCode)
	}
	// Killed once the execution has started (its first line came).
	r := bufio.NewReader(resp.Body)
	first, err := r.ReadString('\n')
	if err != nil || !strings.Contains(first, "started") {
		t.Fatalf("first line %q: %v", first, err)
	}
	if resp, b := c.do("DELETE", "/e2b/sandboxes/"+sb.SandboxID, nil, map[string]string{"X-API-Key": "key-a"}); resp.StatusCode != 204 {
		t.Fatalf("kill: %d %s", resp.StatusCode, b)
	}
	rest, err := io.ReadAll(r)
	if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("the stream ended normally (%v) after the sandbox was killed: %q", err, rest)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(rest)), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && (m["type"] == "number_of_executions" || m["type"] == "error") {
			t.Fatalf("a killed sandbox's execution ended with %q", l)
		}
	}
}

func TestResultLineChartAndData(t *testing.T) {
	m := resultLine(sandbox.Output{Text: "<Figure>", Chart: json.RawMessage(`{"type":"pie","elements":[]}`),
		Data: json.RawMessage(`{"a":[1]}`)})
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	json.Unmarshal(b, &back)
	if back["chart"].(map[string]any)["type"] != "pie" || back["data"].(map[string]any)["a"].([]any)[0] != 1.0 {
		t.Errorf("%s", b)
	}
	if _, ok := resultLine(sandbox.Output{Text: "1"})["chart"]; ok {
		t.Error("a result without a chart has one")
	}
}

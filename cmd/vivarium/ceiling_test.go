package main

import (
	"encoding/json"
	"fmt"
	"testing"
)

// A server at its memory ceiling (--max-memory-total) refuses a new
// sandbox and a one-shot at once, 507 no_room saying why, rather than
// making room for them by killing what runs; a sandbox that already runs
// goes on executing; once memory is freed, sandboxes are made again.
// The ceiling is filled with files on two sandboxes' tmpfs roots, which
// the kernel cannot take back without removing them.
func TestServeRefusesSandboxesAtTheMemoryCeiling(t *testing.T) {
	needSandbox(t)
	srv := startServer(t, t.TempDir(), "--dev", "--zygote=false", "--preload", "", "--pool", "0",
		"--cgroup-parent", serveParent+"-ceiling", "--max-memory-total", "320MiB")
	create := func() (int, string) {
		t.Helper()
		code, body := req(t, "POST", srv.url+"/v1/sandboxes", nil, map[string]any{})
		var out struct {
			ID    string
			Error struct{ Code, Message string }
		}
		json.Unmarshal(body, &out)
		if code == 201 {
			return code, out.ID
		}
		return code, out.Error.Code + ": " + out.Error.Message
	}
	execute := func(id, code string) (status string) {
		t.Helper()
		c, body := req(t, "POST", srv.url+"/v1/sandboxes/"+id+"/execute", nil, map[string]any{"code": code})
		var out struct{ Status string }
		if err := json.Unmarshal(body, &out); err != nil || c != 200 {
			t.Fatalf("execute in %s: %d %s", id, c, body)
		}
		return out.Status
	}
	ids := make([]string, 3)
	for i := range ids {
		code, id := create()
		if code != 201 {
			t.Fatalf("sandbox %d, under the ceiling: %d %s", i, code, id)
		}
		ids[i] = id
	}
	running, fillers := ids[0], ids[1:]

	// 16 MiB more at a time, in turn on each filler's root, until a new
	// sandbox is refused: without the bound it never is, and the fillers'
	// roots (256 MiB each) outgrow the ceiling.
	var refused string
	for i := 0; i < 30 && refused == ""; i++ {
		execute(fillers[i%2], fmt.Sprintf("with open('/tmp/fill-%d', 'wb') as f:\n"+
			"    for _ in range(16): f.write(bytes(1 << 20))", i))
		switch code, msg := create(); code {
		case 201:
			if c, body := req(t, "DELETE", srv.url+"/v1/sandboxes/"+msg, nil, nil); c != 204 {
				t.Fatalf("close %s: %d %s", msg, c, body)
			}
		case 507:
			refused = msg
		default:
			t.Fatalf("a sandbox near the ceiling: %d %s", code, msg)
		}
	}
	if refused == "" {
		t.Fatalf("480 MiB written under a 320 MiB ceiling, and new sandboxes are still made")
	}
	t.Logf("refused: %s", refused)
	if code, body := req(t, "POST", srv.url+"/v1/execute", nil, map[string]any{"code": "print(1)"}); code != 507 {
		t.Errorf("a one-shot at the ceiling: %d %s, want 507", code, body)
	}
	if st := execute(running, "print(1)"); st != "ok" {
		t.Errorf("an execution in a sandbox made before the ceiling: %s, want ok", st)
	}

	for _, id := range fillers {
		if c, body := req(t, "DELETE", srv.url+"/v1/sandboxes/"+id, nil, nil); c != 204 {
			t.Fatalf("close %s: %d %s", id, c, body)
		}
	}
	if code, msg := create(); code != 201 {
		t.Errorf("a sandbox once the fillers are closed: %d %s", code, msg)
	}
}

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSandboxSubcommandFlags runs each subcommand of `vivarium sandbox`
// against a recording server: a flag it takes reaches the request, one it
// does not take is refused (exit status 2, its own flags listed) before
// anything is sent.
func TestSandboxSubcommandFlags(t *testing.T) {
	dir := t.TempDir()
	local := filepath.Join(dir, "local.txt")
	if err := os.WriteFile(local, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	testSubcommandFlags(t, sandboxCmd, []subcommandCase{
		{"create", []string{"--memory", "1GiB", "--idle-timeout", "90s"}, `POST /v1/sandboxes {`, []string{"--count", "2"}},
		{"list", []string{"--json"}, `GET /v1/sandboxes `, []string{"--timeout", "1s"}},
		{"info", []string{"sb_1", "--json"}, `GET /v1/sandboxes/sb_1 `, []string{"sb_1", "--env", "A=b"}},
		{"exec", []string{"sb_1", "--timeout", "2s", "-c", "1"}, `POST /v1/sandboxes/sb_1/execute {"code":"1","env":{},"timeout_s":2}`, []string{"sb_1", "--memory", "1G", "-c", "1"}},
		{"run", []string{"--pids", "5", "-c", "1"}, `"limits":{"pids":5}`, []string{"--volume", "v:/mnt/v", "-c", "1"}},
		{"sh", []string{"sb_1", "--env", "A=b", "true"}, `POST /v1/sandboxes/sb_1/commands {"cmd":"true","env":{"A":"b"}}`, []string{"sb_1", "-c", "true"}},
		{"term", nil, "", []string{"sb_1", "--json"}},
		{"install", []string{"sb_1", "pkg==1.0", "--json"}, `POST /v1/sandboxes/sb_1/packages {"name":"pkg","version":"1.0"}`, []string{"sb_1", "pkg", "--memory", "1G"}},
		{"network", []string{"sb_1", "--deny-net", "10.0.0.0/8", "--all-net"}, `PUT /v1/sandboxes/sb_1/network {"all":true,"deny":["10.0.0.0/8"]}`, []string{"sb_1", "--memory", "1G"}},
		{"files", []string{"sb_1", "--json", "data"}, `GET /v1/sandboxes/sb_1/files?path=data `, []string{"sb_1", "--env", "A=b"}},
		{"put", []string{"sb_1", local, "x/y.txt", "--json"}, `PUT /v1/sandboxes/sb_1/files/x/y.txt data`, []string{"sb_1", local, "--name", "n"}},
		{"get", []string{"sb_1", "x/y.txt", "-"}, `GET /v1/sandboxes/sb_1/files/x/y.txt `, []string{"sb_1", "x/y.txt", "-", "--json"}},
		{"rm", []string{"sb_1", "x/y.txt"}, `DELETE /v1/sandboxes/sb_1/files/x/y.txt `, []string{"sb_1", "x/y.txt", "-", "--json"}},
		{"interrupt", []string{"sb_1", "--json"}, `POST /v1/sandboxes/sb_1/interrupt `, []string{"sb_1", "--timeout", "1s"}},
		{"restart", []string{"sb_1", "--json"}, `POST /v1/sandboxes/sb_1/restart `, []string{"sb_1", "--env", "A=b"}},
		{"pause", []string{"sb_1", "--json"}, `POST /v1/sandboxes/sb_1/pause `, []string{"sb_1", "--idle-timeout", "1m"}},
		{"resume", []string{"sb_1", "--json"}, `POST /v1/sandboxes/sb_1/resume `, []string{"sb_1", "--count", "2"}},
		{"fork", []string{"sb_1", "--count", "3", "--same-random"}, `POST /v1/sandboxes/sb_1/fork {"count":3,"same_random_state":true}`, []string{"sb_1", "--name", "n"}},
		{"snapshot", []string{"sb_1", "--name", "ready"}, `POST /v1/sandboxes/sb_1/snapshots {"name":"ready"}`, []string{"sb_1", "--count", "2"}},
		{"snapshots", []string{"--json"}, `GET /v1/snapshots `, []string{"--name", "n"}},
		{"snapshot-rm", []string{"snap_1"}, `DELETE /v1/snapshots/snap_1 `, []string{"snap_1", "--json"}},
		{"snapshot-export", []string{"snap_1", "-"}, `GET /v1/snapshots/snap_1/export `, []string{"snap_1", "-", "--json"}},
		{"snapshot-import", []string{local, "--json"}, `POST /v1/snapshots/import data`, []string{local, "--name", "n"}},
		{"kill", []string{"sb_1", "sb_2"}, `DELETE /v1/sandboxes/sb_2 `, []string{"sb_1", "--json"}},
	})
}

// TestSandboxSubcommandHelp: -h prints the subcommand's own usage and
// flags, none of another's.
func TestSandboxSubcommandHelp(t *testing.T) {
	for _, args := range [][]string{{"sandbox", "exec", "-h"}, {"sandbox", "help", "exec"}} {
		r := vivarium(t, "", args...)
		if r.code != 0 || !strings.Contains(r.stderr, "Usage: vivarium sandbox exec ID") ||
			!strings.Contains(r.stderr, "-timeout") || strings.Contains(r.stderr, "-memory") {
			t.Errorf("%v: exit status %d: %s", args, r.code, r.stderr)
		}
	}
	r := vivarium(t, "", "sandbox", "kill", "-h")
	if r.code != 0 || !strings.Contains(r.stderr, "It takes no flags") {
		t.Errorf("kill -h: exit status %d: %s", r.code, r.stderr)
	}
	// A wrong value is a usage error too.
	r = vivarium(t, "", "sandbox", "create", "--memory", "lots")
	if r.code != 2 || !strings.Contains(r.stderr, "invalid size") || !strings.Contains(r.stderr, "Usage: vivarium sandbox create") {
		t.Errorf("create --memory lots: exit status %d: %s", r.code, r.stderr)
	}
}

// TestDocsSandboxFlags checks the table of `vivarium sandbox`'s flags in
// the docs against the flag sets.
func TestDocsSandboxFlags(t *testing.T) { testDocsSubcommandFlags(t, sandboxCmd) }

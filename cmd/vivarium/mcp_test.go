package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// `vivarium mcp` on stdio, as an agent starts it: a session that runs code
// and ends when standard input closes.
func TestMCPStdio(t *testing.T) {
	needSandbox(t)
	cmd := exec.Command(os.Args[0], "mcp", "--memory", "256MiB")
	cmd.Env = append(os.Environ(), "VIVARIUM_TEST_MAIN=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	for _, msg := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_python","arguments":{"code":"print('hi')\n6 * 7"}}}`,
	} {
		io.WriteString(stdin, msg+"\n")
	}
	var got struct {
		ID     int
		Result struct {
			Content []struct{ Type, Text string }
			IsError bool
		}
	}
	sc := bufio.NewScanner(stdout)
	for got.ID != 2 && sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &got); err != nil {
			t.Fatalf("not JSON-RPC on stdout: %q", sc.Text())
		}
	}
	if got.ID != 2 || got.Result.IsError || len(got.Result.Content) != 2 ||
		got.Result.Content[0].Text != "stdout:\nhi\n" || got.Result.Content[1].Text != "result:\n42" {
		t.Fatalf("run_python: %+v\nstderr: %s", got, stderr.String())
	}
	// The agent closes the pipe: the server ends, exit status 0.
	stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("vivarium mcp did not exit when its input closed")
	}
}

func TestMCPRefusesBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stray"}, "unexpected arguments"},
		{[]string{"--memory", "1KiB"}, "memory must be"},
		{[]string{"--exec-timeout", "10m"}, "--exec-timeout"},
		{[]string{"--log-level", "loud"}, "--log-level"},
	} {
		r := vivarium(t, "", append([]string{"mcp"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("mcp %v: exit %d, stderr %q; want 2 and %q", c.args, r.code, r.stderr, c.want)
		}
	}
}

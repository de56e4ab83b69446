package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// terminal runs a command of sandbox sb (a /v1 path) in a terminal of
// the server's and attaches this process's standard streams to it, as ssh
// does: what is typed goes to the sandbox raw (Ctrl-C included), what the
// terminal shows comes back as it is, and a resize of this terminal
// resizes the sandbox's. It returns the command's exit status.
//
// The command waits for a line before it starts, sent once its output is
// followed, so that nothing it prints first (a prompt) is missed.
func (c *apiClient) terminal(sb string, command string) int {
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	rows, cols := uint16(24), uint16(80)
	if ws, err := unix.IoctlGetWinsize(out, unix.TIOCGWINSZ); err == nil && ws.Row > 0 && ws.Col > 0 {
		rows, cols = ws.Row, ws.Col
	}
	req := map[string]any{
		"cmd":      "stty -echo; IFS= read -r _; stty echo; " + command,
		"terminal": map[string]any{"rows": rows, "cols": cols},
	}
	var started struct{ PID int }
	if _, err := c.call("POST", sb+"/processes", req, &started); err != nil {
		return clientFail("sandbox term", err)
	}
	proc := fmt.Sprintf("%s/processes/%d", sb, started.PID)
	resp, err := c.do("GET", proc+"/output", nil, "", "application/x-ndjson")
	if err != nil {
		return clientFail("sandbox term", err)
	}
	defer resp.Body.Close()

	// This terminal, if it is one, passes every key on: the sandbox's
	// terminal does the echo, line editing and signals.
	if old, err := unix.IoctlGetTermios(in, unix.TCGETS); err == nil {
		raw := *old
		raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
		raw.Oflag &^= unix.OPOST
		raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		raw.Cflag &^= unix.CSIZE | unix.PARENB
		raw.Cflag |= unix.CS8
		raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
		if unix.IoctlSetTermios(in, unix.TCSETS, &raw) == nil {
			defer unix.IoctlSetTermios(in, unix.TCSETS, old)
		}
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go func() {
		for range winch {
			if ws, err := unix.IoctlGetWinsize(out, unix.TIOCGWINSZ); err == nil && ws.Row > 0 && ws.Col > 0 {
				c.call("POST", proc+"/resize", map[string]any{"rows": ws.Row, "cols": ws.Col}, nil)
			}
		}
	}()

	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev struct {
			Type    string `json:"type"`
			Data    []byte `json:"data"`
			Text    string `json:"text"`
			Summary *struct {
				ExitCode int `json:"exit_code"`
			} `json:"summary"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			fmt.Fprintf(os.Stderr, "vivarium: malformed event from the server: %v\r\n", err)
			return 1
		}
		switch ev.Type {
		case "start":
			// Followed: the command may start, and what is typed goes to it.
			if err := c.typeIn(proc, []byte("\n")); err != nil {
				return clientFail("sandbox term", err)
			}
			go c.forwardInput(proc)
		case "terminal":
			os.Stdout.Write(ev.Data)
		case "stderr":
			os.Stderr.WriteString(ev.Text) // the server's own notes
		case "end":
			if ev.Summary != nil {
				return ev.Summary.ExitCode
			}
			return 1
		}
	}
	fmt.Fprintln(os.Stderr, "vivarium: the server ended the stream early")
	return 1
}

// forwardInput sends what this process reads to the sandbox's terminal,
// in order, until its input ends.
func (c *apiClient) forwardInput(proc string) {
	buf := make([]byte, 32<<10)
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 && c.typeIn(proc, buf[:n]) != nil {
			return
		}
		if err != nil {
			return
		}
	}
}

func (c *apiClient) typeIn(proc string, p []byte) error {
	resp, err := c.do("POST", proc+"/stdin", bytes.NewReader(p), "application/octet-stream", "")
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

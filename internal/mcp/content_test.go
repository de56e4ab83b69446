package mcp

import (
	"encoding/base64"
	"strings"
	"testing"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

func TestTruncate(t *testing.T) {
	for _, c := range []struct {
		in        string
		max       int
		keep      string // must remain
		truncated bool
	}{
		{"short", 10, "short", false},
		{strings.Repeat("a", 100) + "END", 20, "END", true},
		{"START" + strings.Repeat("é", 100), 20, "START", true},
		{strings.Repeat("日本", 50), 11, "", true},
	} {
		got := truncate(c.in, c.max, "stdout")
		if !utf8.ValidString(got) {
			t.Errorf("%.20q: invalid UTF-8 after truncation", c.in)
		}
		if !strings.Contains(got, c.keep) {
			t.Errorf("%.20q: lost %q: %q", c.in, c.keep, got)
		}
		if has := strings.Contains(got, "bytes of stdout dropped"); has != c.truncated {
			t.Errorf("%.20q: note %v, want %v: %q", c.in, has, c.truncated, got)
		}
		if c.truncated {
			body := got[:strings.Index(got, "\n[...")] + got[strings.LastIndex(got, "]\n")+2:]
			if len(body) > c.max {
				t.Errorf("%.20q: kept %d bytes, max %d", c.in, len(body), c.max)
			}
		}
	}
}

func TestExecContent(t *testing.T) {
	png := base64.StdEncoding.EncodeToString([]byte("\x89PNG\r\n\x1a\nfake"))
	res := &sandbox.Result{
		Status: sandbox.StatusError, Stdout: "out\n", Stderr: "warn\n", StderrTruncated: true,
		Results: []sandbox.Output{
			{Text: "<Figure size 640x480 with 1 Axes>", PNG: png},
			{Text: "   a\n0  1", HTML: "<table></table>", IsMainResult: true},
		},
		Error: &sandbox.Error{Name: "ValueError", Value: "bad", Traceback: "Traceback (most recent call last):\nValueError: bad\n"},
	}
	got := execContent(res, 3, 1000)
	if !got.IsError {
		t.Error("an exception must be an error result")
	}
	var kinds []string
	for _, c := range got.Content {
		switch c := c.(type) {
		case *sdk.TextContent:
			kinds = append(kinds, strings.SplitN(c.Text, "\n", 2)[0])
		case *sdk.ImageContent:
			kinds = append(kinds, "image "+c.MIMEType)
		}
	}
	want := []string{"stdout:", "stderr:", "image image/png", "Out[3]:", "Traceback (most recent call last):"}
	if strings.Join(kinds, "|") != strings.Join(want, "|") {
		t.Fatalf("content %q, want %q", kinds, want)
	}
	if s := got.Content[1].(*sdk.TextContent).Text; !strings.Contains(s, "dropped stderr past its output limit") {
		t.Errorf("sandbox truncation not noted: %q", s)
	}

	timeout := execContent(&sandbox.Result{Status: sandbox.StatusTimeout, StateLost: true,
		Error: &sandbox.Error{Name: "TimeoutError", Value: "execution exceeded the 1s wall-clock limit"}}, 1, 1000)
	all := ""
	for _, c := range timeout.Content {
		all += c.(*sdk.TextContent).Text + "\n"
	}
	if !timeout.IsError || !strings.Contains(all, "wall-clock limit (status timeout)") || !strings.Contains(all, "variables and imports are gone") {
		t.Errorf("timeout: %q", all)
	}
}

func TestFileContent(t *testing.T) {
	for _, c := range []struct {
		data  string
		image string
		text  string
	}{
		{"\x89PNG\r\n\x1a\n...", "image/png", ""},
		{"\xff\xd8\xff\xe0...", "image/jpeg", ""},
		{"hello\n", "", "hello\n"},
		{"\x00\x01\x02binary", "", "binary file of 9 bytes"},
	} {
		res := fileContent("f", []byte(c.data), int64(len(c.data)), 100)
		switch v := res.Content[0].(type) {
		case *sdk.ImageContent:
			if v.MIMEType != c.image {
				t.Errorf("%q: image %s, want %q", c.data, v.MIMEType, c.image)
			}
		case *sdk.TextContent:
			if c.image != "" || !strings.Contains(v.Text, c.text) {
				t.Errorf("%q: text %q", c.data, v.Text)
			}
		}
	}
}

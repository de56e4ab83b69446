package mcp

import (
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// Bounds of what one tool result carries back to the model. A model's
// context is the scarce resource: a megabyte of output helps nobody, and a
// note saying what was dropped tells it to print less.
const (
	DefaultMaxText = 20_000  // bytes of each text block
	maxImages      = 8       // images per result
	maxImageBytes  = 8 << 20 // bytes of images per result, decoded
)

// truncate keeps the head and the tail of s within max bytes (the end of a
// traceback or a log is often what matters) and says in the middle how much
// was dropped.
func truncate(s string, max int, what string) string {
	if len(s) <= max {
		return s
	}
	head, tail := max/2, max-max/2
	for head > 0 && !utf8.RuneStart(s[head]) {
		head--
	}
	start := len(s) - tail
	for start < len(s) && !utf8.RuneStart(s[start]) {
		start++
	}
	dropped := start - head
	return fmt.Sprintf("%s\n[... %d bytes of %s dropped here; print less, or write it to a file and read parts of it ...]\n%s",
		s[:head], dropped, what, s[start:])
}

func text(s string) *sdk.TextContent { return &sdk.TextContent{Text: s} }

// execContent turns an execution's Result into MCP content: what the code
// printed, its values as text, images as image content, and the error with
// Python's own traceback, which models debug best from. count is the
// execution's number in a stateful sandbox (0 for a one-shot run).
func execContent(res *sandbox.Result, count, maxText int) *sdk.CallToolResult {
	var out []sdk.Content
	stream := func(name, s string, cut bool) {
		if s == "" && !cut {
			return
		}
		body := truncate(s, maxText, name)
		if cut {
			body += fmt.Sprintf("\n[... the sandbox dropped %s past its output limit ...]", name)
		}
		out = append(out, text(name+":\n"+body))
	}
	stream("stdout", res.Stdout, res.StdoutTruncated)
	stream("stderr", res.Stderr, res.StderrTruncated)

	images, imageBytes, droppedImages := 0, 0, 0
	for _, r := range res.Results {
		label := "display"
		if r.IsMainResult {
			label = "result"
			if count > 0 {
				label = fmt.Sprintf("Out[%d]", count)
			}
		}
		if img, mime := image(r); img != nil {
			if images >= maxImages || imageBytes+len(img) > maxImageBytes {
				droppedImages++
				continue
			}
			images++
			imageBytes += len(img)
			out = append(out, &sdk.ImageContent{Data: img, MIMEType: mime})
			continue
		}
		if s := resultText(r); s != "" {
			out = append(out, text(label+":\n"+truncate(s, maxText, label)))
		}
	}
	if droppedImages > 0 {
		out = append(out, text(fmt.Sprintf("[... %d more images dropped: at most %d images or %d MiB per call ...]",
			droppedImages, maxImages, maxImageBytes>>20)))
	}

	if e := res.Error; e != nil && res.Status != sandbox.StatusOK {
		switch {
		case e.Traceback != "":
			out = append(out, text(truncate(e.Traceback, maxText, "traceback")))
		case e.Name == "SystemExit":
			out = append(out, text(fmt.Sprintf("SystemExit: the code called sys.exit(%s)", e.Value)))
		default:
			out = append(out, text(fmt.Sprintf("%s: %s (status %s)", e.Name, e.Value, res.Status)))
		}
	}
	if res.StateLost {
		out = append(out, text("note: the sandbox's Python process was restarted, so variables and imports are gone; "+
			"files in the workspace are kept. Re-run the code that set up the state you need."))
	}
	if len(out) == 0 {
		out = append(out, text("(the code ran and printed nothing; print() the values you want to see)"))
	}
	return &sdk.CallToolResult{Content: out, IsError: res.Status != sandbox.StatusOK}
}

// image decodes a PNG or JPEG result.
func image(r sandbox.Output) ([]byte, string) {
	for _, c := range []struct{ b64, mime string }{{r.PNG, "image/png"}, {r.JPEG, "image/jpeg"}} {
		if c.b64 == "" {
			continue
		}
		if b, err := base64.StdEncoding.DecodeString(c.b64); err == nil {
			return b, c.mime
		}
	}
	return nil, ""
}

// resultText is the best text form of a result for a model: plain text
// (a DataFrame's text table reads better than its HTML), then the richer
// text formats.
func resultText(r sandbox.Output) string {
	for _, s := range []string{r.Text, r.Markdown, string(r.JSON), r.LaTeX, r.HTML, r.SVG} {
		if s != "" {
			return s
		}
	}
	return ""
}

// commandContent is a shell command's outcome as MCP content.
func commandContent(res *service.CommandResult, maxText int) *sdk.CallToolResult {
	var out []sdk.Content
	if res.Stdout != "" || res.StdoutTruncated {
		out = append(out, text("stdout:\n"+truncate(res.Stdout, maxText, "stdout")))
	}
	if res.Stderr != "" || res.StderrTruncated {
		out = append(out, text("stderr:\n"+truncate(res.Stderr, maxText, "stderr")))
	}
	status := fmt.Sprintf("exit code %d", res.ExitCode)
	if res.Error != "" {
		status += ": " + res.Error
	}
	out = append(out, text(status))
	return &sdk.CallToolResult{Content: out, IsError: res.Status != sandbox.StatusOK}
}

// fileContent shows a workspace file to a model: images as images, text
// as text, anything else described.
func fileContent(name string, data []byte, size int64, maxText int) *sdk.CallToolResult {
	switch {
	case strings.HasPrefix(string(data), "\x89PNG\r\n\x1a\n"):
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.ImageContent{Data: data, MIMEType: "image/png"}}}
	case strings.HasPrefix(string(data), "\xff\xd8\xff"):
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.ImageContent{Data: data, MIMEType: "image/jpeg"}}}
	case strings.HasPrefix(string(data), "GIF87a"), strings.HasPrefix(string(data), "GIF89a"):
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.ImageContent{Data: data, MIMEType: "image/gif"}}}
	case !utf8.Valid(data) || strings.ContainsRune(string(data), 0):
		return &sdk.CallToolResult{Content: []sdk.Content{text(fmt.Sprintf(
			"%s is a binary file of %d bytes; it cannot be shown as text. Inspect it with run_python "+
				"(for example, open it with the library that reads its format).", name, size))}}
	}
	s := truncate(string(data), maxText, "the file")
	if int64(len(data)) < size {
		s += fmt.Sprintf("\n[... only the first %d of %d bytes were read ...]", len(data), size)
	}
	return &sdk.CallToolResult{Content: []sdk.Content{text(s)}}
}

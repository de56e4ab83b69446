package wasm

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/runner"
)

func frames(t *testing.T, evs ...any) []byte {
	t.Helper()
	var b bytes.Buffer
	for _, ev := range evs {
		if err := runner.WriteFrame(&b, ev); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// Frames split anywhere arrive whole and in order; a flood written at once
// is handled frame by frame, never buffered whole.
func TestChannelFrames(t *testing.T) {
	c := newChannel()
	var got []string
	c.onEvent = func(ev runner.Event) { got = append(got, ev.Type+":"+ev.Name) }
	data := frames(t, runner.Event{Type: "result"}, runner.Event{Type: "error", Name: "E"}, runner.Event{Type: "done"})
	for _, b := range data {
		c.write([]byte{b})
	}
	if strings.Join(got, ",") != "result:,error:E,done:" {
		t.Fatalf("events %q", got)
	}
	got = nil
	one := frames(t, runner.Event{Type: "result"})
	size := 40 << 20
	if testing.Short() {
		size = maxFrame * 5 / 4 // still more than the buffer may hold
	}
	flood := bytes.Repeat(one, size/len(one))
	c.write(flood)
	if len(got) != size/len(one) || cap(c.in) > maxFrame+4 {
		t.Fatalf("%d events, buffer of %d bytes", len(got), cap(c.in))
	}
}

func TestChannelBroken(t *testing.T) {
	for name, data := range map[string][]byte{
		"too large": {0x7f, 0xff, 0xff, 0xff, 'x'},
		"not json":  {0, 0, 0, 3, 'a', 'b', 'c'},
		"no type":   {0, 0, 0, 2, '{', '}'},
	} {
		c := newChannel()
		n := 0
		c.onEvent = func(runner.Event) { n++ }
		c.write(data)
		c.write(frames(t, runner.Event{Type: "done"}))
		if err := c.brokenErr(); err == nil || n != 0 {
			t.Errorf("%s: broken %v, %d events after it", name, err, n)
		}
		if name == "too large" && !errors.Is(c.brokenErr(), runner.ErrFrameTooLarge) {
			t.Errorf("%s: %v", name, c.brokenErr())
		}
	}
}

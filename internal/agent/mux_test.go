package agent

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFramesRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	big := bytes.Repeat([]byte("x"), MaxFrame+10)
	if err := w.Ctl(Ctl{Op: OpSpawn, ID: 7, Argv: []string{"sh", "-c", "true"}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(KindData, RequestStream(3), []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(KindData, StreamStdout, big); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(KindClose, EventStream(3), nil); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)
	want := []struct {
		kind   byte
		stream uint32
		n      int
	}{{KindCtl, 0, -1}, {KindData, RequestStream(3), 3}, {KindData, StreamStdout, MaxFrame}, {KindData, StreamStdout, 10},
		{KindClose, EventStream(3), 0}}
	for i, w := range want {
		f, err := r.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if f.Kind != w.kind || f.Stream != w.stream || (w.n >= 0 && len(f.Data) != w.n) {
			t.Fatalf("frame %d: kind %d stream %d, %d bytes; want %+v", i, f.Kind, f.Stream, len(f.Data), w)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v", err)
	}
}

func TestStreamsDoNotOverlap(t *testing.T) {
	seen := map[uint32]string{StreamStdout: "stdout", StreamStderr: "stderr"}
	add := func(s uint32, what string) {
		if prev, ok := seen[s]; ok {
			t.Fatalf("stream %d is both %s and %s", s, prev, what)
		}
		seen[s] = what
	}
	for gen := uint32(1); gen < 200; gen++ {
		add(RequestStream(gen), "requests")
		add(EventStream(gen), "events")
	}
	for id := uint32(1); id < 200; id++ {
		in, out, errs := CommandStreams(id)
		add(in, "stdin")
		add(out, "cmd stdout")
		add(errs, "cmd stderr")
	}
}

func TestBadFramesAreRefused(t *testing.T) {
	for name, b := range map[string][]byte{
		"unknown kind":   {9, 0, 0, 0, 1, 0, 0, 0, 0},
		"too large":      {KindData, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff},
		"truncated head": {KindData, 0, 0},
		"truncated body": {KindData, 0, 0, 0, 1, 0, 0, 0, 5, 'a'},
		"kind zero":      {0, 0, 0, 0, 1, 0, 0, 0, 0},
	} {
		_, err := NewReader(bytes.NewReader(b)).Next()
		if !errors.Is(err, ErrBadFrame) {
			t.Errorf("%s: %v, want ErrBadFrame", name, err)
		}
	}
}

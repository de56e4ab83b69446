package jsonerr

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)+'`)

type limits struct {
	Memory int64   `json:"memory"`
	CPUs   float64 `json:"cpus"`
	Port   uint16  `json:"port"`
}

type request struct {
	Limits limits            `json:"limits"`
	Env    map[string]string `json:"env"`
	Argv   []string          `json:"argv"`
	Stream bool              `json:"stream"`
	P      *limits           `json:"p"`
}

func decode(in string) error {
	dec := json.NewDecoder(strings.NewReader(in))
	dec.DisallowUnknownFields()
	var r request
	return dec.Decode(&r)
}

func TestMessages(t *testing.T) {
	for in, want := range map[string]string{
		`{"limits":{"memory":1e30}}`:   "limits.memory: expected an integer in range, got number 1e30",
		`{"limits":{"memory":1.5}}`:    "limits.memory: expected an integer in range, got number 1.5",
		`{"limits":{"memory":"lots"}}`: "limits.memory: expected an integer in range, got a string",
		`{"limits":{"port":-1}}`:       "limits.port: expected a non-negative integer in range, got number -1",
		`{"limits":{"cpus":[]}}`:       "limits.cpus: expected a number, got an array",
		`{"env":{"A":1}}`:              "env: expected a string, got a number",
		`{"env":[]}`:                   "env: expected an object, got an array",
		`{"argv":"ls"}`:                "argv: expected an array, got a string",
		`{"stream":"yes"}`:             "stream: expected true or false, got a string",
		`{"limits":true}`:              "limits: expected an object, got true or false",
		`{"p":{"memory":{}}}`:          "p.memory: expected an integer in range, got an object",
		`[1, 2]`:                       "expected an object, got an array",
		`{"nope":1}`:                   `unknown field "nope"`,
		`{"limits":`:                   "the JSON ends too early",
		`{"a":}`:                       "invalid JSON at byte 6: invalid character '}' looking for beginning of value",
	} {
		err := decode(in)
		if err == nil {
			t.Errorf("%s decoded", in)
			continue
		}
		got := Message(err)
		if got != want {
			t.Errorf("%s:\n got %q\nwant %q", in, got, want)
		}
	}
}

// No message shows Go: its package prefix, struct names or types.
func FuzzMessage(f *testing.F) {
	for _, s := range []string{`{"limits":{"memory":1e30}}`, `{"env":{"A":1}}`, `[`, `{"limits":[]}`, `{"x":1}`, `"s"`, `{"p":{"port":1e9}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		err := decode(in)
		if err == nil {
			return
		}
		// What the client sent comes back quoted; the rest is ours.
		msg := quoted.ReplaceAllString(Message(err), `""`)
		for _, leak := range []string{"json:", "Go ", "jsonerr.", "int64", "uint16", "float64", "map[", "[]string", "request", "limits{"} {
			if strings.Contains(msg, leak) {
				t.Errorf("%q: message %q shows %q", in, msg, leak)
			}
		}
	})
}

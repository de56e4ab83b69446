package template

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func parse(t *testing.T, src string, args map[string]string) (Spec, []string) {
	t.Helper()
	spec, notes, err := ParseDockerfile(strings.NewReader(src), args)
	if err != nil {
		t.Fatalf("ParseDockerfile: %v\n%s", err, src)
	}
	if err := spec.Validate(); err != nil {
		t.Fatalf("the parsed build is not valid: %v", err)
	}
	return spec, notes
}

func steps(s ...Step) []Step { return s }

func TestDockerfileInstructions(t *testing.T) {
	for _, c := range []struct {
		name  string
		src   string
		args  map[string]string
		want  []Step
		check func(t *testing.T, s Spec)
	}{
		{name: "FROM", src: "FROM python:3.12-slim AS build\n",
			check: func(t *testing.T, s Spec) {
				if s.FromImage != "python:3.12-slim" {
					t.Errorf("FromImage %q", s.FromImage)
				}
			}},
		{name: "FROM with an ARG", src: "ARG TAG=3.11\nFROM python:${TAG}\n", args: map[string]string{"TAG": "3.13"},
			check: func(t *testing.T, s Spec) {
				if s.FromImage != "python:3.13" {
					t.Errorf("FromImage %q", s.FromImage)
				}
			}},
		{name: "RUN, shell and exec forms, continued", src: "FROM x\nRUN apt-get update && \\\n    # a comment inside\n    apt-get install -y curl\nRUN [\"echo\", \"a b\", \"c\"]\n",
			want: steps(Step{Type: Run, Args: []string{"apt-get update &&     apt-get install -y curl"}},
				Step{Type: Run, Args: []string{"echo 'a b' c"}})},
		{name: "RUN sees build arguments, not ENV of the same name", src: "FROM x\nARG A=1\nARG B\nENV B=env\nRUN echo $A\n", args: map[string]string{"B": "2"},
			want: steps(Step{Type: Env, Args: []string{"B", "env"}}, Step{Type: Run, Args: []string{"echo $A"}, BuildArgs: []string{"A=1"}})},
		// As Docker: an ENV's values are expanded with what was set
		// before it, not by the same instruction.
		{name: "ENV, both forms, expanded", src: "FROM x\nENV A=1 B=\"two words\" C=${A}x\nENV D the old form\nENV E=$UNSET F=${UNSET:-def} G=${A:+alt} H='$A'\n",
			want: steps(Step{Type: Env, Args: []string{"A", "1", "B", "two words", "C", "x"}},
				Step{Type: Env, Args: []string{"D", "the old form"}},
				Step{Type: Env, Args: []string{"E", "", "F", "def", "G", "alt", "H", "$A"}})},
		{name: "COPY and ADD", src: "FROM x\nWORKDIR /app\nCOPY --chown=user:user --chmod=755 a.py b.py lib/\nADD [\"data dir\", \"/srv/data\"]\nCOPY /abs.txt ./\n",
			want: steps(Step{Type: Workdir, Args: []string{"/app"}},
				Step{Type: Copy, Args: []string{"a.py", "/app/lib/", "user:user", "755"}},
				Step{Type: Copy, Args: []string{"b.py", "/app/lib/", "user:user", "755"}},
				Step{Type: Add, Args: []string{"data dir", "/srv/data", "", ""}},
				Step{Type: Copy, Args: []string{"abs.txt", "/app/", "", ""}})},
		{name: "WORKDIR, relative to the last", src: "FROM x\nENV BASE=/opt\nWORKDIR $BASE\nWORKDIR tool/../app\n",
			want: steps(Step{Type: Env, Args: []string{"BASE", "/opt"}}, Step{Type: Workdir, Args: []string{"/opt"}},
				Step{Type: Workdir, Args: []string{"/opt/app"}})},
		{name: "USER", src: "FROM x\nARG U=agent\nUSER ${U}\n", want: steps(Step{Type: User, Args: []string{"agent"}})},
		{name: "LABEL", src: "FROM x\nLABEL a=1 \"b c\"=\"d e\"\n",
			check: func(t *testing.T, s Spec) {
				if !reflect.DeepEqual(s.Labels, map[string]string{"a": "1", "b c": "d e"}) {
					t.Errorf("labels %v", s.Labels)
				}
			}},
		{name: "CMD, shell form", src: "FROM x\nCMD python3 -m http.server 8000\n",
			check: func(t *testing.T, s Spec) { wantStart(t, s, "python3 -m http.server 8000") }},
		{name: "CMD, exec form", src: "FROM x\nCMD [\"python3\", \"-c\", \"print('hi there')\"]\n",
			check: func(t *testing.T, s Spec) { wantStart(t, s, `python3 -c 'print('\''hi there'\'')'`) }},
		{name: "ENTRYPOINT and CMD", src: "FROM x\nENTRYPOINT [\"/usr/bin/tini\", \"--\"]\nCMD [\"serve\", \"--port\", \"80\"]\n",
			check: func(t *testing.T, s Spec) { wantStart(t, s, "/usr/bin/tini -- serve --port 80") }},
		{name: "ENTRYPOINT in shell form leaves CMD out", src: "FROM x\nENTRYPOINT exec serve\nCMD [\"ignored\"]\n",
			check: func(t *testing.T, s Spec) { wantStart(t, s, "exec serve") }},
		{name: "the escape directive", src: "# escape=`\nFROM x\nRUN echo a `\n  b\n",
			want: steps(Step{Type: Run, Args: []string{"echo a   b"}})},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := parse(t, c.src, c.args)
			if c.want != nil && !reflect.DeepEqual(s.Steps, c.want) {
				t.Errorf("steps\n got %+v\nwant %+v", s.Steps, c.want)
			}
			if c.check != nil {
				c.check(t, s)
			}
		})
	}
}

func wantStart(t *testing.T, s Spec, want string) {
	t.Helper()
	if s.StartCmd != want {
		t.Errorf("StartCmd %q, want %q", s.StartCmd, want)
	}
}

func TestDockerfileNotes(t *testing.T) {
	_, notes := parse(t, "FROM x\nEXPOSE 80\nVOLUME /data\n", nil)
	if len(notes) != 2 || !strings.Contains(notes[0], "line 2: EXPOSE") {
		t.Errorf("notes: %q", notes)
	}
}

func TestDockerfileRefused(t *testing.T) {
	for _, c := range []struct{ src, says string }{
		{"RUN echo\n", "line 1: RUN before FROM"},
		{"FROM a\nFROM b\n", "line 2: a second FROM"},
		{"FROM scratch\n", "FROM scratch"},
		{"", "no FROM"},
		{"FROM x\nCOPY --from=build /a /b\n", "multi-stage"},
		{"FROM x\nADD https://example.com/a.tgz /a\n", "of a URL"},
		{"FROM x\nCOPY ../secret /a\n", "outside the build's files"},
		{"FROM x\nCOPY a b dest\n", "ending in /"},
		{"FROM x\nRUN --mount=type=cache,target=/root/.cache pip install x\n", "RUN --mount"},
		{"FROM x\nRUN <<EOF\necho\nEOF\n", "heredoc"},
		{"FROM x\nSHELL [\"/bin/bash\", \"-c\"]\n", "SHELL is not supported"},
		{"FROM x\nFROBNICATE\n", `unknown instruction "FROBNICATE"`},
		{"FROM x\nENV A=\"unclosed\n", "unclosed"},
		{"FROM x\nENV A=${B/x/y}\n", "not a variable"},
		{"FROM x\nCOPY --chmod=rwx a /b\n", "octal"},
	} {
		_, _, err := ParseDockerfile(strings.NewReader(c.src), nil)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%q: err = %v, want one saying %q", c.src, err, c.says)
		}
	}
	if _, _, err := ParseDockerfile(strings.NewReader("FROM x\n"), map[string]string{"NOPE": "1"}); err == nil ||
		!strings.Contains(err.Error(), "declares no ARG NOPE") {
		t.Errorf("an undeclared --build-arg: %v", err)
	}
	if _, _, err := ParseDockerfile(strings.NewReader("FROM x\nRUN "+strings.Repeat("x", 2<<20)+"\n"), nil); err == nil ||
		!strings.Contains(err.Error(), "larger than 1 MiB") {
		t.Errorf("a huge Dockerfile: %v", err)
	}
}

// TestKeys: a step's key covers its parent's and itself, so a change
// reruns from the changed step on; Force does not change a key.
func TestKeys(t *testing.T) {
	s := Spec{FromImage: "x", Steps: []Step{
		{Type: Run, Args: []string{"a"}}, {Type: Copy, Args: []string{"f", "/f", "", ""}, FilesHash: "sha256:1"},
		{Type: Run, Args: []string{"c"}},
	}}
	k := s.Keys("sha256:base")
	changed := s
	changed.Steps = append([]Step{}, s.Steps...)
	changed.Steps[1].FilesHash = "sha256:2"
	k2 := changed.Keys("sha256:base")
	if k[0] != k2[0] || k[1] == k2[1] || k[2] == k2[2] {
		t.Errorf("a changed second step: keys %v and %v", k, k2)
	}
	if other := s.Keys("sha256:other"); other[0] == k[0] {
		t.Error("another base gives the same first key")
	}
	forced := s
	forced.Steps = append([]Step{}, s.Steps...)
	forced.Steps[0].Force = true
	if f := forced.Keys("sha256:base"); f[0] != k[0] {
		t.Error("Force changed a key")
	}
}

func TestValidate(t *testing.T) {
	for _, s := range []Spec{
		{},
		{FromImage: "a", FromTemplate: "b"},
		{FromImage: "a", Steps: []Step{{Type: "CURL", Args: []string{"x"}}}},
		{FromImage: "a", Steps: []Step{{Type: Env, Args: []string{"K"}}}},
		{FromImage: "a", Steps: []Step{{Type: Run, Args: []string{""}}}},
		{FromImage: "a", Steps: []Step{{Type: Workdir, Args: []string{"/a", "/b"}}}},
		{FromImage: "a", Steps: slices.Repeat([]Step{{Type: Run, Args: []string{"true"}}}, MaxSteps+1)},
	} {
		if err := s.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%.200v: %v", s, err)
		}
	}
	if err := (Spec{FromImage: "a", Steps: slices.Repeat([]Step{{Type: Run, Args: []string{"true"}}}, MaxSteps)}).Validate(); err != nil {
		t.Errorf("%d steps: %v", MaxSteps, err)
	}
}

package gvisor

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeRunsc answers probes as a host would: some platforms are unknown to
// its runsc, some hang (never answer until their time is up), some work.
type fakeRunsc struct {
	unknown, hang, work []string

	mu    sync.Mutex
	tried []string
	// ended records, for each hanging platform, how its probe's context
	// ended: the probe must be told to stop, not left running.
	ended map[string]error
}

func (f *fakeRunsc) probe(ctx context.Context, platform string) error {
	f.mu.Lock()
	f.tried = append(f.tried, platform)
	f.mu.Unlock()
	switch {
	case slices.Contains(f.work, platform):
		return nil
	case slices.Contains(f.hang, platform):
		<-ctx.Done()
		f.mu.Lock()
		if f.ended == nil {
			f.ended = map[string]error{}
		}
		f.ended[platform] = ctx.Err()
		f.mu.Unlock()
		return ctx.Err()
	case slices.Contains(f.unknown, platform):
		return errors.New("runsc: unknown platform: " + platform)
	}
	return errors.New("unexpected platform " + platform)
}

func TestPlatformOrder(t *testing.T) {
	// In a virtual machine kvm would be nested: last. On bare metal it is
	// the fastest: first. systrap before ptrace everywhere.
	vm, metal := PlatformOrder(true), PlatformOrder(false)
	if !slices.Equal(vm, []string{"systrap", "ptrace", "kvm"}) {
		t.Errorf("in a VM: %v", vm)
	}
	if !slices.Equal(metal, []string{"kvm", "systrap", "ptrace"}) {
		t.Errorf("on bare metal: %v", metal)
	}
}

func TestChoosePlatform(t *testing.T) {
	const timeout = 50 * time.Millisecond
	for _, tc := range []struct {
		name          string
		host          *fakeRunsc
		candidates    []string
		want          string // "" : no platform works
		wantTried     []string
		wantRejection []string // substrings of the rejections, in order
	}{
		{
			name:       "a fresh nested VM with an old runsc: systrap unknown, kvm hangs",
			host:       &fakeRunsc{unknown: []string{"systrap"}, hang: []string{"kvm"}, work: []string{"ptrace"}},
			candidates: []string{"systrap", "kvm", "ptrace"},
			want:       "ptrace", wantTried: []string{"systrap", "kvm", "ptrace"},
			wantRejection: []string{"systrap: runsc: unknown platform: systrap",
				"kvm did not start a sandbox within 50ms"},
		},
		{
			name:       "the first that works is used; the rest are not started",
			host:       &fakeRunsc{work: []string{"systrap", "kvm", "ptrace"}},
			candidates: []string{"systrap", "kvm", "ptrace"},
			want:       "systrap", wantTried: []string{"systrap"},
		},
		{
			name:       "bare metal: kvm first",
			host:       &fakeRunsc{work: []string{"systrap", "kvm", "ptrace"}},
			candidates: PlatformOrder(false),
			want:       "kvm", wantTried: []string{"kvm"},
		},
		{
			name:          "nothing works",
			host:          &fakeRunsc{hang: []string{"kvm"}, unknown: []string{"systrap", "ptrace"}},
			candidates:    []string{"systrap", "kvm", "ptrace"},
			wantTried:     []string{"systrap", "kvm", "ptrace"},
			wantRejection: []string{"unknown platform: systrap", "kvm did not start", "unknown platform: ptrace"},
		},
		{
			name:       "a name that is not a platform is not passed to runsc",
			host:       &fakeRunsc{work: []string{"ptrace"}},
			candidates: []string{"--debug", "ptrace"},
			want:       "ptrace", wantTried: []string{"ptrace"},
			wantRejection: []string{`"--debug" is not a platform name`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := tc.host
			c, err := choose(context.Background(), tc.candidates, timeout, host.probe)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("chose %v; want an error", c)
				}
			} else if err != nil || c.Platform != tc.want {
				t.Fatalf("chose %v, %v; want %s", c, err, tc.want)
			}
			if !slices.Equal(host.tried, tc.wantTried) {
				t.Errorf("tried %v, want %v", host.tried, tc.wantTried)
			}
			if len(c.Rejected) != len(tc.wantRejection) {
				t.Fatalf("rejected %v, want %d", c.Rejected, len(tc.wantRejection))
			}
			for i, r := range c.Rejected {
				if !strings.Contains(r.Err.Error(), tc.wantRejection[i]) {
					t.Errorf("rejection %d: %q, want %q", i, r.Err, tc.wantRejection[i])
				}
				if err != nil && !strings.Contains(err.Error(), tc.wantRejection[i]) {
					t.Errorf("the error %q does not say %q", err, tc.wantRejection[i])
				}
			}
			// Every probe that hung was told its time was up.
			for _, p := range host.hang {
				if slices.Contains(host.tried, p) && !errors.Is(host.ended[p], context.DeadlineExceeded) {
					t.Errorf("the probe of %s ended with %v, want its deadline", p, host.ended[p])
				}
			}
		})
	}
}

// The doctor's and the log's line names the platform and why the ones
// before it were passed over.
func TestChoiceString(t *testing.T) {
	host := fakeRunsc{unknown: []string{"systrap"}, hang: []string{"kvm"}, work: []string{"ptrace"}}
	c, err := choose(context.Background(), []string{"systrap", "kvm", "ptrace"}, 10*time.Millisecond, host.probe)
	if err != nil {
		t.Fatal(err)
	}
	want := "ptrace (systrap: runsc: unknown platform: systrap; kvm did not start a sandbox within 10ms)"
	if got := c.String(); got != want {
		t.Errorf("%q\nwant %q", got, want)
	}
	if got := (Choice{Platform: "kvm", Requested: true}).String(); got != "kvm (requested)" {
		t.Errorf("requested: %q", got)
	}
}

// A caller's context that ends stops the probing: no further platform is
// started.
func TestChooseStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	host := fakeRunsc{work: []string{"ptrace"}}
	probe := func(pctx context.Context, platform string) error {
		if platform == "kvm" {
			cancel()
		}
		return host.probe(pctx, platform)
	}
	host.hang = []string{"kvm"}
	_, err := choose(ctx, []string{"kvm", "ptrace"}, time.Minute, probe)
	if err == nil {
		t.Fatal("chose a platform after the context ended")
	}
	if slices.Contains(host.tried, "ptrace") {
		t.Errorf("tried %v after the context ended", host.tried)
	}
}

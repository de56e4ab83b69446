package sandbox

import (
	"errors"
	"strings"
	"testing"
)

func TestIOLimits(t *testing.T) {
	d := Limits{}.WithDefaults()
	if d.IOReadBPS != DefaultIOReadBPS || d.IOReadIOPS != DefaultIOReadIOPS ||
		d.IOWriteBPS != DefaultIOWriteBPS || d.IOWriteIOPS != DefaultIOWriteIOPS {
		t.Errorf("defaults: %+v", d)
	}
	none := Limits{}.WithoutIOLimit().WithDefaults()
	if none.IOReadBPS != NoIOLimit || none.IOWriteIOPS != NoIOLimit {
		t.Errorf("no limit must survive the defaults: %+v", none)
	}
	for _, c := range []struct {
		l  Limits
		ok bool
	}{
		{Limits{}, true},
		{Limits{IOReadBPS: 16 << 20, IOReadIOPS: 100}, true},
		{Limits{}.WithoutIOLimit(), true},
		{Limits{IOReadBPS: 1000}, false},
		{Limits{IOWriteBPS: -2}, false},
		{Limits{IOReadIOPS: 5}, false},
		{Limits{IOWriteIOPS: 1 << 31}, false},
	} {
		err := c.l.Validate()
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrInvalidSpec)) {
			t.Errorf("%+v: %v", c.l, err)
		}
	}
}

func TestTenant(t *testing.T) {
	for _, good := range []string{"", "dev", "key_0123456789abcdef", "a-b_C"} {
		if err := (Spec{Tenant: good}).Validate(); err != nil {
			t.Errorf("%q: %v", good, err)
		}
	}
	for _, bad := range []string{"..", "a/b", "viv_x y", strings.Repeat("k", 65), "key\n"} {
		if err := (Spec{Tenant: bad}).Validate(); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
}

// plainBackend gives its sandboxes neither network access nor volumes.
type plainBackend struct{ Backend }

func (plainBackend) Name() string { return "plain" }

func TestCheckSpec(t *testing.T) {
	b := plainBackend{}
	if err := CheckSpec(b, Spec{}); err != nil {
		t.Fatalf("a plain spec: %v", err)
	}
	if err := CheckSpec(b, Spec{Python: "python3"}); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("an invalid spec: %v", err)
	}
	err := CheckSpec(b, Spec{Egress: noEgress{}})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "plain backend") {
		t.Errorf("network access from a backend without: %v", err)
	}
	err = CheckSpec(b, Spec{Volumes: []VolumeMount{{Path: "/mnt/data", Name: "data", Mount: func() (int, error) { return -1, nil }}}})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "volumes") {
		t.Errorf("a volume on a backend without: %v", err)
	}
}

package sandbox

import (
	"math"
	"testing"
	"time"
)

func TestSeconds(t *testing.T) {
	for _, c := range []struct {
		in   float64
		want time.Duration
	}{
		{0, 0},
		{1.5, 1500 * time.Millisecond},
		{0.001, time.Millisecond},
		{86400, 24 * time.Hour},
		{-2, -2 * time.Second},
		{1e6, 1e6 * time.Second},
		// Beyond the largest Duration (about 292 years): saturated, never
		// wrapped to the other sign.
		{9_223_372_037, math.MaxInt64},
		{1e300, math.MaxInt64},
		{math.MaxFloat64, math.MaxInt64},
		{math.Inf(1), math.MaxInt64},
		{-9_223_372_037, math.MinInt64},
		{-1e300, math.MinInt64},
		{math.Inf(-1), math.MinInt64},
		// Not a number: refused as a negative is.
		{math.NaN(), math.MinInt64},
	} {
		if got := Seconds(c.in); got != c.want {
			t.Errorf("Seconds(%v) = %v (%d), want %v (%d)", c.in, got, int64(got), c.want, int64(c.want))
		}
	}
	// Just within the largest: kept (to within float64's precision there,
	// under a microsecond), not saturated.
	for _, f := range []float64{9_223_372_036, -9_223_372_036} {
		got, want := Seconds(f), time.Duration(f)*time.Second
		if d := got - want; d < -time.Microsecond || d > time.Microsecond {
			t.Errorf("Seconds(%v) = %v, want about %v", f, got, want)
		}
	}
}

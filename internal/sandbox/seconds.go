package sandbox

import (
	"math"
	"time"
)

// Seconds is a client's number of seconds (timeout_s, E2B's timeout) as a
// Duration. It saturates: a number too large for a Duration is the
// largest one, which a server's limit then refuses, and a number too
// small the smallest, never one that wrapped around to the other sign. A
// negative number stays negative, for the caller to refuse in its own
// words; NaN, which no JSON number is, is the smallest Duration, refused
// as any negative one is.
func Seconds(f float64) time.Duration {
	switch ns := f * float64(time.Second); {
	case math.IsNaN(ns) || ns <= math.MinInt64:
		return math.MinInt64
	case ns >= math.MaxInt64:
		return math.MaxInt64
	default:
		return time.Duration(ns)
	}
}

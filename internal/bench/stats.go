package bench

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"time"
)

// Millis is a duration that JSON writes as milliseconds, a float: what
// people compare latencies in.
type Millis time.Duration

// D is the duration.
func (m Millis) D() time.Duration { return time.Duration(m) }

// MarshalJSON writes milliseconds with microsecond precision.
func (m Millis) MarshalJSON() ([]byte, error) {
	ms := float64(m) / float64(time.Millisecond)
	return strconv.AppendFloat(nil, math.Round(ms*1000)/1000, 'f', -1, 64), nil
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (m *Millis) UnmarshalJSON(b []byte) error {
	var ms float64
	if err := json.Unmarshal(b, &ms); err != nil {
		return err
	}
	*m = Millis(ms * float64(time.Millisecond))
	return nil
}

// Stats summarise the durations of a row's successful iterations.
type Stats struct {
	N    int    `json:"n"`
	P50  Millis `json:"p50_ms"`
	P95  Millis `json:"p95_ms"`
	Mean Millis `json:"mean_ms"`
	Min  Millis `json:"min_ms"`
	Max  Millis `json:"max_ms"`
}

// Summarize computes the statistics of times; the zero Stats for none.
// The median of an even count is the mean of the two middle values; p95 is
// the nearest rank (the smallest value at or above 95% of the values), so
// with fewer than 20 values it is the maximum.
func Summarize(times []time.Duration) Stats {
	n := len(times)
	if n == 0 {
		return Stats{}
	}
	s := slices.Clone(times)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	median := s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	rank := int(math.Ceil(0.95*float64(n))) - 1
	return Stats{
		N:    n,
		P50:  Millis(median),
		P95:  Millis(s[rank]),
		Mean: Millis(sum / time.Duration(n)),
		Min:  Millis(s[0]),
		Max:  Millis(s[n-1]),
	}
}

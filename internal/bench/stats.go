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

// Stats summarise the values of a row's successful iterations: for latency
// rows, durations in milliseconds; for value rows, quantities in the row's
// unit.
type Stats struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	Mean float64 `json:"mean"`
	Min  float64 `json:"min"`
	Max  float64 `json:"max"`
}

// Summarize computes the statistics of values; the zero Stats for none.
// The median of an even count is the mean of the two middle values; p95 is
// the nearest rank (the smallest value at or above 95% of the values), so
// with fewer than 20 values it is the maximum.
func Summarize(values []float64) Stats {
	n := len(values)
	if n == 0 {
		return Stats{}
	}
	s := slices.Clone(values)
	slices.Sort(s)
	var sum float64
	for _, v := range s {
		sum += v
	}
	median := s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	rank := int(math.Ceil(0.95*float64(n))) - 1
	return Stats{N: n, P50: median, P95: s[rank], Mean: sum / float64(n), Min: s[0], Max: s[n-1]}
}

// toMillis is how latency rows record a duration.
func toMillis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fromMillis(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

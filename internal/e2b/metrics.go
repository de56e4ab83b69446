package e2b

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// sandboxMetric is E2B's SandboxMetric: one sample of a sandbox's use.
type sandboxMetric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

func metricOf(s service.Sample) sandboxMetric {
	return sandboxMetric{Timestamp: s.Time.UTC().Format(time.RFC3339Nano), TimestampUnix: s.Time.Unix(),
		CPUCount: s.CPUCount, CPUUsedPct: s.CPUPercent, MemUsed: s.Memory, MemTotal: s.MemoryMax,
		DiskUsed: s.Disk, DiskTotal: s.DiskMax}
}

// unixParam reads a query parameter in Unix seconds; absent: zero time.
func unixParam(r *http.Request, name string) (time.Time, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, true
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

// metrics serves GET /sandboxes/{id}/metrics?start=&end= (Unix seconds):
// the sandbox's samples, oldest first, the last taken now.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request, owner string) {
	start, ok1 := unixParam(r, "start")
	end, ok2 := unixParam(r, "end")
	if !ok1 || !ok2 {
		writeEnvdError(w, http.StatusBadRequest, "start and end are times in Unix seconds")
		return
	}
	samples, err := s.svc.Usage(owner, r.PathValue("id"), start, end)
	if err != nil {
		s.notFound(w, r, err)
		return
	}
	out := make([]sandboxMetric, 0, len(samples))
	for _, smp := range samples {
		out = append(out, metricOf(smp))
	}
	writeJSON(w, http.StatusOK, out)
}

// maxMetricsIDs bounds the sandboxes one GET /sandboxes/metrics names.
const maxMetricsIDs = 100

// latestMetrics serves GET /sandboxes/metrics?sandbox_ids=a,b: each named
// sandbox's use now; sandboxes that are not the caller's, or gone, are
// left out.
func (s *Server) latestMetrics(w http.ResponseWriter, r *http.Request, owner string) {
	var ids []string
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for id := range strings.SplitSeq(v, ",") {
			if id != "" {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) > maxMetricsIDs {
		writeEnvdError(w, http.StatusBadRequest, "at most "+strconv.Itoa(maxMetricsIDs)+" sandbox_ids at once")
		return
	}
	out := map[string]sandboxMetric{}
	now := time.Now()
	for _, id := range ids {
		samples, err := s.svc.Usage(owner, id, now, time.Time{})
		if err == nil && len(samples) > 0 {
			out[id] = metricOf(samples[len(samples)-1])
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

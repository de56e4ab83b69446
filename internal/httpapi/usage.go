package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/service"
)

// usageList is a sandbox's metrics over time.
type usageList struct {
	Samples []service.Sample `json:"samples" doc:"oldest first; the last was taken now"`
}

// usage serves GET /v1/sandboxes/{id}/metrics?start=&end= (Unix seconds,
// both optional).
func (s *Server) usage(w http.ResponseWriter, r *http.Request) {
	var bounds [2]time.Time
	for i, name := range []string{"start", "end"} {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeError(w, apierr.InvalidRequest, name+" must be a time in Unix seconds")
			return
		}
		bounds[i] = time.Unix(n, 0)
	}
	samples, err := s.svc.Usage(owner(r), r.PathValue("id"), bounds[0], bounds[1])
	s.respond(w, usageList{Samples: samples}, err)
}

package httpapi

import (
	"net/http"

	"github.com/vivarium-sandbox/vivarium/internal/service"
)

type snapshotList struct {
	Snapshots []service.SnapshotInfo `json:"snapshots"`
}

// snapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots; it
// may be empty.
type snapshotRequest struct {
	Name string `json:"name" doc:"a name for it, the key's (1 to 63 of a-z, 0-9, '.', '_', '-'): from_snapshot, get and delete take it as they take the id; it finds the newest snapshot of that name, and delete deletes all of them"`
}

// snapshotHandler serves a sandbox's snapshot (POST .../snapshots) and
// /v1/snapshots: an owner's snapshots, their export and import.
func (s *Server) snapshotHandler(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who, id := owner(r), r.PathValue("id")
		switch name {
		case "createSnapshot":
			var req snapshotRequest
			if !decode(w, r, &req) {
				return
			}
			info, err := s.svc.Snapshot(r.Context(), who, id, req.Name)
			if err != nil {
				s.fail(w, err)
				return
			}
			writeJSON(w, http.StatusCreated, info)
		case "listSnapshots":
			writeJSON(w, http.StatusOK, snapshotList{Snapshots: s.svc.Snapshots(who)})
		case "getSnapshot":
			info, err := s.svc.SnapshotInfo(who, id)
			s.respond(w, info, err)
		case "deleteSnapshot":
			if err := s.svc.DeleteSnapshot(who, id); err != nil {
				s.fail(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case "exportSnapshot":
			if _, err := s.svc.SnapshotInfo(who, id); err != nil {
				s.fail(w, err)
				return
			}
			w.Header().Set("Content-Type", "application/x-tar")
			w.Header().Set("Content-Disposition", `attachment; filename="`+id+`.tar"`)
			if err := s.svc.ExportSnapshot(who, id, w); err != nil {
				// The status is sent: the stream ends short, and a
				// short stream is refused by an import.
				s.log.Error("export a snapshot", "snapshot", id, "err", err)
				panic(http.ErrAbortHandler)
			}
		case "importSnapshot":
			info, err := s.svc.ImportSnapshot(r.Context(), who, r.Body)
			if err != nil {
				s.fail(w, err)
				return
			}
			writeJSON(w, http.StatusCreated, info)
		}
	}
}

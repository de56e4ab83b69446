package httpapi

import (
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/vivarium-sandbox/vivarium/internal/apierr"
	"github.com/vivarium-sandbox/vivarium/internal/service"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

type (
	volumeRequest struct {
		Name string `json:"name" doc:"1 to 63 letters, digits, '_', '.' and '-', starting with a letter or digit; unique per key"`
		Size int64  `json:"size,omitempty" doc:"bytes the volume holds at most; default: the server's (1 GiB), at most its --volume-max-size"`
	}
	volumeList struct {
		Volumes []volume.Volume `json:"volumes"`
	}
)

// volumeHandler serves /v1/volumes: an owner's persistent volumes and
// their files, without a sandbox.
func (s *Server) volumeHandler(name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		st := s.svc.Volumes()
		if st == nil {
			s.fail(w, service.ErrNoVolumes)
			return
		}
		who, id := owner(r), r.PathValue("id")
		switch name {
		case "createVolume":
			var req volumeRequest
			if !decode(w, r, &req) {
				return
			}
			v, err := st.Create(who, req.Name, req.Size)
			if err != nil {
				s.fail(w, err)
				return
			}
			writeJSON(w, http.StatusCreated, v)
		case "listVolumes":
			writeJSON(w, 200, volumeList{Volumes: st.List(who)})
		case "getVolume":
			v, err := st.Get(who, id)
			s.respond(w, v, err)
		case "deleteVolume":
			if err := st.Delete(who, id); err != nil {
				s.fail(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case "listVolumeFiles":
			depth := 1
			if d := r.URL.Query().Get("depth"); d != "" {
				var err error
				if depth, err = strconv.Atoi(d); err != nil || depth < 1 || depth > 64 {
					writeError(w, apierr.InvalidRequest, "depth must be an integer from 1 to 64")
					return
				}
			}
			dir := r.URL.Query().Get("path")
			if dir == "" {
				dir = "."
			}
			err := st.Content(who, id, func(_ volume.Volume, d *volume.Dir) error {
				entries, err := d.ReadDir(dir, depth)
				if err != nil {
					return err
				}
				out := fileList{Path: dir, Entries: make([]fileEntry, 0, len(entries))}
				for _, e := range entries {
					out.Entries = append(out.Entries, fileEntry{Path: e.Path, Name: e.Path[strings.LastIndex(e.Path, "/")+1:],
						Size: e.Size, Type: e.Type, Modified: e.ModTime.UTC()})
				}
				writeJSON(w, 200, out)
				return nil
			})
			if err != nil {
				s.fail(w, err)
			}
		case "putVolumeFile":
			p := r.PathValue("path")
			err := st.Content(who, id, func(v volume.Volume, d *volume.Dir) error {
				md, err := s.fileMetadata(d, r.Header)
				if err != nil {
					return err
				}
				if err := d.WriteFile(p, r.Body, v.Size); err != nil {
					return err
				}
				if len(md) > 0 {
					if err := d.SetFileMetadata(p, md); err != nil {
						return err
					}
				}
				fi, err := d.Stat(p)
				if err != nil {
					return err
				}
				writeJSON(w, http.StatusCreated, fileWritten{Path: fi.Path, Size: fi.Size, Metadata: md})
				return nil
			})
			if err != nil {
				s.fail(w, err)
			}
		case "getVolumeFile":
			err := st.Content(who, id, func(_ volume.Volume, d *volume.Dir) error {
				f, fi, err := d.OpenFile(r.PathValue("path"))
				if err != nil {
					return err
				}
				defer f.Close()
				w.Header().Set("Content-Type", "application/octet-stream")
				w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
				setMetadataHeaders(w.Header(), d, r.PathValue("path"))
				io.Copy(w, io.LimitReader(f, fi.Size))
				return nil
			})
			if err != nil {
				s.fail(w, err)
			}
		case "deleteVolumeFile":
			err := st.Content(who, id, func(_ volume.Volume, d *volume.Dir) error { return d.Remove(r.PathValue("path")) })
			if err != nil {
				s.fail(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}
	}
}

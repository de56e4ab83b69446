package service

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/image"
)

// A key's templates outlive the server where BuildConfig.FilesDir is
// given: each key's names, tags and the ready builds its tags name are
// written to DIR/k<digest of the owner>/templates.json at each change,
// beside its archives, and read back by the next server on DIR. Builds
// running or failed, and logs, are the running server's alone. Without
// the file a restart would forget the names, and the images of the
// builds would stay in the builder's store with nothing to remove them.

const savedTemplates = "templates.json"

type savedOwner struct {
	Owner     string          `json:"owner"`
	Templates []savedTemplate `json:"templates"`
}

type savedTemplate struct {
	ID      string              `json:"id"`
	Name    string              `json:"name"`
	Created time.Time           `json:"created"`
	Tags    map[string]savedTag `json:"tags"`
}

type savedTag struct {
	Build    string      `json:"build"`
	Image    image.Image `json:"image"`
	Added    int64       `json:"added,omitempty"`
	Built    time.Time   `json:"built"`
	Assigned time.Time   `json:"assigned"`
}

// save writes the key's templates, when they are kept across restarts.
// Called holding ob.mu.
func (bs *builds) save(ob *ownerBuilds) {
	if bs.cfg.FilesDir == "" || ob.closed {
		return
	}
	out := savedOwner{Owner: ob.owner, Templates: []savedTemplate{}}
	for _, t := range ob.templates {
		st := savedTemplate{ID: t.id, Name: t.name, Created: t.created, Tags: map[string]savedTag{}}
		for tag, x := range t.tags {
			st.Tags[tag] = savedTag{Build: x.build.id, Image: x.build.image, Added: x.build.added, Built: x.build.created, Assigned: x.assigned}
		}
		out.Templates = append(out.Templates, st)
	}
	slices.SortFunc(out.Templates, func(a, b savedTemplate) int { return a.Created.Compare(b.Created) })
	b, err := json.Marshal(out)
	if err == nil {
		err = writeFileAtomic(filepath.Join(bs.cfg.FilesDir, ownerDir(ob.owner)), savedTemplates, b)
	}
	if err != nil {
		bs.log.Warn("saving a key's templates: a restart will forget their changes", "err", err)
	}
}

// writeFileAtomic writes name in dir under a staging name first, then
// gives it its name: a crash leaves the old file or the new.
func writeFileAtomic(dir, name string, b []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, name+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(dir, name))
}

// load reads back what save wrote, and the archives kept beside it.
func (bs *builds) load() {
	dirs, _ := filepath.Glob(filepath.Join(bs.cfg.FilesDir, "k*"))
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, savedTemplates))
		if err != nil {
			continue // archives of a key without templates: the next upload's
		}
		var saved savedOwner
		if err := json.Unmarshal(raw, &saved); err != nil || ownerDir(saved.Owner) != filepath.Base(dir) {
			bs.log.Warn("a key's saved templates cannot be read: they are left out", "file", filepath.Join(dir, savedTemplates))
			continue
		}
		ob := newOwnerBuilds(saved.Owner)
		for _, st := range saved.Templates {
			t := &tmpl{id: st.ID, name: st.Name, created: st.Created, tags: map[string]tagged{}}
			for tag, x := range st.Tags {
				b := ob.builds[x.Build]
				if b == nil {
					b = &build{id: x.Build, tmpl: t, state: BuildReady, step: -1, created: x.Built, image: x.Image,
						added: x.Added}
					ob.builds[b.id] = b
					ob.finished = append(ob.finished, b)
				}
				t.tags[tag] = tagged{build: b, assigned: x.Assigned}
			}
			ob.templates[t.id], ob.names[t.name] = t, t
			bs.byID[t.id] = saved.Owner
		}
		slices.SortFunc(ob.finished, func(a, b *build) int { return a.created.Compare(b.created) })
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			info, err := e.Info()
			if err == nil && info.Mode().IsRegular() && filesHashRE.MatchString(e.Name()) {
				ob.files[e.Name()] = &storedFiles{size: info.Size(), used: info.ModTime()}
				ob.filesSize += info.Size()
			}
		}
		bs.owners[saved.Owner] = ob
	}
}

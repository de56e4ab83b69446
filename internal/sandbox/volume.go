package sandbox

import (
	"fmt"
	"path"
	"strings"
)

// VolumeMount is a persistent volume mounted into a sandbox
// (Spec.Volumes): its file system, which the volume store keeps while the
// sandbox lives, at Path inside. Backends mount it read-write, nosuid and
// nodev, with the sandbox user's files owned by it (the volume's own ids
// are those of the sandbox: 1000 is its user).
type VolumeMount struct {
	Path string // absolute path in the sandbox (ValidVolumePath)
	Name string // the volume's name, for messages
	// Mount makes a new mount of the volume's file system, detached
	// (attached in no mount namespace; see volume.Lease.Mount), and
	// returns its descriptor, which the caller closes.
	Mount func() (int, error)
}

// MaxVolumes bounds the volumes one sandbox mounts.
const MaxVolumes = 8

// VolumeBackend is a Backend whose sandboxes can mount volumes. Backends
// that are not one refuse a Spec with Volumes (CheckVolumes).
type VolumeBackend interface {
	// VolumesSupported returns nil, or why this backend's sandboxes
	// cannot mount volumes on this host.
	VolumesSupported() error
}

// CheckVolumes refuses a Spec with Volumes for a backend that cannot mount
// them, naming it.
func CheckVolumes(b Backend, spec Spec) error {
	if len(spec.Volumes) == 0 {
		return nil
	}
	vb, ok := b.(VolumeBackend)
	if !ok {
		return fmt.Errorf("%w: the %s backend cannot mount volumes; volumes need the native backend", ErrUnsupported, b.Name())
	}
	if err := vb.VolumesSupported(); err != nil {
		return fmt.Errorf("%w: the %s backend cannot mount volumes: %v", ErrUnsupported, b.Name(), err)
	}
	return nil
}

// volumeParents are the directories a volume may be mounted below:
// the user's places, never the system's (/usr, /etc, /proc, /dev, the
// runner's /opt/vivarium).
var volumeParents = []string{"/home/user", "/workspace", "/mnt", "/media", "/data", "/srv", "/opt", "/tmp", "/root"}

// volumeTops are the directories a volume may be mounted at themselves.
var volumeTops = []string{"/mnt", "/media", "/data", "/srv"}

// ValidVolumePath checks where a volume is mounted: an absolute, clean
// path strictly below /home/user, /workspace, /mnt, /media, /data, /srv,
// /opt (not /opt/vivarium), /tmp or /root, or one of /mnt, /media, /data
// and /srv, of at most 16 components of at most 255 bytes.
func ValidVolumePath(p string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: volume mount path %.80q %s", ErrInvalidSpec, p, why)
	}
	switch {
	case !strings.HasPrefix(p, "/"):
		return bad("must be absolute")
	case strings.ContainsRune(p, 0):
		return bad("contains a NUL byte")
	case len(p) > 1024:
		return bad("is too long")
	case path.Clean(p) != p:
		return bad("must be clean (no '..', '.', '//' or trailing '/')")
	}
	parts := strings.Split(p[1:], "/")
	if len(parts) > 16 {
		return bad("is too deep")
	}
	for _, part := range parts {
		if len(part) > 255 {
			return bad("has a name over 255 bytes")
		}
	}
	if p == "/opt/vivarium" || strings.HasPrefix(p, "/opt/vivarium/") {
		return bad("would cover the sandbox's runner")
	}
	for _, t := range volumeTops {
		if p == t {
			return nil
		}
	}
	for _, d := range volumeParents {
		if strings.HasPrefix(p, d+"/") {
			return nil
		}
	}
	return bad("must be below /home/user, /workspace, /mnt, /media, /data, /srv, /opt, /tmp or /root")
}

// validVolumes checks a spec's volumes: each path valid, none at or below
// another, at most MaxVolumes.
func validVolumes(vs []VolumeMount) error {
	if len(vs) > MaxVolumes {
		return fmt.Errorf("%w: at most %d volumes per sandbox", ErrInvalidSpec, MaxVolumes)
	}
	for i, v := range vs {
		if err := ValidVolumePath(v.Path); err != nil {
			return err
		}
		if v.Mount == nil {
			return fmt.Errorf("%w: volume %q has no file system", ErrInvalidSpec, v.Name)
		}
		for _, w := range vs[:i] {
			a, b := homeCanonical(v.Path), homeCanonical(w.Path)
			if a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/") {
				return fmt.Errorf("%w: volume mounts %s and %s overlap", ErrInvalidSpec, w.Path, v.Path)
			}
		}
	}
	return nil
}

// homeCanonical names a path under the home by one of its two names:
// /home/user and /workspace are one directory.
func homeCanonical(p string) string {
	if rest, ok := strings.CutPrefix(p, HomeUser+"/"); ok {
		return HomeWorkspace + "/" + rest
	}
	return p
}

package native

// Volumes across a pause, a resume and a fork (docs/snapshots.md). A
// volume's mounts in the sandbox (volume_linux.go) are ext4 of the host's
// loop device, idmapped by the sandbox's user namespace: CRIU can neither
// save nor mount them, so they are external mounts of the checkpoint, and
// the volume's files are never in it. In order:
//
//  1. the dump finds the volumes' mounts by their file system (the device
//     of a new mount of each volume, volumeDevs), wherever they are now,
//     and names each an external mount of the volume's path in the spec
//     (extMount.volume);
//  2. the restore makes, for each, a directory under the checkpoint's,
//     and tells CRIU to bind the mount from there;
//  3. once CRIU has made the restored tree's root task, in a user
//     namespace with the tree's uid and gid maps and a copy of the
//     supervisor's mount namespace, and before it mounts anything (its
//     setup-namespaces step), the supervisor makes a new mount of each
//     volume, idmapped by that user namespace as at a creation
//     (volumeMounts), and attaches it on its directory in that copy
//     only; CRIU binds it into the restored mount namespace, with the
//     flags it had, and leaves the copy. The host's own mount namespace
//     never has a volume.
//
// Files the sandbox held open on a volume are reopened by CRIU by their
// path in the new mount, and checked: one changed meanwhile (by another
// sandbox, or through the volume's files API: a volume is not frozen
// with a paused sandbox) fails the resume, which says which file
// (volumeChanged), and the sandbox stays paused.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// volumeDevs returns the device ("major:minor", as mountinfo names it) of
// each volume's file system, with the volume's path in the spec: a new
// mount of each (the lease's), whose device is the one the sandbox's
// mounts are of while the lease holds the volume.
func volumeDevs(vols []sandbox.VolumeMount) (map[string]string, error) {
	devs := map[string]string{}
	for _, v := range vols {
		fd, err := v.Mount()
		if err != nil {
			return nil, fmt.Errorf("checkpoint: volume %q: %w", v.Name, err)
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil {
			return nil, fmt.Errorf("checkpoint: volume %q: %w", v.Name, err)
		}
		dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
		if _, ok := devs[dev]; !ok {
			devs[dev] = v.Path // one volume mounted twice: either path's
		}
	}
	return devs, nil
}

// volumeMount returns m as an external mount of the volume at path p in
// the spec. Only a volume's whole file system is ever mounted in a
// sandbox.
func volumeMount(key string, m mountEntry, p string) (extMount, error) {
	if m.root != "/" {
		return extMount{}, fmt.Errorf("checkpoint: the volume's mount at %s shows %s of it, not its root", m.point, m.root)
	}
	return extMount{key: key, mountpoint: m.point, volume: p, flags: m.flags}, nil
}

// restoreVolumes are the volumes of a checkpoint's restore (steps 2 and
// 3 above).
type restoreVolumes struct {
	dir    string // under the checkpoint's directory
	mounts []extMount
	specs  []sandbox.VolumeMount // in the order of mounts
}

// prepareVolumes makes the directories cp's volumes are attached on for
// its restore, and returns the arguments that tell CRIU to bind them
// from there; nil where cp mounts no volume. Each of cp's must be one of
// the volumes the restored sandbox mounts (cp.volumes), by its path.
// Callers call cleanup once CRIU has returned.
func prepareVolumes(cp *checkpoint) (*restoreVolumes, []string, error) {
	vols := cp.volumes
	rv := &restoreVolumes{dir: filepath.Join(cp.dir, "volumes")}
	for _, m := range cp.mounts {
		if m.volume == "" {
			continue
		}
		i := sliceIndex(vols, m.volume)
		if i < 0 {
			return nil, nil, fmt.Errorf("%w: the sandbox mounted a volume at %s, which its restore was not given",
				sandbox.ErrInvalidSpec, m.volume)
		}
		rv.mounts = append(rv.mounts, m)
		rv.specs = append(rv.specs, vols[i])
	}
	if len(rv.mounts) == 0 {
		return nil, nil, nil
	}
	// Reached by CRIU's tasks as the sandbox's root: of the group the
	// checkpoint's directory was handed over to (handOver), as it is.
	var st unix.Stat_t
	if err := unix.Stat(cp.dir, &st); err != nil {
		return nil, nil, fmt.Errorf("restore: volumes: %w", err)
	}
	var args []string
	for _, d := range append([]string{""}, rv.keys()...) {
		p := filepath.Join(rv.dir, d)
		err := os.Mkdir(p, 0o700)
		if err == nil {
			err = errors.Join(os.Lchown(p, 0, int(st.Gid)), os.Chmod(p, 0o750))
		}
		if err != nil {
			rv.cleanup()
			return nil, nil, fmt.Errorf("restore: volumes: %w", err)
		}
		if d != "" {
			args = append(args, "--external", "mnt["+d+"]:"+p)
		}
	}
	return rv, args, nil
}

// keys are the external mounts' keys, which name their directories.
func (rv *restoreVolumes) keys() []string {
	var out []string
	for _, m := range rv.mounts {
		out = append(out, m.key)
	}
	return out
}

// sliceIndex is the index of the volume at path p in vols, or -1.
func sliceIndex(vols []sandbox.VolumeMount, p string) int {
	for i, v := range vols {
		if v.Path == p {
			return i
		}
	}
	return -1
}

// attach makes the volumes' mounts, idmapped by the user namespace of
// pid (the restored tree's root, which CRIU made and gave its maps), and
// attaches each on its directory in pid's mount namespace: the copy of
// the supervisor's that the root was made with, where CRIU looks for
// them, and which it leaves once the restored tree's is built. The
// host's own mount namespace never has them.
func (rv *restoreVolumes) attach(pid int) error {
	mntns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return fmt.Errorf("restore: the restored tree's mount namespace: %w", err)
	}
	defer mntns.Close()
	fds, err := volumeMounts(pid, rv.specs)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer closeAll(fds)
	return inNamespace(mntns, unix.CLONE_NEWNS, func() error {
		for i, m := range rv.mounts {
			p := filepath.Join(rv.dir, m.key)
			if err := unix.MoveMount(fds[i], "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return fmt.Errorf("restore: attach volume %q for the restore (move_mount): %w", rv.specs[i].Name, err)
			}
		}
		return nil
	})
}

// cleanup removes the volumes' directories. Never a recursive removal:
// were a volume mounted there, its files would go with it.
func (rv *restoreVolumes) cleanup() {
	if rv == nil {
		return
	}
	for _, k := range rv.keys() {
		os.Remove(filepath.Join(rv.dir, k))
	}
	os.Remove(rv.dir)
}

// badFileRE finds, in CRIU's log of a restore, a file it refused to
// reopen because it changed since the dump ("File PATH has bad size N
// (expect M)", "... has bad mode", "... has bad build-ID") or could not
// open ("Can't open file PATH on restore"); PATH is relative to the
// sandbox's root.
var badFileRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?:File (\S+) has bad (size|mode|build-ID)|Can't (open) file (\S+))`)
})

// volumeChanged says, for a restore that failed with err, whether it
// failed on a file the sandbox held open on one of its volumes that
// changed since the dump (while it was paused, or since a fork's dump),
// and names the volume and the file.
func volumeChanged(err error, mounts []extMount, vols []sandbox.VolumeMount) error {
	if err == nil {
		return nil
	}
	for _, sm := range badFileRE().FindAllStringSubmatch(err.Error(), -1) {
		file, what := sm[1]+sm[4], sm[2]
		if sm[3] != "" {
			what = "it is gone, or cannot be opened"
		} else {
			what = "its " + what
		}
		p := "/" + strings.TrimPrefix(file, "/")
		for _, m := range mounts {
			if m.volume == "" || (p != m.mountpoint && !strings.HasPrefix(p, m.mountpoint+"/")) {
				continue
			}
			name := m.volume
			if i := sliceIndex(vols, m.volume); i >= 0 {
				name = vols[i].Name
			}
			return fmt.Errorf("%w: the sandbox held %s open on volume %q, and the file changed (%s) since its "+
				"processes were saved: they come back only with the file as it was then", sandbox.ErrCannotKeep, p, name, what)
		}
	}
	return nil
}

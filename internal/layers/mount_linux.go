// Package layers mounts and holds an image store's layers for the
// sandboxes that stack them: without the store's registry and archive
// code, which a sandbox's init (the same binary) must not load.
package layers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoIdmap: the kernel cannot give a layer the ids of a user namespace
// (idmapped mounts of the layers' file system, Linux 5.12 and later, and
// overlayfs over idmapped layers, 5.19 and later).
var ErrNoIdmap = errors.New("this kernel cannot stack idmapped layers with overlayfs (needs Linux 5.19 or later)")

// MountLayers stacks the layers at dirs (an image store's LayerDir), the
// lowest first, as image.Store.RootMount says: each idmapped through
// userns (nil: as they are, the host's ids), under upper and work if
// given, into a detached overlay mount.
func MountLayers(dirs []string, userns *os.File, upper, work string) (*os.File, error) {
	if len(dirs) == 0 {
		return nil, errors.New("an image without layers has no root")
	}
	var layers []int
	defer func() {
		for _, fd := range layers {
			unix.Close(fd)
		}
	}()
	for _, dir := range dirs {
		id := filepath.Base(dir)
		fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("clone layer %.19s: %w", id, err)
		}
		layers = append(layers, fd)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if userns != nil {
			attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
			attr.Userns_fd = uint64(userns.Fd())
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
				return nil, fmt.Errorf("%w: idmap layer %.19s: %v", ErrNoIdmap, id, err)
			}
			return nil, fmt.Errorf("idmap layer %.19s: %w", id, err)
		}
	}
	if len(layers) == 1 && upper == "" {
		// overlayfs wants two layers at least without an upper one; the
		// idmapped layer is the root as it is, read-only.
		root := os.NewFile(uintptr(layers[0]), "image root")
		layers = nil
		return root, nil
	}
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("overlay: %w", err)
	}
	defer unix.Close(fs)
	set := func(key, value string) error {
		if err := unix.FsconfigSetString(fs, key, value); err != nil {
			return fmt.Errorf("overlay %s: %w", key, err)
		}
		return nil
	}
	// One lowerdir of every layer, the top first: "lowerdir+" would
	// need Linux 6.8.
	var lower []string
	for i := len(layers) - 1; i >= 0; i-- {
		lower = append(lower, fmt.Sprintf("/proc/self/fd/%d", layers[i]))
	}
	if err := set("lowerdir", strings.Join(lower, ":")); err != nil {
		return nil, err
	}
	flags := unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	if upper != "" {
		if err := set("upperdir", upper); err != nil {
			return nil, err
		}
		if err := set("workdir", work); err != nil {
			return nil, err
		}
		// The writable layer holds files and whiteouts only, in the
		// form the store's layers have: no redirects, no metadata-only
		// copies (a build turns it into a layer; nothing else reads it).
		for _, o := range []string{"redirect_dir", "metacopy", "index"} {
			if err := set(o, "off"); err != nil {
				return nil, err
			}
		}
	} else {
		flags |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, fmt.Errorf("overlay over the idmapped layers: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, flags)
	if err != nil {
		return nil, fmt.Errorf("overlay mount: %w", err)
	}
	return os.NewFile(uintptr(m), "image root"), nil
}

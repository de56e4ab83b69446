package image

import (
	"os"

	"github.com/vivarium-sandbox/vivarium/internal/layers"
)

// ErrNoIdmap: the kernel cannot give a layer the ids of a user namespace
// (layers.ErrNoIdmap).
var ErrNoIdmap = layers.ErrNoIdmap

// RootMount stacks an image's layers, lowest first, into a detached
// overlay mount whose files carry the ids the user namespace userns maps
// the layers' ids to: a file the image gives to root is root's in a
// sandbox of that namespace, and no other sandbox's, nor the host
// root's. It is made by host root, in this order:
//
//  1. each layer's directory is cloned as a detached mount (open_tree),
//     made read-only, nosuid and nodev, and idmapped through userns
//     (mount_setattr);
//  2. an overlay is made of them (fsopen, their /proc/self/fd paths as
//     its lower directories, the top layer first; a single layer without
//     a writable one is the root as it is), with upper and work, if given, as its writable
//     layer (directories of one file system, owned by the namespace's
//     root so that it may write there), else read-only;
//  3. it is returned as a detached mount (fsmount, nosuid and nodev):
//     move_mount attaches it where the caller wants it, in the sandbox's
//     own mount namespace. Its flags are the sandbox's to change, as those
//     of every mount its init makes: the boundary is the user namespace
//     (no device node can be made in it; a set-ID file is one of the
//     namespace's ids, and the store drops the image's set-ID bits).
//
// The layer mounts are not attached anywhere; the overlay keeps what it
// needs of them.
func (s *Store) RootMount(diffIDs []string, userns *os.File, upper, work string) (*os.File, error) {
	dirs := make([]string, len(diffIDs))
	for i, id := range diffIDs {
		dirs[i] = s.LayerDir(id)
	}
	return layers.MountLayers(dirs, userns, upper, work)
}

package native

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// Volumes (sandbox.VolumeMount) reach a sandbox as idmapped mounts. A
// volume's files carry the sandbox's own ids on disk (1000 is its user),
// and each sandbox is its own range of host uids (internal/hostuid): an
// idmapped mount translates between them in the kernel, with nothing
// chowned, so that one volume serves sandboxes of different ranges at once,
// and what one writes is its user's in the next. In order:
//
//  1. the supervisor gets a new mount of the volume's file system from
//     the volume store (VolumeMount.Mount: fsmount, detached, in no
//     namespace; the host has none of it either);
//  2. it makes the mount idmapped with the sandbox's user namespace
//     (mount_setattr MOUNT_ATTR_IDMAP, which needs the host's root: a
//     sandbox cannot make one), nosuid and nodev, and executable (the
//     store's mounts are noexec: the host never runs what a sandbox wrote,
//     a sandbox may);
//  3. it sends the mounts to init on the control socket (opVolumes), before
//     init's config;
//  4. init, while it builds the root and before any code of the sandbox's
//     runs, makes each mount point in the root (no link is followed) and
//     attaches the mount there (move_mount), before pivot_root; a volume
//     under the home is attached in /workspace and a copy of it bound at
//     the same place under /home/user (volumeTargets).
//
// The sandbox cannot unmount, move or remount its copy (its root has no
// capability once init has confined itself), nor change the mapping (an
// idmapped mount's is fixed once attached).
// The kernel needs Linux 5.12 and ext4's idmapped mount support; where it
// refuses, the sandbox fails to start, naming the step.
const opVolumes = "volumes"

var _ sandbox.VolumeBackend = (*Backend)(nil)

// VolumesSupported implements sandbox.VolumeBackend: every native sandbox
// can mount volumes; a kernel without idmapped mounts refuses at start.
func (b *Backend) VolumesSupported() error { return nil }

// volumeMounts makes the idmapped mounts of spec's volumes for the
// sandbox whose init is pid (not yet reaped), in the order of spec.Volumes.
func volumeMounts(pid int, vols []sandbox.VolumeMount) (_ []int, err error) {
	userns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("volumes: sandbox's user namespace: %w", err)
	}
	defer unix.Close(userns)
	var fds []int
	defer func() {
		if err != nil {
			closeAll(fds)
		}
	}()
	for _, v := range vols {
		fd, err := v.Mount()
		if err != nil {
			return nil, err
		}
		fds = append(fds, fd)
		attr := unix.MountAttr{
			Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
			Attr_clr:  unix.MOUNT_ATTR_NOEXEC,
			Userns_fd: uint64(userns),
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return nil, fmt.Errorf("volume %q: idmapped mount (mount_setattr MOUNT_ATTR_IDMAP, Linux 5.12 with ext4): %w", v.Name, err)
		}
	}
	return fds, nil
}

// attachVolumes is init's side: it receives the volumes' mounts and
// attaches each at its path under root (the new root, before the pivot).
func attachVolumes(cfg *initConfig, root string) error {
	if len(cfg.Volumes) == 0 {
		return nil
	}
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4*sandbox.MaxVolumes))
	m, fds, err := recvCtl(fdControl, buf, oob)
	if err != nil {
		return step("receive volumes", err)
	}
	defer closeAll(fds)
	if m.Op != opVolumes || len(fds) != len(cfg.Volumes) {
		return step("receive volumes", fmt.Errorf("expected %d volumes, got %q with %d", len(cfg.Volumes), m.Op, len(fds)))
	}
	for i, p := range cfg.Volumes {
		at, also := volumeTargets(p)
		dir, err := mkdirNoFollow(root, at)
		if err != nil {
			return step("volume mount point "+at, err)
		}
		err = unix.MoveMount(fds[i], "", dir, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(dir)
		if err != nil {
			return step("attach volume at "+p+" (move_mount)", err)
		}
		if also != "" {
			if err := bindAlso(root, at, also); err != nil {
				return step("volume at "+also, err)
			}
		}
	}
	return nil
}

// volumeTargets says where a volume asked for at p is attached: the
// workspace's own directory for a path under the home (/home/user and
// /workspace are the same directory), with the same mount at the path
// under the other name too, so that both show it.
func volumeTargets(p string) (at, also string) {
	if rest, ok := strings.CutPrefix(p, "/home/user/"); ok {
		return workspacePath + "/" + rest, p
	}
	if rest, ok := strings.CutPrefix(p, workspacePath+"/"); ok {
		return p, "/home/user/" + rest
	}
	return p, ""
}

// bindAlso mounts a copy of the volume attached at "at" at p, both
// under root. The copy keeps the idmapping and flags of the original.
func bindAlso(root, at, p string) error {
	vol, err := mkdirNoFollow(root, at) // the lookup crosses into the volume
	if err != nil {
		return err
	}
	src, err := unix.OpenTree(vol, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	unix.Close(vol)
	if err != nil {
		return fmt.Errorf("clone (open_tree): %w", err)
	}
	defer unix.Close(src)
	dst, err := mkdirNoFollow(root, p)
	if err != nil {
		return err
	}
	defer unix.Close(dst)
	return unix.MoveMount(src, "", dst, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
}

// mkdirNoFollow makes the directories of p (absolute, clean) below root,
// as init (the sandbox's root), and returns a descriptor of the last: no
// component may be a link, so the mount lands where p says.
func mkdirNoFollow(root, p string) (int, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		if err := unix.Mkdirat(fd, part, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, err
		}
		next, err := unix.Openat(fd, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				return -1, fmt.Errorf("%s is a link or not a directory", part)
			}
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// sendVolumes makes and sends the sandbox's volumes to its init.
func (s *Sandbox) sendVolumes() error {
	if len(s.spec.Volumes) == 0 {
		return nil
	}
	fds, err := volumeMounts(s.init.pid, s.spec.Volumes)
	if err != nil {
		return err
	}
	defer closeAll(fds)
	if err := sendCtl(s.ctl, ctlMsg{Op: opVolumes}, fds...); err != nil {
		return fmt.Errorf("send volumes to init: %w", err)
	}
	return nil
}

// volumePaths lists where the spec's volumes go, for init.
func volumePaths(vols []sandbox.VolumeMount) []string {
	var out []string
	for _, v := range vols {
		out = append(out, v.Path)
	}
	return out
}

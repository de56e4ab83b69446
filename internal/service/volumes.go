package service

import (
	"fmt"

	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/volume"
)

// VolumeRequest asks for one of the owner's volumes (by name or ID) to be
// mounted at Path in a new sandbox.
type VolumeRequest struct {
	Name string `json:"name" doc:"the volume's name or ID"`
	Path string `json:"path" doc:"absolute path in the sandbox, e.g. /home/user/data"`
}

// ErrNoVolumes: this server keeps no volumes.
var ErrNoVolumes = fmt.Errorf("%w: this server keeps no volumes", volume.ErrUnavailable)

// Volumes returns the server's volume store; nil: it keeps none.
func (s *Service) Volumes() *volume.Store { return s.cfg.Volumes }

// leaseVolumes mounts the owner's volumes a new sandbox asks for. The
// leases are the sandbox's until it is closed (Box.release).
func (s *Service) leaseVolumes(owner string, reqs []VolumeRequest) (_ []sandbox.VolumeMount, _ []*volume.Lease, err error) {
	if len(reqs) == 0 {
		return nil, nil, nil
	}
	if s.cfg.Volumes == nil {
		return nil, nil, ErrNoVolumes
	}
	if len(reqs) > sandbox.MaxVolumes {
		return nil, nil, fmt.Errorf("%w: at most %d volumes per sandbox", sandbox.ErrInvalidSpec, sandbox.MaxVolumes)
	}
	// Paths first: nothing is mounted for a request that cannot start.
	for _, r := range reqs {
		if err := sandbox.ValidVolumePath(r.Path); err != nil {
			return nil, nil, err
		}
	}
	var mounts []sandbox.VolumeMount
	var leases []*volume.Lease
	defer func() {
		if err != nil {
			releaseVolumes(leases)
		}
	}()
	for _, r := range reqs {
		l, err := s.cfg.Volumes.Acquire(owner, r.Name, true)
		if err != nil {
			return nil, nil, err
		}
		leases = append(leases, l)
		mounts = append(mounts, sandbox.VolumeMount{Path: r.Path, Name: l.Volume.Name, Mount: l.Mount})
	}
	return mounts, leases, nil
}

// reopenVolumes leases again, for a paused sandbox an earlier server kept
// on disk, the volumes it mounts (m.Volumes, by ID), so that none of them
// is deleted while it is paused, and returns their mounts for its resume.
// Where one cannot be leased (the volume is gone, or this server keeps no
// volumes), none is: the sandbox is listed all the same, and lost says
// why it cannot resume (Box.volumesLost).
func (s *Service) reopenVolumes(m pausedMeta) (_ []sandbox.VolumeMount, _ []*volume.Lease, lost error) {
	var mounts []sandbox.VolumeMount
	var leases []*volume.Lease
	for _, v := range m.Volumes {
		var l *volume.Lease
		err := ErrNoVolumes
		if s.cfg.Volumes != nil {
			l, err = s.cfg.Volumes.Acquire(m.Owner, v.ID, true)
		}
		if err != nil {
			releaseVolumes(leases)
			lost = fmt.Errorf("%w: the volume %q it mounted at %s cannot be mounted again (%v), and it cannot resume "+
				"without it; close it", sandbox.ErrCannotKeep, v.Name, v.Path, err)
			s.cfg.Logger.Warn("a kept paused sandbox's volume cannot be leased again", "id", m.ID, "volume", v.ID, "err", err)
			return lostMounts(m.Volumes, lost), nil, lost
		}
		leases = append(leases, l)
		mounts = append(mounts, sandbox.VolumeMount{Path: v.Path, Name: v.Name, Mount: l.Mount})
	}
	return mounts, leases, nil
}

// lostMounts are the mounts of vols for a sandbox that cannot mount them:
// each fails with lost.
func lostMounts(vols []VolumeMountInfo, lost error) []sandbox.VolumeMount {
	var out []sandbox.VolumeMount
	for _, v := range vols {
		out = append(out, sandbox.VolumeMount{Path: v.Path, Name: v.Name, Mount: func() (int, error) { return -1, lost }})
	}
	return out
}

// forkVolumes leases, for each of n copies of src, the volumes src
// mounts, at the same paths: a copy may outlive src. Nil where src mounts
// none.
func (s *Service) forkVolumes(src *Box, n int) (_ [][]sandbox.VolumeMount, _ [][]*volume.Lease, err error) {
	if len(src.leases) == 0 {
		return nil, nil, nil
	}
	mounts := make([][]sandbox.VolumeMount, n)
	leases := make([][]*volume.Lease, n)
	defer func() {
		if err != nil {
			for _, ls := range leases {
				releaseVolumes(ls)
			}
		}
	}()
	for i := range n {
		for _, v := range src.volumes {
			l, err := s.cfg.Volumes.Acquire(src.owner, v.ID, true)
			if err != nil {
				return nil, nil, err
			}
			leases[i] = append(leases[i], l)
			mounts[i] = append(mounts[i], sandbox.VolumeMount{Path: v.Path, Name: v.Name, Mount: l.Mount})
		}
	}
	return mounts, leases, nil
}

// releaseVolumes ends a closed sandbox's leases: a volume no sandbox
// uses any longer is unmounted.
func releaseVolumes(leases []*volume.Lease) {
	for _, l := range leases {
		l.Release()
	}
}

// VolumeMountInfo is a volume a sandbox mounts.
type VolumeMountInfo struct {
	Name string `json:"name"`
	ID   string `json:"id"`
	Path string `json:"path"`
}

func volumeInfos(mounts []sandbox.VolumeMount, leases []*volume.Lease) []VolumeMountInfo {
	out := []VolumeMountInfo{}
	for i, m := range mounts {
		out = append(out, VolumeMountInfo{Name: m.Name, ID: leases[i].Volume.ID, Path: m.Path})
	}
	return out
}

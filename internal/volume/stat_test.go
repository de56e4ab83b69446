package volume

import "golang.org/x/sys/unix"

type unixStat struct{ bytes int64 }

// statBlocks reports the bytes of the host's disk a file takes.
func statBlocks(p string, out *unixStat) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	out.bytes = st.Blocks * 512
	return nil
}

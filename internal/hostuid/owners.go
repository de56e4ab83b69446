package hostuid

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// idFiles are where a host records the ids it hands out: users and groups
// (the third field), and the subordinate ranges of rootless containers
// (name:first:count).
var idFiles = []struct {
	path  string
	field int // index of the id field; -1 for a subordinate range
}{
	{"/etc/passwd", 2}, {"/etc/group", 2}, {"/etc/subuid", -1}, {"/etc/subgid", -1},
}

// checkUnowned fails when an id from first to last belongs to a user or
// group of the host, or to a subordinate range: a sandbox must be nobody
// the host knows.
func checkUnowned(first, last uint32) error {
	for _, f := range idFiles {
		if err := checkFile(f.path, f.field, uint64(first), uint64(last)); err != nil {
			return err
		}
	}
	return nil
}

func checkFile(path string, field int, first, last uint64) error {
	file, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("host uid pool: %w", err)
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		parts := strings.Split(sc.Text(), ":")
		var lo, n uint64
		switch {
		case field >= 0 && len(parts) > field:
			lo, err = strconv.ParseUint(parts[field], 10, 32)
			n = 1
		case field < 0 && len(parts) == 3:
			lo, err = strconv.ParseUint(parts[1], 10, 32)
			if err == nil {
				n, err = strconv.ParseUint(parts[2], 10, 32)
			}
		default:
			continue
		}
		if err != nil || n == 0 {
			continue
		}
		if lo <= last && lo+n-1 >= first {
			return fmt.Errorf("host uid pool: ids %d-%d overlap %q in %s; choose another base (--uid-base)",
				first, last, parts[0], path)
		}
	}
	return sc.Err()
}

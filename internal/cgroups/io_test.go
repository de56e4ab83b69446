//go:build linux

package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vivarium-sandbox/vivarium/internal/testutil"
)

// fakeSys builds /sys/dev/block links to device directories, as the
// kernel lays them out: a partition's directory inside its disk's, with a
// "partition" file.
func fakeSys(t *testing.T) string {
	sys := t.TempDir()
	dev := func(rel, numbers string, partition bool) {
		dir := filepath.Join(sys, "devices", rel)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "dev"), []byte(numbers+"\n"), 0o644)
		if partition {
			os.WriteFile(filepath.Join(dir, "partition"), []byte("1\n"), 0o644)
		}
		os.MkdirAll(filepath.Join(sys, "dev", "block"), 0o755)
		if err := os.Symlink(filepath.Join("..", "..", "devices", rel), filepath.Join(sys, "dev", "block", numbers)); err != nil {
			t.Fatal(err)
		}
	}
	dev("pci0/virtio1/block/vda", "254:0", false)
	dev("pci0/virtio1/block/vda/vda1", "254:1", true)
	dev("pci0/virtio1/block/vda/vda2", "254:2", true)
	dev("virtual/block/dm-0", "253:0", false)
	dev("pci0/ata1/block/sdb", "8:16", false)
	dev("pci0/ata1/block/sdb/sdb1", "8:17", true)
	dev("pci0/ata1/block/sdc", "8:32", false)
	dev("virtual/block/loop0", "7:0", false)
	return sys
}

// rdevs stands for stat(2) of device nodes.
func rdevs(nodes map[string][2]uint32) func(string) (uint32, uint32, bool) {
	return func(p string) (uint32, uint32, bool) {
		n, ok := nodes[p]
		return n[0], n[1], ok
	}
}

func TestIODevices(t *testing.T) {
	sys := fakeSys(t)
	nodes := rdevs(map[string][2]uint32{"/dev/sdb1": {8, 17}})
	for _, c := range []struct {
		name, mountinfo string
		want            []string
	}{
		{
			name: "a partition is throttled on its disk",
			mountinfo: "27 1 254:1 / / rw,relatime - ext4 /dev/vda1 rw\n" +
				"28 27 0:25 / /tmp rw - tmpfs tmpfs rw\n" +
				"29 27 8:32 / /home rw - ext4 /dev/sdc rw\n",
			want: []string{"254:0 vda"},
		},
		{
			name: "/usr apart, on device-mapper, and btrfs below it",
			mountinfo: "27 1 254:1 / / rw - ext4 /dev/vda1 rw\n" +
				"30 27 253:0 / /usr rw - xfs /dev/mapper/vg-usr rw\n" +
				"31 30 0:45 /@local /usr/local rw - btrfs /dev/sdb1 rw,subvol=/@local\n" +
				"32 27 254:2 / /var rw - ext4 /dev/vda2 rw\n",
			want: []string{"8:16 sdb", "253:0 dm-0", "254:0 vda"},
		},
		{
			name: "an overlay root: its layers' file systems",
			mountinfo: "20 1 0:30 / / rw - overlay overlay rw,lowerdir=/data/l1:/data/l2,upperdir=/data/u,workdir=/data/w\n" +
				"21 20 8:17 / /data rw - ext4 /dev/sdb1 rw\n" +
				"22 20 7:0 / /usr ro - squashfs /dev/loop0 ro\n",
			want: []string{"7:0 loop0", "8:16 sdb"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			devs, err := ioDevices(c.mountinfo, sys, nodes)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range devs {
				got = append(got, d.String()+" "+d.Name)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("got %v, want %v", got, c.want)
			}
		})
	}
	// No block device at all: no limit can be set, and saying so is the
	// only safe answer.
	_, err := ioDevices("20 1 0:30 / / rw - tmpfs rootfs rw\n21 20 0:31 / /usr rw - nfs srv:/usr rw\n", sys, nodes)
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("no block device: want ErrUnavailable, got %v", err)
	}
}

func TestIOLines(t *testing.T) {
	devs := []Device{{Major: 8, Minor: 0}, {Major: 253, Minor: 1}}
	v1 := ioLinesV1(devs, IOMax{ReadBPS: 100, WriteIOPS: 7})
	if len(v1) != 2 || !slices.Equal(v1["blkio.throttle.read_bps_device"], []string{"8:0 100", "253:1 100"}) ||
		!slices.Equal(v1["blkio.throttle.write_iops_device"], []string{"8:0 7", "253:1 7"}) {
		t.Errorf("v1: %v", v1)
	}
	v2 := ioLinesV2(devs, IOMax{ReadBPS: 100, WriteBPS: 200, ReadIOPS: 3, WriteIOPS: 7})
	if !slices.Equal(v2, []string{"8:0 rbps=100 wbps=200 riops=3 wiops=7", "253:1 rbps=100 wbps=200 riops=3 wiops=7"}) {
		t.Errorf("v2: %v", v2)
	}
	if ioLinesV2(devs, IOMax{}) != nil || len(ioLinesV1(devs, IOMax{})) != 0 {
		t.Error("no limit: nothing to write")
	}
}

// This host's devices, as the kernel sees them: every one is a whole disk
// that a throttle rule can name.
func TestRealIODevices(t *testing.T) {
	devs, err := IODevices()
	if err != nil {
		t.Skipf("no block device behind / and /usr here: %v", err)
	}
	t.Logf("devices behind / and /usr: %v", devs)
	for _, d := range devs {
		if _, err := os.Stat(filepath.Join("/sys/dev/block", d.String(), "partition")); err == nil {
			t.Errorf("%v is a partition", d)
		}
	}
}

// The kernel takes the limits for every device behind / and /usr: each
// is a whole disk (a partition's numbers would be refused with ENODEV).
func TestRealIOLimit(t *testing.T) {
	testutil.RequireRoot(t)
	m, err := Detect("vivarium-test")
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	if !m.IOController() {
		t.Skip("no blkio/io controller here")
	}
	devs, err := IODevices()
	if err != nil {
		t.Skip(err)
	}
	g, err := m.New("iolimit", Limits{IO: IOMax{ReadBPS: 3 << 20, ReadIOPS: 300, WriteBPS: 2 << 20, WriteIOPS: 200}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()
	switch g := g.(type) {
	case *group1:
		dir := g.dir(g.m.blkio)
		for file, v := range map[string]int{"read_bps_device": 3 << 20, "read_iops_device": 300,
			"write_bps_device": 2 << 20, "write_iops_device": 200} {
			got := readString(t, filepath.Join(dir, "blkio.throttle."+file))
			for _, d := range devs {
				if want := fmt.Sprintf("%s %d\n", d, v); !strings.Contains(got, want) {
					t.Errorf("blkio.throttle.%s = %q, want a line %q", file, got, want)
				}
			}
		}
	case *group2:
		got := readString(t, filepath.Join(g.dir, "io.max"))
		for _, d := range devs {
			if want := fmt.Sprintf("%s rbps=%d wbps=%d riops=300 wiops=200", d, 3<<20, 2<<20); !strings.Contains(got, want) {
				t.Errorf("io.max = %q, want a line %q", got, want)
			}
		}
	}
}

// TestDiskOf: the disk of a directory on one (the checkout's), named as
// the whole disk; a directory on none (a tmpfs) is an error.
func TestDiskOf(t *testing.T) {
	if _, err := diskOf("/dev/shm", "/sys"); err == nil {
		t.Error("/dev/shm (a tmpfs) gave a disk")
	}
	d, err := diskOf(".", "/sys")
	if err != nil {
		t.Skipf("the checkout is on no block device here: %v", err)
	}
	if d.Name == "" || d.Major == 0 {
		t.Fatalf("the checkout's disk: %+v", d)
	}
	if _, err := os.Stat(fmt.Sprintf("/sys/dev/block/%d:%d/partition", d.Major, d.Minor)); err == nil {
		t.Fatalf("%+v is a partition, not its disk", d)
	}
}

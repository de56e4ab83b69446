package rootview

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// What the synthesised /proc files say, from a host's files of the
// kernel's format. Runs without root.
func TestProcSynthesis(t *testing.T) {
	v := &ProcView{MemTotal: 256 << 20, CPUs: []int{0, 2}, BootID: "6f1f3a52-0c36-4c1e-9a43-c3a4b2e3b6a1"}
	hostStat := "cpu  28016 120 12386 386094 564 0 173 33 15 0\ncpu0 13333 47 5430 194815 84 0 25 14 6 0\n" +
		"cpu1 14683 72 6956 191279 480 0 147 18 9 0\nintr 1145744 0 0 0\nctxt 4217786\nbtime 1795442040\n" +
		"processes 31563\nprocs_running 8\nprocs_blocked 0\nsoftirq 528841 0 48297 244 13045 0 0 13 0 0 467242\n"
	hostMeminfo := "MemTotal:       24683656 kB\nMemFree:        20983188 kB\nMemAvailable:   22390176 kB\n" +
		"Cached:          1341432 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n"
	hostCgroups := "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t3\t1\nmemory\t4\t55\t1\n"
	for _, c := range []struct {
		name, got, want string
	}{
		{"stat", v.stat(hostStat), "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu2 0 0 0 0 0 0 0 0 0 0\n" +
			"intr 0\nctxt 0\nbtime 1795442040\nprocesses 0\nprocs_running 1\nprocs_blocked 0\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n"},
		{"meminfo", v.meminfo(hostMeminfo), "MemTotal:         262144 kB\nMemFree:          262144 kB\n" +
			"MemAvailable:     262144 kB\nCached:                0 kB\nHugePages_Total:       0\nHugepagesize:       2048 kB\n"},
		// A limit above the host's memory shows the host's.
		{"meminfo over the host", (&ProcView{MemTotal: 1 << 50}).meminfo("MemTotal: 1000 kB\nMemFree: 10 kB\n"),
			"MemTotal:           1000 kB\nMemFree:            1000 kB\n"},
		{"cgroups", cgroupsOne(hostCgroups), "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\nmemory\t4\t1\t1\n"},
		{"vmstat", zeroNumbers("nr_free_pages 1128559\npgalloc_dma32 77\n"), "nr_free_pages 0\npgalloc_dma32 0\n"},
		{"file-nr", zeroNumbers("3164\t0\t2466165\n"), "0\t0\t0\n"},
	} {
		if c.got != c.want {
			t.Errorf("%s:\n%q\nwant\n%q", c.name, c.got, c.want)
		}
	}
	// Every synthesised file has a maker, none of them empty.
	for _, f := range ProcSynthesised {
		if strings.TrimSpace(f.Make(v, "1 2\n")) == "" && f.Path != "meminfo" && f.Path != "stat" {
			t.Errorf("%s: empty", f.Path)
		}
	}
}

// ProcFiles writes the synthesised files a runtime can bind, from the
// kernel's files under the proc it is given, and names the rest to empty.
// Runs without root.
func TestProcFiles(t *testing.T) {
	proc, dir := t.TempDir(), t.TempDir()
	host := map[string]string{
		"meminfo": "MemTotal:       24683656 kB\nMemFree:        20983188 kB\n",
		"loadavg": "3.14 2.71 1.41 5/900 4242\n",
		"vmstat":  "nr_free_pages 1128559\n",
	}
	for name, content := range host {
		if err := os.WriteFile(filepath.Join(proc, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// stat is bindable but absent from this "kernel"; vmstat is there
	// but not bindable.
	bindable := func(p string) bool { return p == "meminfo" || p == "loadavg" || p == "stat" }
	written, masked, err := ProcFiles(dir, proc, 64<<20, bindable)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(written, []string{"loadavg", "meminfo"}) {
		t.Errorf("written %v, want [loadavg meminfo]", written)
	}
	for name, want := range map[string]string{
		"loadavg": "0.00 0.00 0.00 1/1 1\n",
		"meminfo": "MemTotal:          65536 kB\nMemFree:           65536 kB\n",
	} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s: %q (%v), want %q", name, got, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "stat")); err == nil {
		t.Error("stat written, though the kernel has none")
	}
	for _, p := range append(slices.Clone(ProcMasked), "vmstat", "cgroups", "sys/kernel/random/boot_id", "sys/fs/file-nr") {
		if !slices.Contains(masked, p) {
			t.Errorf("%s not masked", p)
		}
	}
	for _, p := range append(written, "stat") {
		if slices.Contains(masked, p) {
			t.Errorf("%s masked, though bindable", p)
		}
	}
}

// The cost of ProcFiles for the docker backend: the four files runc lets
// it bind, from this host's /proc, written and removed.
func BenchmarkProcFiles(b *testing.B) {
	dir := b.TempDir()
	lxcfs := func(p string) bool { return p == "loadavg" || p == "stat" || p == "meminfo" || p == "swaps" }
	for b.Loop() {
		d := filepath.Join(dir, "proc")
		if _, _, err := ProcFiles(d, "/proc", 128<<20, lxcfs); err != nil {
			b.Fatal(err)
		}
		if err := os.RemoveAll(d); err != nil {
			b.Fatal(err)
		}
	}
}

// ProcMasks covers what the kernel under proc has, synthesised files
// first; WithBootID gives one list a boot id per sandbox. Runs without
// root, on a proc of the test's making.
func TestProcMasks(t *testing.T) {
	proc := t.TempDir()
	for path, content := range map[string]string{
		"loadavg": "3.1 2.0 1.0 5/900 4242\n", "vmstat": "nr_free_pages 1128559\n",
		"sys/kernel/random/boot_id": "the host's\n", "kcore": "", "keys": "",
	} {
		os.MkdirAll(filepath.Join(proc, filepath.Dir(path)), 0o755)
		os.WriteFile(filepath.Join(proc, path), []byte(content), 0o444)
	}
	os.Mkdir(filepath.Join(proc, "acpi"), 0o755)
	v := &ProcView{MemTotal: 256 << 20, CPUs: []int{0}, BootID: "ignored"}
	masks := ProcMasks(proc, v)
	want := []ProcMask{
		{Path: "loadavg", Data: "0.00 0.00 0.00 1/1 1\n"},
		{Path: "vmstat", Data: "nr_free_pages 0\n"},
		{Path: bootIDPath, Data: "ignored\n"},
		{Path: "kcore", Hidden: true},
		{Path: "keys", Hidden: true},
		{Path: "acpi", Hidden: true, Dir: true},
	}
	if !slices.Equal(masks, want) {
		t.Fatalf("masks:\n%+v\nwant\n%+v", masks, want)
	}
	a, b := WithBootID(masks, NewBootID()), WithBootID(masks, NewBootID())
	if a[2].Data == b[2].Data || a[2].Data == "ignored\n" || len(a[2].Data) != 37 {
		t.Errorf("boot ids %q and %q: not each sandbox's own", a[2].Data, b[2].Data)
	}
	if masks[2].Data != "ignored\n" {
		t.Error("WithBootID changed the list it was given")
	}
}

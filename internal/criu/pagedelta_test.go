package criu

import (
	"bytes"
	"encoding/binary"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// page is a page filled with b.
func page(b byte) []byte { return bytes.Repeat([]byte{b}, pageSize) }

// writeDump writes a dump of one process id: runs of pages (vaddr: the
// pages' contents), with CRIU's header and a pages image named pagesID.
func writeDump(t *testing.T, dir string, id, pagesID uint32, runs map[uint64][][]byte) {
	t.Helper()
	hdr := binary.LittleEndian.AppendUint32(nil, imgServiceMagic)
	hdr = binary.LittleEndian.AppendUint32(hdr, pagemapMagic)
	pm := &pagemap{header: hdr, pagesID: pagesID}
	var data []byte
	for _, vaddr := range slices.Sorted(maps.Keys(runs)) {
		pm.entries = append(pm.entries, pagemapEntry{Vaddr: vaddr, Pages: uint32(len(runs[vaddr])), Flags: pePresent | peLazy})
		for _, p := range runs[vaddr] {
			data = append(data, p...)
		}
	}
	if err := os.WriteFile(pagemapPath(dir, id), pm.marshal(), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pm.pagesPath(dir), data, 0o640); err != nil {
		t.Fatal(err)
	}
}

// readThrough reads process id's memory from dir the way a restore does:
// runs in the parent are read from dir's parent view.
func readThrough(t *testing.T, dir string, id uint32) map[uint64][]byte {
	t.Helper()
	pm, err := readPagemap(pagemapPath(dir, id))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(pm.pagesPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	var parent map[uint64][]byte
	mem := map[uint64][]byte{}
	for _, e := range pm.entries {
		for i := range uint64(e.Pages) {
			v := e.Vaddr + i*pageSize
			switch {
			case e.Flags&peParent != 0:
				if parent == nil {
					parent = readThrough(t, filepath.Join(dir, ParentLink), id)
				}
				p, ok := parent[v]
				if !ok {
					t.Fatalf("page %#x in parent, and the parent has none", v)
				}
				mem[v] = p
			default:
				mem[v], data = data[:pageSize], data[pageSize:]
			}
		}
	}
	if len(data) != 0 {
		t.Fatalf("%d bytes of pages left over", len(data))
	}
	return mem
}

// TestDelta: pages identical to the paired base process's at the same
// address go to the base, the rest stay (a changed page, a page the base
// does not have, a process the base has no pair for); read back through
// the parent view, every process's memory is what it was; the rewritten
// images keep their modes and take only the kept pages.
func TestDelta(t *testing.T) {
	base, dir := t.TempDir(), t.TempDir()
	// The base's runner was pid 9.
	writeDump(t, base, 9, 2, map[uint64][][]byte{
		0x1000: {page(1), page(2), page(3), page(4)},
		0x9000: {page(9)},
	})
	// The dump's runner is pid 10: pages 1, 3 and 9 unchanged, 2 and 4
	// changed, 0x20000 new; pid 11 has no pair.
	want := map[uint64][][]byte{
		0x1000:  {page(1), page(0x22), page(3), page(0x44)},
		0x9000:  {page(9)},
		0x20000: {page(7)},
	}
	writeDump(t, dir, 10, 5, want)
	writeDump(t, dir, 11, 6, map[uint64][][]byte{0x1000: {page(1)}})
	before := map[uint32]map[uint64][]byte{10: readThrough(t, dir, 10), 11: readThrough(t, dir, 11)}

	pairs := Pairs{10: 9}
	st, err := Delta(dir, base, pairs)
	if err != nil {
		t.Fatal(err)
	}
	if st.InParent != 3 || st.Kept != 4 {
		t.Fatalf("stats %+v, want 3 in the parent, 4 kept", st)
	}
	if err := ParentView(filepath.Join(dir, ParentLink), base, pairs); err != nil {
		t.Fatal(err)
	}
	for id, mem := range before {
		got := readThrough(t, dir, id)
		if len(got) != len(mem) {
			t.Fatalf("pid %d: %d pages, want %d", id, len(got), len(mem))
		}
		for v, p := range mem {
			if !bytes.Equal(got[v], p) {
				t.Fatalf("pid %d page %#x differs", id, v)
			}
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "pages-5.img")); err != nil || fi.Size() != 3*pageSize || fi.Mode().Perm() != 0o640 {
		t.Fatalf("pages image after delta: %v %v", fi, err)
	}
	if fi, err := os.Stat(pagemapPath(dir, 10)); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("pagemap after delta: %v %v", fi, err)
	}
	// Already a delta: refused, and left as it is.
	if _, err := Delta(dir, base, pairs); err == nil || !strings.Contains(err.Error(), "already a delta") {
		t.Fatalf("a delta of a delta: %v", err)
	}
	// A base that is a delta itself is refused by a view.
	if err := ParentView(filepath.Join(t.TempDir(), "v"), dir, Pairs{10: 10}); err == nil {
		t.Fatal("a view of a delta base")
	}
}

// TestReadPagemapRefuses what is not a pagemap image.
func TestReadPagemapRefuses(t *testing.T) {
	dir := t.TempDir()
	for name, b := range map[string][]byte{
		"short":     {1, 2, 3},
		"magic":     binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, imgServiceMagic), 0x12345678),
		"truncated": append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, imgServiceMagic), pagemapMagic), 9, 0, 0, 0, 8),
		"bytes field": append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, imgServiceMagic), pagemapMagic),
			2, 0, 0, 0, 0x0a, 0),
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, b, 0o600)
		if _, err := readPagemap(p); err == nil || !strings.Contains(err.Error(), "not a CRIU pagemap image") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

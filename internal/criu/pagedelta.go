package criu

// Page images as deltas against a base dump (CRIU's own incremental
// format, which a restore reads unchanged).
//
// A dump's memory is two files per process: pagemap-<id>.img, runs of
// pages by address (vaddr, count, flags), and pages-<n>.img, the bytes of
// the runs present in this dump, in order. A run flagged in_parent
// (PE_PARENT) has no bytes here: CRIU reads them from the same process's
// pages at the same address in the dump the directory's "parent" link
// names. CRIU makes such runs itself from the kernel's soft-dirty bits
// (pre-dumps), which this kernel may lack; Delta makes them by comparing
// bytes: a page identical to the base's at the same address of the same
// process becomes a parent reference.
//
// Image layout (criu/include/magic.h, images/pagemap.proto): a 4-byte
// magic (IMG_COMMON_MAGIC, or IMG_SERVICE_MAGIC and then the image's),
// then entries, each a 4-byte little-endian size and a protobuf message:
// PagemapHead{pages_id=1} first, then PagemapEntry{vaddr=1, nr_pages=2,
// in_parent=3, flags=4}.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
)

const (
	imgCommonMagic  = 0x54564319
	imgServiceMagic = 0x55105940
	pagemapMagic    = 0x56084025

	pageSize = 4096

	// Pagemap entry flags (PE_*).
	peParent  = 1 << 0
	peLazy    = 1 << 1
	pePresent = 1 << 2

	// ParentLink is the name of a dump's link to its parent, where CRIU
	// reads the pages of PE_PARENT runs.
	ParentLink = "parent"
)

// pagemapEntry is one run of pages of a pagemap image.
type pagemapEntry struct {
	Vaddr uint64
	Pages uint32
	Flags uint32
}

// pagemap is a parsed pagemap image.
type pagemap struct {
	header  []byte // the magic words, kept as they were
	pagesID uint32
	entries []pagemapEntry
}

// readPagemap parses a pagemap image.
func readPagemap(path string) (*pagemap, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	bad := func(why string) error { return fmt.Errorf("%s: not a CRIU pagemap image: %s", path, why) }
	if len(b) < 8 {
		return nil, bad("too short")
	}
	hdr := 4
	switch binary.LittleEndian.Uint32(b) {
	case imgCommonMagic, imgServiceMagic:
		hdr = 8
	}
	if binary.LittleEndian.Uint32(b[hdr-4:]) != pagemapMagic {
		return nil, bad("wrong magic")
	}
	pm := &pagemap{header: b[:hdr:hdr]}
	rest := b[hdr:]
	for first := true; len(rest) > 0; first = false {
		if len(rest) < 4 {
			return nil, bad("truncated entry")
		}
		n := int(binary.LittleEndian.Uint32(rest))
		if n > len(rest)-4 {
			return nil, bad("truncated entry")
		}
		fields, err := protoFields(rest[4 : 4+n])
		if err != nil {
			return nil, bad(err.Error())
		}
		rest = rest[4+n:]
		if first {
			pm.pagesID = uint32(fields[1])
			continue
		}
		e := pagemapEntry{Vaddr: fields[1], Pages: uint32(fields[2]), Flags: uint32(fields[4])}
		if _, ok := fields[4]; !ok && fields[3] != 0 {
			e.Flags = peParent
		} else if !ok {
			e.Flags = pePresent
		}
		pm.entries = append(pm.entries, e)
	}
	return pm, nil
}

// protoFields decodes a protobuf message made only of varint fields (what
// pagemap messages are): field number to value.
func protoFields(b []byte) (map[int]uint64, error) {
	f := map[int]uint64{}
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, errors.New("bad varint")
		}
		b = b[n:]
		if key&7 != 0 {
			return nil, fmt.Errorf("field %d is not a varint", key>>3)
		}
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, errors.New("bad varint")
		}
		b = b[n:]
		f[int(key>>3)] = v
	}
	return f, nil
}

// marshal writes the image back.
func (pm *pagemap) marshal() []byte {
	out := append([]byte{}, pm.header...)
	msg := func(fields ...uint64) {
		var m []byte
		for i := 0; i < len(fields); i += 2 {
			m = binary.AppendUvarint(m, fields[i]<<3)
			m = binary.AppendUvarint(m, fields[i+1])
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(m)))
		out = append(out, m...)
	}
	msg(1, uint64(pm.pagesID))
	for _, e := range pm.entries {
		msg(1, e.Vaddr, 2, uint64(e.Pages), 4, uint64(e.Flags))
	}
	return out
}

// DeltaStats says what Delta did: pages kept in the dump and pages left
// to the base.
type DeltaStats struct {
	Kept, InParent int64
}

// Pairs maps a process of a dump (the id of its pagemap image, its pid
// in the sandbox) to the process of the base whose pages it is compared
// with: the same program does not always get the same pid.
type Pairs map[uint32]uint32

// pagemaps lists the processes of a dump by the ids of their private
// memory's pagemap images (pagemap-<id>.img; shared memory's are
// pagemap-shmem-<id>.img).
func pagemaps(dir string) ([]uint32, error) {
	names, err := filepath.Glob(filepath.Join(dir, "pagemap-*.img"))
	if err != nil {
		return nil, err
	}
	var ids []uint32
	for _, name := range names {
		id := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(name), "pagemap-"), ".img")
		if n, err := strconv.ParseUint(id, 10, 32); err == nil {
			ids = append(ids, uint32(n))
		}
	}
	return ids, nil
}

func pagemapPath(dir string, id uint32) string {
	return filepath.Join(dir, fmt.Sprintf("pagemap-%d.img", id))
}

// PageFiles names the pagemap and pages images of process id in dir.
func PageFiles(dir string, id uint32) (pagemap, pages string, err error) {
	pm, err := readPagemap(pagemapPath(dir, id))
	if err != nil {
		return "", "", err
	}
	return filepath.Base(pagemapPath(dir, id)), filepath.Base(pm.pagesPath(dir)), nil
}

// Delta rewrites the dump in dir so that every page of a paired process
// identical to the page at the same address of its pair in base becomes
// a parent reference (PE_PARENT). Pages are compared byte for byte:
// nothing is assumed of the base. base must be a dump without parent
// references itself. A restore needs ParentView of the same base and
// pairs as dir's parent.
func Delta(dir, base string, pairs Pairs) (DeltaStats, error) {
	var st DeltaStats
	ids, err := pagemaps(dir)
	if err != nil {
		return st, err
	}
	for _, id := range ids {
		bid, ok := pairs[id]
		if !ok {
			pm, err := readPagemap(pagemapPath(dir, id))
			if err != nil {
				return st, err
			}
			st.Kept += pm.pages()
			continue
		}
		bpm, err := readPagemap(pagemapPath(base, bid))
		if err != nil {
			return st, err
		}
		s, err := deltaOne(pagemapPath(dir, id), dir, bpm, base)
		st.Kept += s.Kept
		st.InParent += s.InParent
		if err != nil {
			return st, err
		}
	}
	return st, nil
}

// ParentView makes view (a new directory) the parent a restore of a dump
// made by Delta(_, base, pairs) reads: for each pair, the base process's
// pagemap under the dump's id, and its pages image hard-linked from base
// (copied across file systems). The restored tasks read the view with
// the credentials of the sandbox's user namespace: its directory is 0755
// and its files 0644 (the base's pages keep their own mode, which must
// let them be read), and the caller keeps it in a directory only those
// tasks reach.
func ParentView(view, base string, pairs Pairs) error {
	if err := os.Mkdir(view, 0o755); err != nil {
		return err
	}
	for id, bid := range pairs {
		pm, err := readPagemap(pagemapPath(base, bid))
		if err != nil {
			return err
		}
		for _, e := range pm.entries {
			if e.Flags&peParent != 0 {
				return fmt.Errorf("%s: a delta base has parent references itself", pagemapPath(base, bid))
			}
		}
		src := pm.pagesPath(base)
		pm.pagesID = id // one pages image per pair, named after the dump's id
		if err := os.WriteFile(pagemapPath(view, id), pm.marshal(), 0o644); err != nil {
			return err
		}
		if err := linkOrCopy(src, pm.pagesPath(view)); err != nil {
			return err
		}
	}
	return nil
}

// fileMode is path's permission bits (0600 where it cannot be read).
func fileMode(path string) os.FileMode {
	st, err := os.Stat(path)
	if err != nil {
		return 0o600
	}
	return st.Mode().Perm()
}

// linkOrCopy hard-links src to dst, or copies it where they are on two
// file systems.
func linkOrCopy(src, dst string) error {
	err := os.Link(src, dst)
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	return fileutil.CopyNew(src, dst, 0o644)
}

func (pm *pagemap) pages() int64 {
	var n int64
	for _, e := range pm.entries {
		if e.Flags&pePresent != 0 {
			n += int64(e.Pages)
		}
	}
	return n
}

// pagesPath is the pages image of a pagemap in dir.
func (pm *pagemap) pagesPath(dir string) string {
	return filepath.Join(dir, fmt.Sprintf("pages-%d.img", pm.pagesID))
}

// deltaOne rewrites one process's pagemap and pages against bpm.
func deltaOne(name, dir string, bpm *pagemap, base string) (DeltaStats, error) {
	var st DeltaStats
	pm, err := readPagemap(name)
	if err != nil {
		return st, err
	}
	// Where each of the base's pages is in its pages image.
	at := map[uint64]int64{}
	var off int64
	for _, e := range bpm.entries {
		if e.Flags&pePresent == 0 {
			continue
		}
		for i := range uint64(e.Pages) {
			at[e.Vaddr+i*pageSize] = off
			off += pageSize
		}
	}
	bf, err := os.Open(bpm.pagesPath(base))
	if err != nil {
		return st, err
	}
	defer bf.Close()
	src, err := os.Open(pm.pagesPath(dir))
	if err != nil {
		return st, err
	}
	defer src.Close()
	// The rewritten images keep the modes of the dump's.
	pmMode, pagesMode := fileMode(name), fileMode(pm.pagesPath(dir))
	tmp := pm.pagesPath(dir) + ".delta"
	dst, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return st, err
	}
	defer os.Remove(tmp)
	defer dst.Close()

	out := &pagemap{header: pm.header, pagesID: pm.pagesID}
	add := func(vaddr uint64, flags uint32) {
		if n := len(out.entries); n > 0 {
			last := &out.entries[n-1]
			if last.Flags == flags && last.Vaddr+uint64(last.Pages)*pageSize == vaddr {
				last.Pages++
				return
			}
		}
		out.entries = append(out.entries, pagemapEntry{Vaddr: vaddr, Pages: 1, Flags: flags})
	}
	page, bpage := make([]byte, pageSize), make([]byte, pageSize)
	for _, e := range pm.entries {
		switch {
		case e.Flags&peParent != 0:
			return st, fmt.Errorf("%s: already a delta", name)
		case e.Flags&^peLazy != pePresent:
			return st, fmt.Errorf("%s: pages with flags %#x are not supported", name, e.Flags)
		}
		for i := range uint64(e.Pages) {
			vaddr := e.Vaddr + i*pageSize
			if _, err := io.ReadFull(src, page); err != nil {
				return st, fmt.Errorf("%s: %w", pm.pagesPath(dir), err)
			}
			if o, ok := at[vaddr]; ok {
				if _, err := bf.ReadAt(bpage, o); err != nil {
					return st, fmt.Errorf("%s: %w", bpm.pagesPath(base), err)
				}
				if bytes.Equal(page, bpage) {
					add(vaddr, peParent)
					st.InParent++
					continue
				}
			}
			if _, err := dst.Write(page); err != nil {
				return st, err
			}
			add(vaddr, e.Flags)
			st.Kept++
		}
	}
	if err := dst.Close(); err != nil {
		return st, err
	}
	if err := os.Chmod(tmp, pagesMode); err != nil {
		return st, err
	}
	if err := os.WriteFile(name+".delta", out.marshal(), 0o600); err != nil {
		return st, err
	}
	if err := os.Chmod(name+".delta", pmMode); err != nil {
		return st, err
	}
	defer os.Remove(name + ".delta")
	if err := os.Rename(tmp, pm.pagesPath(dir)); err != nil {
		return st, err
	}
	return st, os.Rename(name+".delta", name)
}

package snapshot

// Packed files: CRIU's page images, the bulk of a snapshot and of a
// paused sandbox kept on disk, are stored compressed (zstd: a Python
// process's pages shrink about 4.5 times, and come back at about 1 GB/s,
// which a resume from disk waits for). The compressor is this package's
// only user of github.com/klauspost/compress.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"

	"github.com/klauspost/compress/zstd"
)

// PackedSuffix ends the name of a packed file.
const PackedSuffix = ".zst"

// Pack writes src, compressed, to dst (new, mode 0600) and returns src's
// size, which Unpack needs.
func Pack(dst, src string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	enc, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedDefault),
		zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)))
	if err != nil {
		out.Close()
		return 0, err
	}
	n, err := io.Copy(enc, in)
	if cerr := enc.Close(); err == nil {
		err = cerr
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return 0, err
	}
	return n, nil
}

// Unpack writes the packed file src, uncompressed, to dst (new, with
// mode). size is what Pack returned: a file that does not come back to
// exactly that size is refused, and nothing is left at dst.
func Unpack(dst, src string, size int64, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	dec, err := zstd.NewReader(in, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return err
	}
	defer dec.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, io.LimitReader(dec, size+1))
	if err == nil && n != size {
		err = fmt.Errorf("%s unpacks to %d bytes, not %d", src, n, size)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return errors.Join(errors.New("unpack"), err)
	}
	return nil
}

package image

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

// decompress reads a layer blob as its content: gzip and zstd by their
// magic numbers, anything else as it is (an uncompressed tar). A
// malformed stream fails as the layer is read.
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: a layer is not valid gzip: %v", ErrRefused, err)
		}
		return zr, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// A window of at most 64 MiB: zstd lets a stream ask for more.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
		if err != nil {
			return nil, fmt.Errorf("%w: a layer is not valid zstd: %v", ErrRefused, err)
		}
		return zr.IOReadCloser(), nil
	}
	return io.NopCloser(br), nil
}

package template

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/vivarium-sandbox/vivarium/internal/image"
)

// Push sends the store's image ref (a template built here, or any image
// of the store) to a registry as dest, and returns the digest of the
// manifest it pushed. The store keeps layers unpacked, so each is
// written again as a tar (whiteouts and opaque directories as ".wh."
// entries, hard links as links: UpperLayer's walk, which follows no
// link) and gzipped; the configuration is the image's, its diff IDs
// those of the tars written. The same layer gives the same blob, and
// the store remembers it (image.Packed): a layer two templates share is
// one blob of the registry, and a push after the first writes no tar
// for a layer the registry has. A node pulls the result as any image
// (image.Pull), through the store's checks. progress, if not nil, hears
// of the bytes sent of all there is to send.
func Push(ctx context.Context, s *image.Store, ref, dest string, o image.PullOptions, progress func(sent, total int64)) (string, error) {
	im, err := s.Get(ref)
	if err != nil {
		return "", err
	}
	cfg, err := s.ConfigFile(im)
	if err != nil {
		return "", err
	}
	to, err := o.Parse(dest)
	if err != nil {
		return "", err
	}
	// The layers are mutate's to append, each with the diff ID of its
	// tar, and the history is not the new layers': both go.
	cfg.RootFS.DiffIDs, cfg.History = nil, nil
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return "", err
	}
	for _, id := range im.Layers {
		l, err := packLayer(ctx, s, id)
		if err != nil {
			return "", fmt.Errorf("layer %s: %w", id, err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return "", err
		}
	}
	opts := o.RemoteOptions(ctx)
	if progress != nil {
		updates := make(chan v1.Update, 16)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for u := range updates {
				progress(u.Complete, u.Total)
			}
		}()
		defer func() { <-done }()
		opts = append(opts, remote.WithProgress(updates)) // closed by remote.Write
	}
	if err := remote.Write(to, img, opts...); err != nil {
		return "", fmt.Errorf("push %s: %w", dest, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}

// packedLayer is a layer of the store as a push sends it: its tar
// gzipped at the best speed, streamed from its files whenever it is
// read (nothing of it is kept in memory or on disk), its digests known.
type packedLayer struct {
	dir            string
	digest, diffID v1.Hash
	size           int64
}

// packLayer is the store's layer id as a push sends it: its digests as
// the store remembers them (image.Packed), or found by writing it once.
func packLayer(ctx context.Context, s *image.Store, id string) (*packedLayer, error) {
	l := &packedLayer{dir: s.LayerDir(id)}
	p, ok := s.Packed(id)
	if !ok || p.Go != runtime.Version() {
		tarSum, blobSum, n := sha256.New(), sha256.New(), &counter{}
		gz, _ := gzip.NewWriterLevel(io.MultiWriter(blobSum, n), gzip.BestSpeed)
		r := layerTar(l.dir)
		defer r.Close()
		if _, err := io.Copy(io.MultiWriter(tarSum, gz), ctxReader{ctx, r}); err != nil {
			return nil, err
		}
		if err := gz.Close(); err != nil {
			return nil, err
		}
		p = image.Packed{DiffID: "sha256:" + hex.EncodeToString(tarSum.Sum(nil)),
			Digest: "sha256:" + hex.EncodeToString(blobSum.Sum(nil)), Size: n.n, Go: runtime.Version()}
		s.SetPacked(id, p) // a record lost is a layer written once more
	}
	var err1, err2 error
	l.diffID, err1 = v1.NewHash(p.DiffID)
	l.digest, err2 = v1.NewHash(p.Digest)
	l.size = p.Size
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("the store's record of it: %v %v", err1, err2)
	}
	return l, nil
}

func (l *packedLayer) Digest() (v1.Hash, error)             { return l.digest, nil }
func (l *packedLayer) DiffID() (v1.Hash, error)             { return l.diffID, nil }
func (l *packedLayer) Size() (int64, error)                 { return l.size, nil }
func (l *packedLayer) MediaType() (types.MediaType, error)  { return types.DockerLayer, nil }
func (l *packedLayer) Uncompressed() (io.ReadCloser, error) { return layerTar(l.dir), nil }

// Compressed is the tar gzipped as packLayer wrote it (the same bytes:
// the same files, writer and level); a registry checks its digest.
func (l *packedLayer) Compressed() (io.ReadCloser, error) {
	r, w := io.Pipe()
	go func() {
		tr := layerTar(l.dir)
		defer tr.Close()
		bw := bufio.NewWriterSize(w, 1<<20) // the upload's writes in large pieces
		gz, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed)
		_, err := io.Copy(gz, tr)
		if err == nil {
			err = gz.Close()
		}
		if err == nil {
			err = bw.Flush()
		}
		w.CloseWithError(err)
	}()
	return r, nil
}

// layerTar streams the store's layer dir as an uncompressed tar.
func layerTar(dir string) io.ReadCloser {
	r, w := io.Pipe()
	go func() {
		_, err := UpperLayer(dir, 0, 0, w)
		w.CloseWithError(err)
	}()
	return r
}

type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// ctxReader stops reading once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

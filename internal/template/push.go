package template

import (
	"context"
	"fmt"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/vivarium-sandbox/vivarium/internal/image"
)

// Push sends the store's image ref (a template built here, or any image
// of the store) to a registry as dest, and returns the digest of the
// manifest it pushed. The store keeps layers unpacked, so each is
// written again as a tar (whiteouts and opaque directories as ".wh."
// entries, hard links as links: UpperLayer's walk, which follows no
// link) and gzipped; the configuration is the image's, its diff IDs
// those of the tars written. The tars are the same for the same layer,
// so a layer two templates share is one blob of the registry, sent once.
// A node pulls the result as any image (image.Pull), through the
// store's checks. progress, if not nil, hears of the bytes sent of all
// there is to send.
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
		dir := s.LayerDir(id)
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return layerTar(dir), nil },
			tarball.WithCompressedCaching)
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

// layerTar streams the store's layer dir as an uncompressed tar.
func layerTar(dir string) io.ReadCloser {
	r, w := io.Pipe()
	go func() {
		_, err := UpperLayer(dir, 0, 0, w)
		w.CloseWithError(err)
	}()
	return r
}

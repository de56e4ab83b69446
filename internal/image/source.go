package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The sources of images: a registry (Pull) and an archive (Import). Each
// gives the store a v1.Image; the store reads it the same way.

// PullOptions say how a registry is reached.
type PullOptions struct {
	// Insecure registries ("host:port") are reached over plain HTTP.
	Insecure []string
	// Mirrors maps a registry ("index.docker.io") to a mirror
	// ("mirror.local:5000") tried first; the registry is tried if the
	// mirror fails.
	Mirrors map[string]string
	// Keychain gives credentials; nil: Docker's config.json
	// ($DOCKER_CONFIG, else ~/.docker).
	Keychain authn.Keychain
	// MaxBytes bounds what the image's layers unpack to, below the
	// store's own bound (0: the store's).
	MaxBytes int64
}

// Pull adds the image ref from its registry (or its mirror) to the store.
func Pull(ctx context.Context, s *Store, ref string, o PullOptions, progress func(Progress)) (Image, error) {
	r, err := o.parse(ref, "")
	if err != nil {
		return Image{}, err
	}
	opts := o.RemoteOptions(ctx)
	var img v1.Image
	if m := o.Mirrors[r.Context().RegistryStr()]; m != "" {
		mr, merr := o.parse(ref, m)
		if merr == nil {
			img, err = remote.Image(mr, opts...)
		} else {
			err = merr
		}
		if err != nil {
			img, err = nil, fmt.Errorf("mirror %s: %w", m, err)
		}
	}
	if img == nil {
		var rerr error
		if img, rerr = remote.Image(r, opts...); rerr != nil {
			return Image{}, errors.Join(err, fmt.Errorf("pull %s: %w", ref, rerr))
		}
	}
	return s.AddWithin(ctx, r.Name(), img, o.MaxBytes, progress)
}

// RemoteOptions are go-containerregistry's options for reaching a
// registry as o says: its credentials, plain HTTP only to the registries
// named insecure, and the host's platform of a multi-platform index.
func (o PullOptions) RemoteOptions(ctx context.Context) []remote.Option {
	kc := o.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}),
		remote.WithTransport(&plainHTTPGuard{base: remote.DefaultTransport, insecure: o.Insecure})}
}

// Resolve returns the digest of the manifest ref names in its registry
// (not its mirror's): what a pull of it would take, asked without
// taking it.
func Resolve(ctx context.Context, ref string, o PullOptions) (string, error) {
	r, err := o.Parse(ref)
	if err != nil {
		return "", err
	}
	// One retry, soon: a look-up is on a creation's path.
	opts := append(o.RemoteOptions(ctx), remote.WithRetryBackoff(remote.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 2}))
	d, err := remote.Head(r, opts...)
	if err != nil {
		return "", fmt.Errorf("look up %s: %w", ref, err)
	}
	return d.Digest.String(), nil
}

// Parse parses ref as a reference of its registry, over plain HTTP
// where o names the registry insecure.
func (o PullOptions) Parse(ref string) (name.Reference, error) { return o.parse(ref, "") }

// parse parses ref; with a mirror, ref's registry is replaced by it.
func (o PullOptions) parse(ref, mirror string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrBadName, ref, err)
	}
	registry := r.Context().RegistryStr()
	if mirror != "" {
		registry = mirror
	}
	var opts []name.Option
	for _, h := range o.Insecure {
		if h == registry {
			opts = append(opts, name.Insecure)
		}
	}
	if mirror == "" && len(opts) == 0 {
		return r, nil
	}
	full := registry + "/" + r.Context().RepositoryStr()
	if d, ok := r.(name.Digest); ok {
		full += "@" + d.DigestStr()
	} else {
		full += ":" + r.Identifier()
	}
	return name.ParseReference(full, opts...)
}

// Limits of an archive's own files, read before anything else of it.
const (
	maxArchiveJSON    = 4 << 20 // manifest.json, index.json
	maxArchiveEntries = 100_000
)

var blobPath = regexp.MustCompile(`^blobs/sha256/[0-9a-f]{64}$`)

// Import adds the image of an archive to the store: a `docker save` tar
// (manifest.json) or an OCI image layout tar (index.json). It is named
// tag if given, else by the archive (its repository tag, or the
// reference annotation of its index).
func Import(ctx context.Context, s *Store, file, tag string, progress func(Progress)) (Image, error) {
	kind, err := scanArchive(file)
	if err != nil {
		return Image{}, err
	}
	if kind == "docker" {
		m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(file) })
		if err != nil {
			return Image{}, fmt.Errorf("%w: its manifest.json: %v", ErrRefused, err)
		}
		if len(m) != 1 {
			return Image{}, fmt.Errorf("%w: it holds %d images; import one per archive", ErrRefused, len(m))
		}
		if tag == "" && len(m[0].RepoTags) > 0 {
			tag = m[0].RepoTags[0]
		}
		if tag == "" {
			return Image{}, fmt.Errorf("%w: the archive names no image; give it a name with --tag", ErrBadName)
		}
		img, err := tarball.ImageFromPath(file, nil)
		if err != nil {
			return Image{}, fmt.Errorf("%w: %v", ErrRefused, err)
		}
		return s.Add(ctx, tag, rawLayers{img}, progress)
	}
	// An OCI layout is read from a directory: its blobs are copied to
	// staging first (by name, each a plain file).
	dir, err := os.MkdirTemp(filepath.Join(s.dir, "staging"), "layout-")
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(dir)
	if err := extractLayout(file, dir); err != nil {
		return Image{}, err
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return Image{}, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return Image{}, fmt.Errorf("%w: its index.json: %v", ErrRefused, err)
	}
	if len(im.Manifests) != 1 {
		return Image{}, fmt.Errorf("%w: its index lists %d manifests; import one image per archive", ErrRefused, len(im.Manifests))
	}
	desc := im.Manifests[0]
	if tag == "" {
		tag = desc.Annotations["io.containerd.image.name"]
	}
	if tag == "" {
		if n := desc.Annotations["org.opencontainers.image.ref.name"]; strings.ContainsAny(n, "/:") {
			tag = n
		}
	}
	if tag == "" {
		return Image{}, fmt.Errorf("%w: the archive names no image; give it a name with --tag", ErrBadName)
	}
	var img v1.Image
	if desc.MediaType.IsIndex() {
		child, err := idx.ImageIndex(desc.Digest)
		if err != nil {
			return Image{}, fmt.Errorf("%w: %v", ErrRefused, err)
		}
		if img, err = platformImage(child); err != nil {
			return Image{}, err
		}
	} else if img, err = idx.Image(desc.Digest); err != nil {
		return Image{}, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	return s.Add(ctx, tag, img, progress)
}

// platformImage is the image of an index for this host's platform.
func platformImage(idx v1.ImageIndex) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	for _, d := range im.Manifests {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("%w: the archive has no image for linux/%s", ErrRefused, runtime.GOARCH)
}

// scanArchive reads the headers of an archive and says what it is
// ("docker" or "oci"), refusing one whose own files are over their
// bounds.
func scanArchive(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var docker, oci bool
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("%w: not a tar archive: %v", ErrRefused, err)
		}
		if n >= maxArchiveEntries {
			return "", fmt.Errorf("%w: the archive has more than %d entries", ErrRefused, maxArchiveEntries)
		}
		limit := int64(maxArchiveJSON)
		switch name := path.Clean(hdr.Name); {
		case name == "manifest.json":
			docker = true
		case name == "index.json":
			oci = true
		case strings.HasSuffix(name, ".json"):
			limit = maxConfig // a docker save archive's configurations
		default:
			continue
		}
		if hdr.Size > limit {
			return "", fmt.Errorf("%w: its %s is larger than %s", ErrRefused, hdr.Name, FormatBytes(limit))
		}
	}
	switch {
	case docker:
		return "docker", nil
	case oci:
		return "oci", nil
	}
	return "", fmt.Errorf("%w: the archive is neither a docker save archive (manifest.json) nor an OCI image layout (index.json)", ErrRefused)
}

// extractLayout copies an OCI layout archive's index.json, oci-layout
// and blobs into dir; other entries are left out.
func extractLayout(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll("blobs/sha256", 0o700); err != nil {
		return err
	}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: not a tar archive: %v", ErrRefused, err)
		}
		n := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if hdr.Typeflag != tar.TypeReg || !(n == "index.json" || n == "oci-layout" || blobPath.MatchString(n)) {
			continue
		}
		out, err := root.OpenFile(n, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}

// plainHTTPGuard refuses a request over plain HTTP to a host not named
// insecure: go-containerregistry tries HTTP by itself for registries on
// loopback, private and .local addresses, and a redirect may lead
// anywhere.
type plainHTTPGuard struct {
	base     http.RoundTripper
	insecure []string
}

func (g *plainHTTPGuard) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" && !slices.Contains(g.insecure, r.URL.Host) {
		return nil, fmt.Errorf("%s is not named an insecure registry: plain HTTP to it is refused (name it with --insecure-registry %s)",
			r.URL.Host, r.URL.Host)
	}
	return g.base.RoundTrip(r)
}

package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/rootview"
	"github.com/vivarium-sandbox/vivarium/internal/runner"
)

// The image is the containers' root file system, and holds almost
// nothing: the directories that are mount points and the links of the
// native backend's root (/bin → usr/bin, /root → workspace ...). Python,
// its libraries, /etc and the runner come from the host by read-only binds
// (see root), as in the native and gVisor backends, so that the three
// backends run the same interpreter and packages and nothing is copied:
// an image holding the host's Python would be hundreds of megabytes to
// build and to keep in step with the host. There is no registry: the image
// is imported from a tar archive Vivarium writes, and named after its
// content, so that a changed layout gets a new name.
const imageRepo = "vivarium-sandbox"

// imageTar is the image's content: the skeleton's directories and links
// outside /etc and the runner's directory (which the containers bind from
// the skeleton), in a deterministic archive.
func imageTar(skeleton string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// /sys is an empty tmpfs in every container; its mount point is ours.
	dirs := map[string]bool{"sys": true}
	err := filepath.WalkDir(skeleton, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == skeleton {
			return err
		}
		rel, _ := filepath.Rel(skeleton, p)
		if strings.HasPrefix(rel, "etc/") || strings.HasPrefix(rel, "opt/vivarium/") {
			return nil
		}
		hdr := &tar.Header{Name: rel, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, target, 0o777
		case d.IsDir():
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, rel+"/", 0o755
			delete(dirs, rel)
		default:
			return nil
		}
		return tw.WriteHeader(hdr)
	})
	if err != nil {
		return nil, err
	}
	for d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755,
			ModTime: time.Unix(0, 0), Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// imageName is the image's reference: its repository and a tag from its
// content's hash.
func imageName(content []byte) string {
	sum := sha256.Sum256(content)
	return imageRepo + ":" + hex.EncodeToString(sum[:])[:16]
}

// ensureImage imports the image unless the daemon has it already, and
// says whether it did.
func (c *client) ensureImage(ctx context.Context, name string, content []byte, progress func(string)) (bool, error) {
	ok, err := c.hasImage(ctx, name)
	if err != nil || ok {
		return false, err
	}
	return true, c.importImage(ctx, name, content, progress)
}

// BuildImage builds the sandbox image in the daemon at host (see Config.Host)
// unless it has it already, reporting each step to progress, and returns
// the image's name. The backend does the same when it starts; this is for
// doing it ahead of time (`vivarium image build`).
func BuildImage(ctx context.Context, host string, progress func(string)) (string, error) {
	if progress == nil {
		progress = func(string) {}
	}
	progress("connecting to the Docker daemon")
	c, _, err := connect(ctx, Config{Host: host})
	if err != nil {
		return "", err
	}
	defer c.http.CloseIdleConnections()
	progress(fmt.Sprintf("daemon at %s, API %s", c.socket, c.version))
	dir, err := os.MkdirTemp("", "vivarium-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	progress("writing the root's layout (mount points and links; the rest is bound from the host)")
	if err := rootview.RootSkeleton(dir, runner.Files()); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, agentPath), nil, 0o755); err != nil {
		return "", err
	}
	content, err := imageTar(dir)
	if err != nil {
		return "", err
	}
	name := imageName(content)
	progress(fmt.Sprintf("image %s: %d bytes of archive", name, len(content)))
	if ok, err := c.hasImage(ctx, name); err != nil {
		return "", err
	} else if ok {
		progress("the daemon has it already")
		return name, nil
	}
	progress("importing it (docker import)")
	if err := c.importImage(ctx, name, content, progress); err != nil {
		return "", err
	}
	progress("done")
	return name, nil
}

// hasImage reports whether the daemon has the image.
func (c *client) hasImage(ctx context.Context, name string) (bool, error) {
	err := c.call(ctx, "GET", "/images/"+name+"/json", nil, nil, nil)
	if statusOf(err) == 404 {
		return false, nil
	}
	return err == nil, err
}

// importImage imports content as the image name (POST /images/create
// with fromSrc=-, what `docker import` does), reporting progress.
func (c *client) importImage(ctx context.Context, name string, content []byte, progress func(string)) error {
	repo, tag, _ := strings.Cut(name, ":")
	q := url.Values{"fromSrc": {"-"}, "repo": {repo}, "tag": {tag},
		"message": {"Vivarium's sandbox root: mount points and links; the rest is bound from the host"}}
	resp, err := c.send(ctx, "POST", "/images/create", q, bytes.NewReader(content))
	if err != nil {
		return fmt.Errorf("import the image %s: %w", name, err)
	}
	defer resp.Body.Close()
	if err := jsonStream(resp.Body, progress); err != nil {
		return fmt.Errorf("import the image %s: %w", name, err)
	}
	if ok, err := c.hasImage(ctx, name); err != nil || !ok {
		return fmt.Errorf("import the image %s: the daemon does not have it afterwards (%v)", name, err)
	}
	return nil
}

// oldImages lists the images of the repository other than keep: those an
// earlier layout of the root made.
func (c *client) oldImages(ctx context.Context, keep string) ([]string, error) {
	var imgs []struct{ RepoTags []string }
	q := url.Values{"filters": {`{"reference":["` + imageRepo + `"]}`}}
	if err := c.call(ctx, "GET", "/images/json", q, nil, &imgs); err != nil {
		return nil, err
	}
	var out []string
	for _, img := range imgs {
		for _, t := range img.RepoTags {
			if strings.HasPrefix(t, imageRepo+":") && t != keep {
				out = append(out, t)
			}
		}
	}
	return out, nil
}

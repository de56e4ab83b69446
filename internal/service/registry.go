package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/template"
)

// A cluster's nodes share templates through a registry (Config.Registry,
// `vivarium serve --template-registry`): a template a key builds on one
// node is pushed there, and a node asked for a template it lacks pulls
// it from there by digest, on first use, through its store's checks.
//
//	REPO/keys/k<digest of the key>/NAME:TAG   a key's templates (E2B's build API)
//	REPO/PATH:TAG                             the operator's, for every key (vivarium image push)
//
// A key's own names come first; then the node's image store; then the
// registry's shared templates. A tag a node has looked up is asked about
// again (a HEAD of its manifest, in the background) by the first
// creation after Recheck, so a template rebuilt on another node is used
// soon after Recheck; a registry out of reach leaves the node with what
// it has.

// TemplateRegistry is where a cluster's nodes share templates.
type TemplateRegistry struct {
	// Repo is the repository the templates go under
	// ("registry.lan:5000/vivarium").
	Repo string
	// Options reach it: plain HTTP only where it is named insecure, and
	// credentials (Docker's config.json unless a Keychain is given).
	Options image.PullOptions
	// Recheck is how long a tag looked up is used before the registry is
	// asked again (30 s).
	Recheck time.Duration
	// Unused is how long a template this node pulled stays in its store
	// unused (24 h): then it is removed, and pulled again when asked for.
	Unused time.Duration
}

// Bounds of the registry's work on a creation's path: a look-up, and
// the pull of a template not on this node yet (which creations of it
// wait for, each with its own context).
const (
	registryLookup   = 10 * time.Second
	registryPull     = 30 * time.Minute
	registryRecheck  = 30 * time.Second
	registryUnused   = 24 * time.Hour
	registryKeysPath = "keys"
)

// registry is a node's view of its TemplateRegistry.
type registry struct {
	cfg    TemplateRegistry
	images *image.Store
	log    *slog.Logger
	now    func() time.Time

	mu   sync.Mutex
	tags map[string]*regTag // by reference (REPO/PATH:TAG)
	// used is when each image this node pulled (by its store name) was
	// last made a sandbox of, or first seen by sweep.
	used map[string]time.Time
}

// regTag is what a tag of the registry was last found to be.
type regTag struct {
	digest  string // "": the registry has no such tag
	local   string // the store's name of that digest's image
	checked time.Time
	busy    chan struct{} // a look-up (or pull) of it under way: closed when it ends
}

// Bounds: at most this many tags remembered (past it, all are
// forgotten and asked about again).
const maxRegTags = 4096

// Check says what is wrong with t, if anything.
func (t TemplateRegistry) Check() error {
	if t.Repo == "" {
		return nil
	}
	if _, err := name.NewRepository(strings.TrimSuffix(t.Repo, "/")); err != nil || !strings.Contains(t.Repo, "/") {
		return fmt.Errorf("template registry %q: want REGISTRY/REPOSITORY (registry.lan:5000/vivarium)", t.Repo)
	}
	return nil
}

// newRegistry is the registry of cfg (nil: none); cfg was checked.
func newRegistry(cfg TemplateRegistry, images *image.Store, log *slog.Logger, now func() time.Time) *registry {
	if cfg.Repo == "" {
		return nil
	}
	if err := cfg.Check(); err != nil || images == nil {
		panic(fmt.Sprintf("service: a template registry needs a valid repository (%v) and the image store", err))
	}
	cfg.Repo = strings.TrimSuffix(cfg.Repo, "/")
	if cfg.Recheck <= 0 {
		cfg.Recheck = registryRecheck
	}
	if cfg.Unused <= 0 {
		cfg.Unused = registryUnused
	}
	return &registry{cfg: cfg, images: images, log: log, now: now, tags: map[string]*regTag{}, used: map[string]time.Time{}}
}

// pulled reports whether the store's image n is one this node pulled
// from the registry (REPO/PATH@DIGEST).
func (r *registry) pulled(n string) bool {
	return strings.HasPrefix(n, r.cfg.Repo+"/") && strings.Contains(n, "@")
}

// sweep removes the images this node pulled that no creation has used
// for Unused (an image already there when the server started counts
// from then), and forgets the tags that named them. Their layers go once
// no sandbox holds them (a sandbox of one goes on).
func (r *registry) sweep() {
	list, err := r.images.List()
	if err != nil {
		r.log.Warn("template registry: the image store's list", "err", err)
		return
	}
	now := r.now()
	var gone []string
	r.mu.Lock()
	present := map[string]bool{}
	for _, im := range list {
		if !r.pulled(im.Name) {
			continue
		}
		present[im.Name] = true
		last, ok := r.used[im.Name]
		switch {
		case !ok:
			r.used[im.Name] = now
		case now.Sub(last) >= r.cfg.Unused:
			gone = append(gone, im.Name)
			delete(r.used, im.Name)
			for ref, t := range r.tags {
				if t.local == im.Name && t.busy == nil {
					delete(r.tags, ref)
				}
			}
		}
	}
	for n := range r.used {
		if !present[n] {
			delete(r.used, n)
		}
	}
	r.mu.Unlock()
	for _, n := range gone {
		if err := r.images.Remove(n); err != nil {
			r.log.Warn("template registry: an unused template's removal", "image", n, "err", err)
		} else {
			r.log.Info("template registry: unused template removed", "image", n, "unused", r.cfg.Unused)
		}
	}
}

// keyRef is where the registry keeps owner's template ref ("name",
// "name:tag"); "" for what cannot be one of a key's names.
func (r *registry) keyRef(owner, ref string) string {
	n, tag, err := parseTemplateRef(ref)
	if err != nil {
		return ""
	}
	if tag == "" {
		tag = defaultTag
	}
	sum := sha256.Sum256([]byte(owner))
	return fmt.Sprintf("%s/%s/k%s/%s:%s", r.cfg.Repo, registryKeysPath, hex.EncodeToString(sum[:8]), n, tag)
}

// sharedRef is where the registry keeps the shared template ref names
// ("tools:1", "team/tools:1", "tools@sha256:..."); "" for a name of
// another registry, or one under the keys' path.
func (r *registry) sharedRef(ref string) string {
	parsed, err := name.ParseReference(ref)
	if err != nil || parsed.Context().RegistryStr() != name.DefaultRegistry {
		return ""
	}
	if first, _, ok := strings.Cut(ref, "/"); ok && (first == "docker.io" || first == name.DefaultRegistry) {
		return "" // Docker Hub named, not a short name
	}
	path := strings.TrimPrefix(parsed.Context().RepositoryStr(), "library/")
	if path == registryKeysPath || strings.HasPrefix(path, registryKeysPath+"/") {
		return ""
	}
	sep := ":"
	if _, ok := parsed.(name.Digest); ok {
		sep = "@"
	}
	return r.cfg.Repo + "/" + path + sep + parsed.Identifier()
}

// local returns the image store's name of what the registry's ref is
// now, pulling it if the store lacks it. ErrNoTemplate: the registry has
// no such tag. A tag known (found or not) is answered at once; once
// Recheck has passed, it is looked up again in the background, and the
// creations after that use what it found. Only a tag never looked up,
// or whose image has left the store, waits for the registry.
func (r *registry) local(ctx context.Context, ref string) (string, error) {
	for {
		r.mu.Lock()
		t := r.tags[ref]
		var seen regTag
		if t != nil {
			seen = *t
		}
		r.mu.Unlock()
		// The store is read outside the lock: a disk's pace is not
		// every creation's.
		if t != nil && !seen.checked.IsZero() && (seen.digest == "" || r.stored(seen.local)) {
			if r.now().Sub(seen.checked) >= r.cfg.Recheck {
				r.start(context.Background(), ref, t, false)
			}
			if seen.digest != "" && r.pulled(seen.local) {
				r.mu.Lock()
				r.used[seen.local] = r.now()
				r.mu.Unlock()
			}
			return seen.found(ref)
		}
		if seen.busy != nil {
			select {
			case <-seen.busy:
				continue
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
		r.mu.Lock()
		if r.tags[ref] != t || t != nil && t.busy != nil {
			r.mu.Unlock()
			continue // another got there first
		}
		if t == nil {
			if len(r.tags) >= maxRegTags {
				clear(r.tags)
			}
			t = &regTag{}
			r.tags[ref] = t
		}
		r.mu.Unlock()
		// The look-up and the pull are the node's, not this request's:
		// others may wait for them, so they go on if it goes.
		if err := r.start(context.WithoutCancel(ctx), ref, t, true); err != nil {
			return "", err
		}
	}
}

// start looks ref (of t) up and pulls what it names, unless a look-up
// of it is under way; with wait, it returns the look-up's error at its
// end, else the look-up runs in the background.
func (r *registry) start(ctx context.Context, ref string, t *regTag, wait bool) error {
	r.mu.Lock()
	if t.busy != nil {
		r.mu.Unlock()
		return nil
	}
	t.busy = make(chan struct{})
	was := *t
	r.mu.Unlock()
	run := func() error {
		digest, local, err := r.refresh(ctx, ref, was)
		r.mu.Lock()
		defer r.mu.Unlock()
		if err == nil {
			if was.local != "" && was.local != local && !strings.HasPrefix(was.local, templateImagePrefix) {
				// The tag moved: the old image goes once no sandbox
				// holds its layers.
				go r.images.Remove(was.local)
			}
			t.digest, t.local, t.checked = digest, local, r.now()
		}
		close(t.busy)
		t.busy = nil
		return err
	}
	if !wait {
		go run()
		return nil
	}
	return run()
}

func (t regTag) found(ref string) (string, error) {
	if t.digest == "" {
		return "", fmt.Errorf("%w: %s", ErrNoTemplate, ref)
	}
	return t.local, nil
}

// stored reports whether the store has an image named n.
func (r *registry) stored(n string) bool {
	_, err := r.images.Get(n)
	return err == nil
}

// refresh asks the registry what ref is, and pulls it by digest if the
// store lacks it. A registry out of reach leaves was as it is, if the
// store still has it.
func (r *registry) refresh(ctx context.Context, ref string, was regTag) (digest, local string, err error) {
	lctx, cancel := context.WithTimeout(ctx, registryLookup)
	digest, err = image.Resolve(lctx, ref, r.cfg.Options)
	cancel()
	var terr *transport.Error
	switch {
	case errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound:
		return "", "", nil
	case err != nil && was.digest != "" && r.stored(was.local):
		r.log.Warn("template registry out of reach: using the template pulled before", "ref", ref, "err", err)
		return was.digest, was.local, nil
	case err != nil && !was.checked.IsZero() && was.digest == "":
		return "", "", nil // it was not there, and is taken to be still not there
	case err != nil:
		r.log.Warn("template registry: look-up failed", "ref", ref, "err", err)
		return "", "", r.failed(ref)
	case digest == was.digest && r.stored(was.local):
		return digest, was.local, nil
	}
	parsed, err := r.cfg.Options.Parse(ref)
	if err != nil {
		return "", "", err
	}
	local = parsed.Context().Name() + "@" + digest
	if r.stored(local) {
		return digest, local, nil
	}
	pctx, cancel := context.WithTimeout(ctx, registryPull)
	defer cancel()
	start := r.now()
	im, err := image.Pull(pctx, r.images, local, r.cfg.Options, nil)
	if err != nil {
		r.log.Warn("template registry: pull failed", "ref", ref, "err", err)
		return "", "", r.failed(ref)
	}
	r.log.Info("template pulled from the registry", "ref", ref, "digest", digest, "bytes", im.Size,
		"took", r.now().Sub(start).Round(time.Millisecond))
	return digest, im.Name, nil
}

// ErrRegistry: the template registry could not be asked, or a template
// of it not pulled.
var ErrRegistry = errors.New("the template registry failed")

// failed is ErrRegistry for ref, as clients are told it: the template's
// name, not the registry's address or its answer (which the log has).
func (r *registry) failed(ref string) error {
	n := strings.TrimPrefix(ref, r.cfg.Repo+"/")
	if strings.HasPrefix(n, registryKeysPath+"/") {
		n = n[strings.LastIndex(n, "/")+1:] // the key's own name
	}
	return fmt.Errorf("%w: template %s could not be looked up or pulled (the server's log says why)", ErrRegistry, n)
}

// publish pushes owner's template image (the store's localName) to the
// registry under each of tags, remembers that each is that image, and
// returns the digest of its manifest there. With a digest pushed before
// (pushed), the image is not sent again: the tags are given to it.
func (r *registry) publish(ctx context.Context, owner, localName, tmplName, pushed string, tags []string) (string, error) {
	if len(tags) == 0 {
		return pushed, nil
	}
	refs := make([]string, len(tags))
	for i, tag := range tags {
		if refs[i] = r.keyRef(owner, tmplName+":"+tag); refs[i] == "" {
			return "", fmt.Errorf("%w: %q cannot name a template", template.ErrInvalid, tmplName+":"+tag)
		}
		if _, err := name.ParseReference(refs[i]); err != nil {
			return "", fmt.Errorf("%w: the template's name %q is not one a registry takes (lowercase letters and digits, "+
				"with single '.', '_' or '-' between them): %v", template.ErrInvalid, tmplName, err)
		}
	}
	digest, untagged := pushed, refs
	if digest == "" {
		var err error
		if digest, err = template.Push(ctx, r.images, localName, refs[0], r.cfg.Options, nil); err != nil {
			return "", fmt.Errorf("%w: push: %v", ErrRegistry, err)
		}
		untagged = refs[1:]
	}
	repo, err := r.cfg.Options.Parse(refs[0])
	if err != nil {
		return "", err
	}
	if err := r.tag(ctx, repo.Context().Name()+"@"+digest, untagged); err != nil {
		return "", err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ref := range refs {
		if t := r.tags[ref]; t == nil || t.busy == nil {
			r.tags[ref] = &regTag{digest: digest, local: localName, checked: r.now()}
		}
	}
	return digest, nil
}

// tag gives the manifest of from the tags to as well.
func (r *registry) tag(ctx context.Context, from string, to []string) error {
	if len(to) == 0 {
		return nil
	}
	src, err := r.cfg.Options.Parse(from)
	if err != nil {
		return err
	}
	opts := r.cfg.Options.RemoteOptions(ctx)
	desc, err := remote.Get(src, opts...)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrRegistry, from, err)
	}
	for _, ref := range to {
		dst, err := r.cfg.Options.Parse(ref)
		if t, ok := dst.(name.Tag); err == nil && ok {
			err = remote.Tag(t, desc, opts...)
		}
		if err != nil {
			return fmt.Errorf("%w: tag %s: %v", ErrRegistry, ref, err)
		}
	}
	return nil
}

// forget removes owner's deleted template, each of its tags' manifests,
// from the registry, as far as it lets: a registry that refuses
// deletions keeps them (logged), and its nodes go on finding them.
func (r *registry) forget(ctx context.Context, owner, tmplName string, tags []string) {
	for _, tag := range tags {
		ref := r.keyRef(owner, tmplName+":"+tag)
		if ref == "" {
			continue
		}
		r.mu.Lock()
		delete(r.tags, ref)
		r.mu.Unlock()
		// A registry deletes a manifest by its digest (and with it
		// every tag of it), not a tag.
		digest, err := image.Resolve(ctx, ref, r.cfg.Options)
		var terr *transport.Error
		if errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound {
			continue // another tag's deletion took it
		}
		var src name.Reference
		if err == nil {
			src, err = r.cfg.Options.Parse(ref)
		}
		if err == nil {
			err = remote.Delete(src.Context().Digest(digest), r.cfg.Options.RemoteOptions(ctx)...)
		}
		if err != nil {
			r.log.Warn("a deleted template stays in the registry", "ref", ref, "err", err)
		}
	}
}

package template

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/vivarium-sandbox/vivarium/internal/image"
)

// A build makes an image of the store from a Spec: its base's layers,
// then a layer for each step that changes files (RUN, COPY, ADD, and a
// WORKDIR whose directory the image lacks), then a configuration; the
// image is named only once all of it is in the store. It holds the
// store (image.Store.Hold) throughout, so that a removal meanwhile
// cannot collect a layer the build is about to name, cached or new.

// Labels of a template's configuration that the server reads.
const (
	LabelStartCmd = "dev.vivarium.start-cmd"
	LabelReadyCmd = "dev.vivarium.ready-cmd"
)

// Sandboxes runs a build's RUN steps; the native backend implements it.
type Sandboxes interface {
	Run(ctx context.Context, r RunRequest) error
}

// RunRequest is one RUN step.
type RunRequest struct {
	Layers []string // the root: diff IDs of the store's layers, the lowest first
	Args   []string // argv, e.g. {"/bin/sh", "-c", "apt-get install -y x"}
	Env    []string // KEY=VALUE: the image's ENV so far, then the step's build arguments
	Dir    string   // the working directory (WORKDIR so far; "/" if none)
	UID    int      // who runs it (USER so far, resolved through the image)
	GID    int
	Groups []int     // and its supplementary groups
	Log    io.Writer // the command's stdout and stderr, as they come
	// Commit is called, when the command exited 0 and before the sandbox
	// goes, with the directory of the sandbox's writable layer
	// (overlayfs's upper directory: a deleted file is a character device
	// 0:0, an opaque directory has the xattr trusted.overlay.opaque=y)
	// and the host uid and gid that are id 0 in the sandbox (its ids are
	// 0..65535 from there). Commit turns it into a layer.
	Commit func(upper string, uid0, gid0 uint32) error
}

// Files gives the files a COPY or ADD takes.
type Files interface {
	// Archive writes a tar of src (a path of the build's files, as the
	// step names it; may be a directory or a glob, as the Context's
	// Archive handles) to w and returns the digest of what it wrote.
	// *Context is one (a Dockerfile's build directory); E2B's uploaded
	// archives will be another.
	Archive(src string, w io.Writer) (string, error)
}

// Builder builds templates into an image store.
type Builder struct {
	Store     *image.Store
	Sandboxes Sandboxes
	CacheDir  string // where the build cache keeps what a step's key made
	// MaxBytes bounds what the layers a build adds to its base hold,
	// cached or made (0: the store's bound of an image): a build past it
	// fails at the step that passed it.
	MaxBytes int64
}

// state is the image as the steps so far make it.
type state struct {
	Layer   string   `json:"layer,omitempty"` // the step's own layer, if it made one
	Env     []string `json:"env"`
	Workdir string   `json:"workdir"`
	User    string   `json:"user"`
	layers  []string // all of them, the lowest first
}

// Build builds spec into the image named name (e.g. "mytpl:latest",
// normalised as image.ParseName does), writing its progress and the RUN
// steps' output to log (one line per step as it starts: "step 3/7: RUN
// ...", "cached" when it was). A build that fails names nothing.
func (b *Builder) Build(ctx context.Context, name string, spec Spec, files Files, log io.Writer) (image.Image, error) {
	im, _, err := b.BuildSized(ctx, name, spec, files, log)
	return im, err
}

// BuildSized is Build, and says what the layers the build added to its
// base hold (its cached layers too).
func (b *Builder) BuildSized(ctx context.Context, name string, spec Spec, files Files, log io.Writer) (_ image.Image, added int64, _ error) {
	if err := spec.Validate(); err != nil {
		return image.Image{}, 0, err
	}
	ref, err := image.ParseName(name)
	if err != nil {
		return image.Image{}, 0, err
	}
	if strings.Contains(ref, "@") {
		return image.Image{}, 0, fmt.Errorf("%w: %s: a template is named by a tag, not a digest", ErrInvalid, name)
	}
	if log == nil {
		log = io.Discard
	}
	if err := os.MkdirAll(b.CacheDir, 0o700); err != nil {
		return image.Image{}, 0, err
	}
	release, err := b.Store.Hold()
	if err != nil {
		return image.Image{}, 0, err
	}
	defer release()
	base, err := b.base(spec)
	if err != nil {
		return image.Image{}, 0, &StepError{Step: 0, Err: err}
	}
	cfg, err := b.Store.ConfigFile(base)
	if err != nil {
		return image.Image{}, 0, err
	}
	steps, err := hashFiles(spec.Steps, files)
	if err != nil {
		return image.Image{}, 0, err
	}
	keyed := spec
	keyed.Steps = steps
	keys := keyed.Keys(base.Digest)

	st := state{Env: slices.Clone(cfg.Config.Env), Workdir: cfg.Config.WorkingDir, User: cfg.Config.User,
		layers: slices.Clone(base.Layers)}
	history := slices.Clone(cfg.History)
	rerun := false // a step run again: those after it run too
	for i, step := range steps {
		if err := ctx.Err(); err != nil {
			return image.Image{}, 0, err
		}
		what := describe(step)
		fmt.Fprintf(log, "step %d/%d: %s\n", i+1, len(steps), what)
		next, hit := b.cached(keys[i])
		if hit && !rerun && !step.Force {
			fmt.Fprintln(log, "cached")
		} else {
			rerun = true
			// A digest the build computed is checked again as the files are
			// read for the layer; one the caller gave is its own (E2B's).
			next, err = b.run(ctx, st, step, files, spec.Steps[i].FilesHash == "", log)
			if err != nil {
				return image.Image{}, 0, &StepError{Step: i + 1,
					Err: fmt.Errorf("%w: step %d/%d (%.200s): %w", ErrStepFailed, i+1, len(steps), what, err)}
			}
			if err := b.remember(keys[i], next); err != nil {
				return image.Image{}, 0, err
			}
		}
		next.layers = st.layers
		if next.Layer != "" {
			next.layers = append(slices.Clone(st.layers), next.Layer)
			if err := b.checkGrowth(next.layers, &added, next.Layer); err != nil {
				return image.Image{}, 0, &StepError{Step: i + 1,
					Err: fmt.Errorf("%w: step %d/%d (%.200s): %w", ErrStepFailed, i+1, len(steps), what, err)}
			}
		}
		st = next
		history = append(history, v1.History{Created: v1.Time{Time: time.Now().UTC()}, CreatedBy: what,
			Comment: "vivarium template build", EmptyLayer: st.Layer == ""})
	}
	out := finalConfig(cfg, spec, st)
	out.History = history
	im, err := b.Store.Commit(ref, out, st.layers)
	return im, added, err
}

// checkGrowth fails when the image so far, layers, has more layers than
// the store takes, or the layers added to the base hold more than
// MaxBytes with layer's; added counts them.
func (b *Builder) checkGrowth(layers []string, added *int64, layer string) error {
	if err := b.Store.CheckLayers(len(layers)); err != nil {
		return err
	}
	n, err := b.Store.LayerBytes(layer)
	if err != nil {
		return err
	}
	if *added += n; b.MaxBytes > 0 && *added > b.MaxBytes {
		return fmt.Errorf("%w: the layers it adds hold more than %s, the most this build may add",
			image.ErrTooLarge, image.FormatBytes(b.MaxBytes))
	}
	return nil
}

// base is the image the build starts from.
func (b *Builder) base(spec Spec) (image.Image, error) {
	if spec.FromTemplate != "" {
		im, err := b.Store.Get(spec.FromTemplate)
		if errors.Is(err, image.ErrNotFound) {
			return im, fmt.Errorf("%w: no template %s: build it first", ErrNoBase, spec.FromTemplate)
		}
		return im, err
	}
	im, err := b.Store.Get(spec.FromImage)
	if errors.Is(err, image.ErrNotFound) {
		return im, fmt.Errorf("%w: %s: pull it first (vivarium image pull %s) or import it", ErrNoBase, spec.FromImage, spec.FromImage)
	}
	return im, err
}

// hashFiles gives every COPY and ADD without one its FilesHash, the
// digest of the archive of its files, which its cache key covers.
func hashFiles(steps []Step, files Files) ([]Step, error) {
	out := slices.Clone(steps)
	for i, s := range out {
		if (s.Type == Copy || s.Type == Add) && s.FilesHash == "" {
			if files == nil {
				return nil, fmt.Errorf("%w: step %d (%s) copies files, and the build has none", ErrInvalid, i+1, s.Type)
			}
			h, err := files.Archive(s.Args[0], io.Discard)
			if err != nil {
				return nil, fmt.Errorf("step %d (%s %s): %w", i+1, s.Type, s.Args[0], err)
			}
			out[i].FilesHash = h
		}
	}
	return out, nil
}

// describe is a step as the log and the image's history say it.
func describe(s Step) string {
	words := []string{string(s.Type)}
	a := s.Args
	switch s.Type {
	case Run:
		words = append(words, a[0])
		if len(a) > 1 && a[1] != "" {
			words = append(words, "(as "+a[1]+")")
		}
	case Copy, Add:
		if len(a) > 2 && a[2] != "" {
			words = append(words, "--chown="+a[2])
		}
		if len(a) > 3 && a[3] != "" {
			words = append(words, "--chmod="+a[3])
		}
		words = append(words, a[0], a[1])
	case Env:
		for i := 0; i+1 < len(a); i += 2 {
			words = append(words, a[i]+"="+a[i+1])
		}
	default:
		words = append(words, a...)
	}
	return strings.ReplaceAll(strings.Join(words, " "), "\n", " ")
}

func (b *Builder) cachePath(key string) string {
	return filepath.Join(b.CacheDir, strings.TrimPrefix(key, "sha256:")+".json")
}

// cached is what the cache holds for key, if the layer it names is
// still in the store.
func (b *Builder) cached(key string) (state, bool) {
	var s state
	raw, err := os.ReadFile(b.cachePath(key))
	if err != nil || json.Unmarshal(raw, &s) != nil {
		return state{}, false
	}
	if s.Layer != "" && !b.Store.HasLayer(s.Layer) {
		return state{}, false
	}
	return s, true
}

// remember records what the step of key made, atomically.
func (b *Builder) remember(key string, s state) error {
	raw, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(b.CacheDir, ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(raw)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), b.cachePath(key))
}

// run makes a step: the state after it, and its layer if it made one.
func (b *Builder) run(ctx context.Context, st state, step Step, files Files, checkHash bool, log io.Writer) (state, error) {
	next := state{Env: slices.Clone(st.Env), Workdir: st.Workdir, User: st.User}
	switch step.Type {
	case Env:
		for i := 0; i+1 < len(step.Args); i += 2 {
			next.Env = setEnv(next.Env, step.Args[i], step.Args[i+1])
		}
	case User:
		next.User = step.Args[0]
	case Workdir:
		next.Workdir = absolute(st.Workdir, step.Args[0])
		layer, err := b.workdir(st, next.Workdir)
		if err != nil {
			return state{}, err
		}
		next.Layer = layer
	case Copy, Add:
		layer, err := b.copy(st, step, files, checkHash)
		if err != nil {
			return state{}, err
		}
		next.Layer = layer
	case Run:
		layer, err := b.runCommand(ctx, st, step, log)
		if err != nil {
			return state{}, err
		}
		next.Layer = layer
	default:
		return state{}, fmt.Errorf("%w: unknown step %s", ErrInvalid, step.Type)
	}
	return next, nil
}

func setEnv(env []string, key, value string) []string {
	out := slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, key+"=") })
	return append(out, key+"="+value)
}

// absolute is p, absolute, relative to the working directory wd; a
// trailing "/" is kept.
func absolute(wd, p string) string {
	if wd == "" {
		wd = "/"
	}
	out := p
	if !path.IsAbs(p) {
		out = path.Join(wd, p)
	}
	out = path.Clean(out)
	if strings.HasSuffix(p, "/") && out != "/" {
		out += "/"
	}
	return out
}

func (b *Builder) view(st state) *rootView {
	v := &rootView{}
	for _, id := range st.layers {
		v.layers = append(v.layers, b.Store.LayerDir(id))
	}
	return v
}

// workdir makes the directory dir (and its parents) where the image
// lacks it, owned by the user so far: a layer of those directories, or
// none.
func (b *Builder) workdir(st state, dir string) (string, error) {
	v := b.view(st)
	isDir, err := v.isDir(dir)
	if err != nil || isDir {
		return "", err
	}
	uid, gid, err := v.owner(st.User)
	if err != nil {
		return "", fmt.Errorf("USER %s: %w", st.User, err)
	}
	resolved, err := v.resolve(dir)
	if err != nil {
		return "", err
	}
	c := &copyStep{view: v, chown: true, uid: uid, gid: gid}
	return b.addLayer(func(w io.Writer) error {
		tw := tar.NewWriter(w)
		if err := c.parents(tw, resolved, true); err != nil {
			return err
		}
		return tw.Close()
	})
}

// copy makes the layer of a COPY or ADD; checkHash: its files must be
// those of step.FilesHash.
func (b *Builder) copy(st state, step Step, files Files, checkHash bool) (string, error) {
	if files == nil {
		return "", fmt.Errorf("%w: %s copies files, and the build has none", ErrInvalid, step.Type)
	}
	v := b.view(st)
	c := &copyStep{view: v, src: step.Args[0], dest: absolute(st.Workdir, step.Args[1]), add: step.Type == Add}
	if len(step.Args) > 2 && step.Args[2] != "" {
		uid, gid, err := v.owner(step.Args[2])
		if err != nil {
			return "", fmt.Errorf("--chown=%s: %w", step.Args[2], err)
		}
		c.uid, c.gid, c.chown = uid, gid, true
	}
	if len(step.Args) > 3 && step.Args[3] != "" {
		m, err := strconv.ParseInt(step.Args[3], 8, 32)
		if err != nil || m < 0 || m > 0o7777 {
			return "", fmt.Errorf("%w: mode %q: an octal mode is needed", ErrInvalid, step.Args[3])
		}
		c.mode, c.chmod = m, true
	}
	if d, ok := files.(dirLister); ok {
		isDir, err := d.IsDir(c.src)
		if err != nil {
			return "", err
		}
		c.srcDir = isDir
	}
	// The files are read once more: into a file of the build's own, which
	// the layer is written from.
	tmp, err := os.CreateTemp(b.CacheDir, ".files-")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h, err := files.Archive(c.src, tmp)
	if err != nil {
		return "", err
	}
	if checkHash && h != step.FilesHash {
		return "", fmt.Errorf("%w: the files of %s changed during the build", ErrInvalid, c.src)
	}
	return b.addLayer(func(w io.Writer) error { return c.write(tmp, w) })
}

// runCommand runs a RUN step in a sandbox of the image so far and makes
// a layer of what it changed (none if it changed nothing).
func (b *Builder) runCommand(ctx context.Context, st state, step Step, log io.Writer) (string, error) {
	user := st.User
	if len(step.Args) > 1 && step.Args[1] != "" {
		user = step.Args[1]
	}
	who, err := b.view(st).runAs(user)
	if err != nil {
		return "", fmt.Errorf("USER %s: %w", user, err)
	}
	env := slices.Clone(st.Env)
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "HOME=") }) {
		env = append(env, "HOME="+who.home)
	}
	dir := st.Workdir
	if dir == "" {
		dir = "/"
	}
	tail := &tailWriter{}
	var layer string
	committed := false
	req := RunRequest{
		Layers: slices.Clone(st.layers),
		Args:   []string{"/bin/sh", "-c", step.Args[0]},
		Env:    append(env, step.BuildArgs...),
		Dir:    dir,
		UID:    who.uid,
		GID:    who.gid,
		Groups: who.groups,
		Log:    io.MultiWriter(log, tail),
		Commit: func(upper string, uid0, gid0 uint32) error {
			if committed {
				return errors.New("a RUN step's changes are committed once")
			}
			committed = true
			names, err := readDirNamesAt(upper)
			if err != nil || len(names) == 0 {
				return err // nothing changed: no layer
			}
			layer, err = b.addLayer(func(w io.Writer) error {
				_, err := UpperLayer(upper, uid0, gid0, w)
				return err
			})
			return err
		},
	}
	err = b.Sandboxes.Run(ctx, req)
	var exit *ExitError
	if errors.As(err, &exit) {
		return "", fmt.Errorf("%w; its last lines:\n%s", err, tail.lines(10))
	}
	if err == nil && !committed {
		// Its changes would be lost without a word.
		return "", errors.New("the sandbox ended the step without committing its changes")
	}
	return layer, err
}

func readDirNamesAt(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// addLayer adds the layer write writes to the store; an error of write
// (a refused entry) is said before the store's own (a truncated tar).
func (b *Builder) addLayer(write func(io.Writer) error) (string, error) {
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := write(pw)
		pw.CloseWithError(err)
		errc <- err
	}()
	id, err := b.Store.AddLayer(pr)
	pr.CloseWithError(io.ErrClosedPipe) // a writer the store stopped reading stops too
	if werr := <-errc; werr != nil && !errors.Is(werr, io.ErrClosedPipe) {
		return "", werr
	}
	return id, err
}

// tailWriter keeps the last bytes written.
type tailWriter struct{ buf []byte }

const tailBytes = 8 << 10

func (t *tailWriter) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailBytes {
		t.buf = t.buf[len(t.buf)-tailBytes:]
	}
	return len(p), nil
}

// lines is the last n lines written.
func (t *tailWriter) lines(n int) string {
	ls := strings.Split(strings.TrimRight(string(t.buf), "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// finalConfig is the template's configuration: its base's, with the
// environment, working directory and user the steps left, its labels,
// and its start and ready commands.
func finalConfig(base *v1.ConfigFile, spec Spec, st state) *v1.ConfigFile {
	out := base.DeepCopy()
	out.Created = v1.Time{Time: time.Now().UTC()}
	if out.OS == "" {
		out.OS, out.Architecture = "linux", runtime.GOARCH
	}
	out.Config.Env, out.Config.WorkingDir, out.Config.User = st.Env, st.Workdir, st.User
	labels := maps.Clone(out.Config.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, spec.Labels)
	if spec.StartCmd != "" {
		out.Config.Cmd, out.Config.Entrypoint = []string{"/bin/sh", "-c", spec.StartCmd}, nil
		labels[LabelStartCmd] = spec.StartCmd
	}
	if spec.ReadyCmd != "" {
		labels[LabelReadyCmd] = spec.ReadyCmd
	}
	out.Config.Labels = labels
	return out
}

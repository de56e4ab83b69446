package service

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vivarium-sandbox/vivarium/internal/image"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
	"github.com/vivarium-sandbox/vivarium/internal/sandboxid"
	"github.com/vivarium-sandbox/vivarium/internal/template"
)

// Template builds, as E2B's build API asks for them: a key requests a
// build of a template name, uploads the files its COPY steps take
// (buildfiles.go), starts it with its steps, and polls its status and
// log. A build is a job of its key: bounded (builds at once, finished
// builds kept, templates), ended with its template's deletion and with
// its key's revocation, and it ends with the server. Templates are the
// key's, as sandboxes and snapshots are: a name, its tags and its builds
// are seen by the key that built them and by no other.
//
// The build itself is a TemplateBuilder's (internal/template's): this
// file keeps what E2B's API needs around it.

// BuildFiles are a build's files, for its COPY and ADD steps.
type BuildFiles interface {
	// Archive writes to w a tar of what a COPY of src takes, named as
	// the step names it, and returns that tar's digest.
	Archive(src string, w io.Writer) (string, error)
}

// TemplateBuilder builds a template: the image spec makes, for job, its
// steps' output written to log as they run.
type TemplateBuilder interface {
	Build(ctx context.Context, job BuildJob, spec template.Spec, files BuildFiles, log io.Writer) (Built, error)
}

// BuildJob is one build of a key's: the name its image is stored under,
// the group its steps' sandboxes are made in (sandbox.Spec.Tenant; ""
// for none), and the most its layers may add to its base (0: the
// store's bound of an image).
type BuildJob struct {
	Name, Tenant string
	MaxBytes     int64
}

// Built is a build's image, and what its layers added to its base hold.
type Built struct {
	Image image.Image
	Added int64
}

// TemplateRemover is a TemplateBuilder that also removes what it built
// (by the name it was given): a template deleted, or its key revoked,
// has its images removed.
type TemplateRemover interface {
	Remove(name string) error
}

// BuildStepError is a builder's error that says which step failed: 0 the
// base (fromImage, fromTemplate), i the spec's Steps[i-1], anything past
// them the start and ready commands. E2B's SDKs point at the line of the
// template that made the step.
type BuildStepError interface {
	error
	BuildStep() int
}

// Errors of template builds.
var (
	ErrTemplateNotFound = errors.New("template not found")
	// ErrBuildStarted: a build started twice.
	ErrBuildStarted = errors.New("the build has already started")
	// errPublish: a build's image not pushed to the template registry.
	errPublish = errors.New("the template was not pushed to the registry")
)

// BuildConfig configures template builds (Config.Builds). Zero fields
// take the defaults named.
type BuildConfig struct {
	// Builder builds templates; nil: builds are refused as not supported.
	Builder TemplateBuilder
	// FilesDir keeps the files uploaded for builds, and each key's
	// templates (buildsaved.go), which the next server on it has; "": a
	// temporary directory, removed by Close, and templates are the
	// running server's alone.
	FilesDir string
	// MaxRunning bounds one key's builds running at once (2);
	// MaxWaiting its builds requested and not yet started (8: past it,
	// the oldest is ended); MaxKept its finished builds kept, beyond
	// those a tag names (32); MaxTemplates its templates (64);
	// MaxTags one template's tags (64).
	MaxRunning, MaxWaiting, MaxKept, MaxTemplates, MaxTags int
	// MaxLogLines and MaxLogBytes bound a build's log (10,000 lines,
	// 1 MiB): past them its oldest lines are dropped. The logs of a
	// key's builds older than its MaxKept last finished are dropped
	// whole, tagged or not.
	MaxLogLines, MaxLogBytes int
	// MaxBytes bounds what the layers of one key's builds add to their
	// bases (16 GiB): those of its builds kept, and the budgets of those
	// running. A build may add the room left, at most MaxBytes /
	// MaxRunning; past it, it fails; with no room, none starts.
	MaxBytes int64
	// MaxFiles and MaxFilesBytes bound the archives one key keeps (64,
	// 1 GiB as uploaded): past them the least recently used that no
	// running build holds are dropped. MaxUpload bounds one archive as
	// uploaded (256 MiB), Archive it uncompressed (2 GiB, 100,000 files).
	MaxFiles      int
	MaxFilesBytes int64
	MaxUpload     int64
	Archive       template.ArchiveLimits
}

// DefaultBuildBytes is BuildConfig.MaxBytes's default.
const DefaultBuildBytes = 16 << 30

func (c *BuildConfig) setDefaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxRunning, 2)
	def(&c.MaxWaiting, 8)
	def(&c.MaxKept, 32)
	def(&c.MaxTemplates, 64)
	def(&c.MaxTags, 64)
	def(&c.MaxLogLines, 10_000)
	def(&c.MaxLogBytes, 1<<20)
	def(&c.MaxFiles, 64)
	def(&c.Archive.MaxEntries, 100_000)
	if c.MaxFilesBytes <= 0 {
		c.MaxFilesBytes = 1 << 30
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = DefaultBuildBytes
	}
	if c.MaxUpload <= 0 {
		c.MaxUpload = 256 << 20
	}
	if c.Archive.MaxBytes <= 0 {
		c.Archive.MaxBytes = 2 << 30
	}
}

// BuildState is where a build stands, in E2B's words.
type BuildState string

const (
	BuildWaiting  BuildState = "waiting" // requested, not started
	BuildBuilding BuildState = "building"
	BuildReady    BuildState = "ready"
	BuildError    BuildState = "error"
)

// BuildLogEntry is a line of a build's log.
type BuildLogEntry struct {
	Time    time.Time
	Level   string // "info", "error"
	Message string
}

// BuildRequest asks for a build of a template: Name is "name" or
// "name:tag"; Tags are more tags for the build ("default" when none).
type BuildRequest struct {
	Name string
	Tags []string
}

// BuildCreated is a build requested.
type BuildCreated struct {
	TemplateID, BuildID, Name string
	Tags                      []string
}

// BuildStatus is a build's state and a part of its log.
type BuildStatus struct {
	TemplateID, BuildID string
	State               BuildState
	// Log is the part asked for: the lines from an offset on, counted
	// from the build's first line (lines dropped from a long log are not
	// given again).
	Log []BuildLogEntry
	// Reason says why a build failed, and Step which step did (as
	// BuildStepError counts; -1: not known).
	Reason string
	Step   int
	// Steps is how many steps the build has.
	Steps int
}

// TemplateInfo describes a template.
type TemplateInfo struct {
	ID, Name string
	Created  time.Time
	// Tags maps each tag to the build it names.
	Tags []TemplateTag
}

// TemplateTag is a tag of a template and the build it names.
type TemplateTag struct {
	Tag, BuildID string
	Assigned     time.Time
}

// builds is the service's template builds (Service.builds).
type builds struct {
	cfg    BuildConfig
	log    *slog.Logger
	now    func() time.Time
	ctx    context.Context // ended by close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	files  buildFilesDir

	// tenantOf is the group of an owner's sandboxes (Service.tenantOf),
	// where its builds' steps run too.
	tenantOf func(owner string) string

	// node is the cluster's node the builds are made on ("": none).
	node string
	// registry, if not nil, has every ready build's image pushed to it,
	// under its tags, before the build is ready (registry.go).
	registry *registry

	mu     sync.Mutex // owners, byID
	owners map[string]*ownerBuilds
	byID   map[string]string // template ID → its owner
}

// ownerBuilds is one key's templates, builds and files. Its lock is
// taken for short critical parts, never across a client's I/O or a
// build.
type ownerBuilds struct {
	owner     string
	mu        sync.Mutex
	templates map[string]*tmpl // by ID
	names     map[string]*tmpl // by name
	builds    map[string]*build
	waiting   []*build // oldest first
	finished  []*build // oldest first
	running   int
	files     map[string]*storedFiles // by hash (buildfiles.go)
	filesSize int64
	uploading int // archives being sent
	closed    bool
}

type tmpl struct {
	id, name string
	created  time.Time
	tags     map[string]tagged
	deleted  bool
}

type tagged struct {
	build    *build
	assigned time.Time
}

type build struct {
	id      string
	tmpl    *tmpl
	tags    []string // given when ready
	state   BuildState
	reason  string
	step    int
	steps   int
	created time.Time
	image   image.Image
	// pushed is the digest of its image's manifest in the template
	// registry ("": none).
	pushed string
	// added is what a ready build's layers added to its base; budget,
	// while it runs, the most they may.
	added, budget int64
	cancel        context.CancelFunc
	log           buildLog
}

func newBuilds(cfg BuildConfig, log *slog.Logger, now func() time.Time) *builds {
	cfg.setDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	bs := &builds{cfg: cfg, log: log, now: now, ctx: ctx, cancel: cancel, files: buildFilesDir{dir: cfg.FilesDir},
		tenantOf: func(string) string { return "" }, owners: map[string]*ownerBuilds{}, byID: map[string]string{}}
	if cfg.FilesDir != "" && cfg.Builder != nil {
		bs.load() // buildsaved.go
	}
	return bs
}

// bytesFree is the budget of a build that starts now (what the key's
// builds may add, most, less what its ready builds added and its running
// ones may, and at most most/running of it), and what those hold; ob.mu
// held.
func (ob *ownerBuilds) bytesFree(most int64, running int) (budget, used int64) {
	for _, b := range ob.builds {
		switch b.state {
		case BuildReady:
			used += b.added
		case BuildBuilding:
			used += b.budget
		}
	}
	return min(most-used, most/int64(max(running, 1))), used
}

func newOwnerBuilds(owner string) *ownerBuilds {
	return &ownerBuilds{owner: owner, templates: map[string]*tmpl{}, names: map[string]*tmpl{},
		builds: map[string]*build{}, files: map[string]*storedFiles{}}
}

// errBuildsOff: no builder on this server.
var errBuildsOff = fmt.Errorf("%w: template builds are not enabled on this server", sandbox.ErrUnsupported)

// of returns owner's builds, made if new and make is set.
func (bs *builds) of(owner string, make bool) (*ownerBuilds, error) {
	if bs.cfg.Builder == nil {
		return nil, errBuildsOff
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	ob := bs.owners[owner]
	if ob == nil && make {
		ob = newOwnerBuilds(owner)
		bs.owners[owner] = ob
	}
	if ob == nil {
		return nil, fmt.Errorf("%w: this key has no templates", ErrTemplateNotFound)
	}
	return ob, nil
}

// Template names and tags as E2B takes them: a name of letters, digits,
// ".", "_" and "-" (case does not matter), a tag likewise.
var (
	templateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)
	templateTagRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
)

// defaultTag is the tag of a build asked for without one, and what a
// name without a tag means (E2B's).
const defaultTag = "default"

// parseTemplateRef splits "name[:tag]" (the name lowered), checking both.
func parseTemplateRef(ref string) (name, tag string, err error) {
	name, tag, hasTag := strings.Cut(ref, ":")
	name = strings.ToLower(name)
	if !templateNameRE.MatchString(name) {
		return "", "", fmt.Errorf("%w: template name %q: a name is letters, digits, '.', '_' and '-' (at most 128)",
			template.ErrInvalid, ref)
	}
	if hasTag {
		if err := checkTag(tag); err != nil {
			return "", "", err
		}
	}
	return name, tag, nil
}

func checkTag(tag string) error {
	if !templateTagRE.MatchString(tag) {
		return fmt.Errorf("%w: tag %q: a tag is letters, digits, '.', '_' and '-' (at most 128), without the template's name",
			template.ErrInvalid, tag)
	}
	return nil
}

// RequestBuild makes a build of a template, waiting for StartBuild; the
// template is made too if the key has none of that name.
func (s *Service) RequestBuild(owner string, req BuildRequest) (BuildCreated, error) {
	name, tag, err := parseTemplateRef(req.Name)
	if err != nil {
		return BuildCreated{}, err
	}
	tags := []string{}
	if tag != "" {
		tags = append(tags, tag)
	}
	for _, t := range req.Tags {
		if err := checkTag(t); err != nil {
			return BuildCreated{}, err
		}
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if len(tags) == 0 {
		tags = append(tags, defaultTag)
	}
	bs := s.builds
	ob, err := bs.of(owner, true)
	if err != nil {
		return BuildCreated{}, err
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.closed {
		return BuildCreated{}, fmt.Errorf("%w: the key was revoked", ErrTemplateNotFound)
	}
	if len(tags) > bs.cfg.MaxTags {
		return BuildCreated{}, fmt.Errorf("%w: at most %d tags", template.ErrInvalid, bs.cfg.MaxTags)
	}
	t := ob.names[name]
	if t == nil {
		if len(ob.templates) >= bs.cfg.MaxTemplates {
			return BuildCreated{}, fmt.Errorf("%w: this key has %d templates, the most it may have: delete one first",
				ErrQuota, len(ob.templates))
		}
		t = &tmpl{id: templateID(bs.node), name: name, created: bs.now(), tags: map[string]tagged{}}
		bs.mu.Lock()
		bs.byID[t.id] = owner
		bs.mu.Unlock()
		ob.templates[t.id], ob.names[name] = t, t
		bs.save(ob)
	}
	if len(ob.waiting) >= bs.cfg.MaxWaiting {
		old := ob.waiting[0]
		bs.finish(ob, old, BuildError, "the build was never started, and newer builds were requested", -1)
	}
	b := &build{id: buildID(), tmpl: t, tags: tags, state: BuildWaiting, step: -1, created: bs.now()}
	ob.builds[b.id] = b
	ob.waiting = append(ob.waiting, b)
	return BuildCreated{TemplateID: t.id, BuildID: b.id, Name: name, Tags: tags}, nil
}

// StartBuild starts a build requested by RequestBuild with spec; force
// runs every step again, whatever the cache holds. Each COPY's files
// must have been uploaded (PutBuildFiles).
func (s *Service) StartBuild(owner, templateID, buildID string, spec template.Spec, force bool) error {
	bs := s.builds
	ob, err := bs.of(owner, false)
	if err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	b := ob.builds[buildID]
	if b == nil || b.tmpl.id != templateID || b.tmpl.deleted {
		return fmt.Errorf("%w: no build %s of template %s", ErrTemplateNotFound, buildID, templateID)
	}
	if b.state != BuildWaiting {
		return fmt.Errorf("%w: build %s is %s", ErrBuildStarted, buildID, b.state)
	}
	if ob.running >= bs.cfg.MaxRunning {
		return fmt.Errorf("%w: this key runs %d builds, the most it may at once: wait for one to finish", ErrQuota, ob.running)
	}
	budget, used := ob.bytesFree(bs.cfg.MaxBytes, bs.cfg.MaxRunning)
	if budget <= 0 {
		return fmt.Errorf("%w: this key's templates, and the builds it runs, hold %s of the %s its builds may add: "+
			"delete templates it no longer needs, or wait for its builds to finish", ErrQuota,
			image.FormatBytes(used), image.FormatBytes(bs.cfg.MaxBytes))
	}
	files := &uploadedFiles{bs: bs, ob: ob, byPath: map[string]string{}}
	for i := range spec.Steps {
		st := &spec.Steps[i]
		st.Force = st.Force || force
		if st.Type != template.Copy && st.Type != template.Add {
			continue
		}
		f := ob.files[st.FilesHash]
		if st.FilesHash == "" || f == nil {
			return fmt.Errorf("%w: step %d (%s %s): its files were not uploaded", template.ErrInvalid, i+1, st.Type, st.Args[0])
		}
		files.byPath[st.Args[0]] = st.FilesHash
	}
	b.steps = len(spec.Steps)
	// A base that is a template is one of the key's, by its name: the
	// builder is given the image of the build that names. One that is
	// not fails the build at its base, as E2B's does, so that the SDK
	// points at the line that named it.
	if spec.FromTemplate != "" {
		ref, ok := ob.resolve(spec.FromTemplate)
		if !ok {
			bs.finish(ob, b, BuildError, fmt.Sprintf("template %q not found: a template is built from another of "+
				"this key's, by its name", spec.FromTemplate), 0)
			return nil
		}
		spec.FromTemplate = ref
	}
	files.pin()
	b.state = BuildBuilding
	b.budget = budget
	ob.running++
	ctx, cancel := context.WithCancel(bs.ctx)
	b.cancel = cancel
	bs.wg.Add(1)
	go bs.run(ctx, ob, b, spec, files)
	return nil
}

// resolve is the image name of the ready build that ref ("name[:tag]",
// a template's ID) names; a name of E2B's own templates ("base") is left
// for the builder to map. Called holding ob.mu.
func (ob *ownerBuilds) resolve(ref string) (string, bool) {
	if b := ob.lookup(ref); b != nil {
		return templateImageName(ob.owner, b), true
	}
	name, _, _ := strings.Cut(ref, ":")
	return ref, isOwnTemplate(name)
}

// isOwnTemplate: names of E2B's own templates, which the builder maps.
func isOwnTemplate(name string) bool {
	return slices.Contains([]string{"base", "code-interpreter", "code-interpreter-v1"}, name)
}

// lookup is the build ref names: "name", "name:tag", "ID", "ID:tag", or
// a build ID as the tag. Called holding ob.mu.
func (ob *ownerBuilds) lookup(ref string) *build {
	name, tag, _ := strings.Cut(ref, ":")
	t := ob.templates[name]
	if t == nil {
		t = ob.names[strings.ToLower(name)]
	}
	if t == nil {
		return nil
	}
	if tag == "" {
		tag = defaultTag
	}
	if x, ok := t.tags[tag]; ok {
		return x.build
	}
	if b := ob.builds[tag]; b != nil && b.tmpl == t && b.state == BuildReady {
		return b
	}
	return nil
}

// templateImageName is the name a build's image is stored under: the
// key's (by a digest of the owner), the template's ID, the build's.
func templateImageName(owner string, b *build) string {
	sum := sha256.Sum256([]byte(owner))
	return fmt.Sprintf("%sk%s/%s:%s", templateImagePrefix, hex.EncodeToString(sum[:8]), b.tmpl.id, b.id)
}

// templateImagePrefix starts the names of the images of keys' builds.
const templateImagePrefix = "templates.vivarium/"

// run runs a build to its end.
func (bs *builds) run(ctx context.Context, ob *ownerBuilds, b *build, spec template.Spec, files *uploadedFiles) {
	defer bs.wg.Done()
	name := templateImageName(ob.owner, b)
	w := &buildLogWriter{bs: bs, ob: ob, b: b}
	out, err := bs.cfg.Builder.Build(ctx, BuildJob{Name: name, Tenant: bs.tenantOf(ob.owner), MaxBytes: b.budget},
		spec, files, w)
	if err == nil && bs.registry != nil {
		// Ready only once every node can find it.
		fmt.Fprintf(w, "pushing the template to the cluster's registry\n")
		pctx, cancel := context.WithTimeout(ctx, registryPull) // a registry that stalls ends the build, not holds it
		b.pushed, err = bs.registry.publish(pctx, ob.owner, name, b.tmpl.name, "", b.tags)
		cancel()
		if err != nil {
			err = errors.Join(err, errPublish)
		}
	}
	w.flush()
	files.release()
	built := out.Image.Name != ""
	ob.mu.Lock()
	b.budget = 0
	if built && (ob.closed || b.tmpl.deleted) {
		err = context.Canceled // the build's template, or key, went while it ran
	}
	switch {
	case err == nil:
		b.image, b.added = out.Image, out.Added
		bs.finish(ob, b, BuildReady, "", -1)
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		bs.finish(ob, b, BuildError, "the build was cancelled: its template was deleted, its key revoked, or the server stopped", -1)
	default:
		step := -1
		var se BuildStepError
		if errors.As(err, &se) {
			step = se.BuildStep()
		}
		bs.finish(ob, b, BuildError, bs.reason(err, step, spec), step)
	}
	ob.mu.Unlock()
	if built && err != nil {
		bs.remove(name)
	}
}

// reason is what a failed build's client is told: the builder's own
// words where they are written for clients (a refused spec or image, a
// bound), else which step failed, whose output the log has. The rest is
// logged: it may name the server's paths.
func (bs *builds) reason(err error, step int, spec template.Spec) string {
	if errors.Is(err, errPublish) && !errors.Is(err, template.ErrInvalid) {
		bs.log.Warn("template build not pushed to the template registry", "err", err)
		return "the template could not be pushed to the cluster's template registry (the server's log says why)"
	}
	if errors.Is(err, template.ErrInvalid) || errors.Is(err, template.ErrTooLarge) || errors.Is(err, image.ErrRefused) ||
		errors.Is(err, image.ErrTooLarge) || errors.Is(err, image.ErrNotFound) || errors.Is(err, image.ErrBadName) {
		return err.Error()
	}
	bs.log.Warn("template build failed", "err", err)
	switch {
	case step == 0:
		return "the build's base could not be made (see the build's log)"
	case step > 0 && step <= len(spec.Steps):
		st := spec.Steps[step-1]
		// A RUN's, in the words E2B's SDKs show for it.
		var ue *template.UserError
		var ee *template.ExitError
		switch {
		case st.Type == template.Run && errors.As(err, &ue):
			return fmt.Sprintf("failed to run command '%s': command failed: unauthenticated: invalid username: '%s'", st.Args[0], ue.User)
		case st.Type == template.Run && errors.As(err, &ee):
			return fmt.Sprintf("failed to run command '%s': exit status %d (see the build's log)", st.Args[0], ee.Status)
		}
		return fmt.Sprintf("step %d (%s) failed (see the build's log)", step, st.Type)
	case step > len(spec.Steps):
		return "the start or ready command failed (see the build's log)"
	}
	return "the build failed (see the build's log)"
}

// finish ends a build with state: a ready build takes its tags. Called
// holding ob.mu.
func (bs *builds) finish(ob *ownerBuilds, b *build, state BuildState, reason string, step int) {
	if b.state == BuildBuilding {
		ob.running--
	}
	ob.waiting = slices.DeleteFunc(ob.waiting, func(x *build) bool { return x == b })
	b.state, b.reason, b.step = state, reason, step
	if b.cancel != nil {
		b.cancel()
	}
	if reason != "" {
		b.log.add(BuildLogEntry{Time: bs.now(), Level: "error", Message: reason}, bs.cfg)
	}
	if state == BuildReady && !b.tmpl.deleted {
		for _, tag := range b.tags {
			b.tmpl.tags[tag] = tagged{build: b, assigned: bs.now()}
		}
	}
	if !b.tmpl.deleted {
		ob.finished = append(ob.finished, b)
		bs.trim(ob)
	}
	if state == BuildReady {
		bs.save(ob)
	}
}

// trim forgets the oldest finished builds past MaxKept that no tag
// names, and removes their images; the logs of those a tag keeps are
// dropped. Called holding ob.mu.
func (bs *builds) trim(ob *ownerBuilds) {
	defer func() {
		for _, b := range ob.finished[:max(0, len(ob.finished)-bs.cfg.MaxKept)] {
			b.log.forget()
		}
	}()
	untagged := func(b *build) bool {
		for _, x := range b.tmpl.tags {
			if x.build == b {
				return false
			}
		}
		return true
	}
	n := 0
	for _, b := range ob.finished {
		if untagged(b) {
			n++
		}
	}
	for i := 0; n > bs.cfg.MaxKept && i < len(ob.finished); {
		b := ob.finished[i]
		if !untagged(b) {
			i++
			continue
		}
		ob.finished = slices.Delete(ob.finished, i, i+1)
		delete(ob.builds, b.id)
		if b.image.Name != "" {
			name := templateImageName(ob.owner, b)
			bs.wg.Add(1)
			go func() { // not under ob.mu: a store's removal takes its time
				defer bs.wg.Done()
				bs.remove(name)
			}()
		}
		n--
	}
}

// remove removes a build's image, if the builder can.
func (bs *builds) remove(name string) {
	if r, ok := bs.cfg.Builder.(TemplateRemover); ok {
		if err := r.Remove(name); err != nil {
			bs.log.Warn("removing a template's image", "image", name, "err", err)
		}
	}
}

// BuildStatus is a build's state and its log from offset on, at most
// limit lines.
func (s *Service) BuildStatus(owner, templateID, buildID string, offset, limit int) (BuildStatus, error) {
	ob, err := s.builds.of(owner, false)
	if err != nil {
		return BuildStatus{}, err
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	b := ob.builds[buildID]
	if b == nil || b.tmpl.id != templateID {
		return BuildStatus{}, fmt.Errorf("%w: no build %s of template %s", ErrTemplateNotFound, buildID, templateID)
	}
	return BuildStatus{TemplateID: templateID, BuildID: buildID, State: b.state, Log: b.log.from(offset, limit),
		Reason: b.reason, Step: b.step, Steps: b.steps}, nil
}

// TemplateByName describes the template ref names ("name", or its ID).
func (s *Service) TemplateByName(owner, ref string) (TemplateInfo, error) {
	ob, err := s.builds.of(owner, false)
	if err != nil {
		return TemplateInfo{}, err
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	t := ob.template(ref)
	if t == nil {
		return TemplateInfo{}, fmt.Errorf("%w: %q", ErrTemplateNotFound, ref)
	}
	return t.info(), nil
}

// template is the template ref names, by name or ID (a tag is
// ignored). Called holding ob.mu.
func (ob *ownerBuilds) template(ref string) *tmpl {
	name, _, _ := strings.Cut(ref, ":")
	if t := ob.templates[name]; t != nil {
		return t
	}
	return ob.names[strings.ToLower(name)]
}

func (t *tmpl) info() TemplateInfo {
	tags := make([]TemplateTag, 0, len(t.tags))
	for tag, x := range t.tags {
		tags = append(tags, TemplateTag{Tag: tag, BuildID: x.build.id, Assigned: x.assigned})
	}
	slices.SortFunc(tags, func(a, b TemplateTag) int { return strings.Compare(a.Tag, b.Tag) })
	return TemplateInfo{ID: t.id, Name: t.name, Created: t.created, Tags: tags}
}

// TemplateImage is the image of the ready build ref names: "name",
// "name:tag" (a template's ID for its name, a build's ID for its tag).
func (s *Service) TemplateImage(owner, ref string) (image.Image, error) {
	ob, err := s.builds.of(owner, false)
	if err != nil {
		return image.Image{}, err
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	b := ob.lookup(ref)
	if b == nil {
		return image.Image{}, fmt.Errorf("%w: %q (or it has no ready build of that tag)", ErrTemplateNotFound, ref)
	}
	return b.image, nil
}

// DeleteTemplate deletes the template ref names (by name or ID): its
// running builds are cancelled and its images removed.
func (s *Service) DeleteTemplate(owner, ref string) error {
	bs := s.builds
	ob, err := bs.of(owner, false)
	if err != nil {
		return err
	}
	ob.mu.Lock()
	t := ob.template(ref)
	if t == nil {
		ob.mu.Unlock()
		return fmt.Errorf("%w: %q", ErrTemplateNotFound, ref)
	}
	t.deleted = true
	delete(ob.templates, t.id)
	delete(ob.names, t.name)
	if reg := bs.registry; reg != nil {
		tags := slices.Collect(maps.Keys(t.tags))
		go func() { // bounded: registryLookup a look-up
			ctx, cancel := context.WithTimeout(context.Background(), registryLookup)
			defer cancel()
			reg.forget(ctx, owner, t.name, tags)
		}()
	}
	var gone []string
	for _, b := range ob.builds {
		if b.tmpl != t {
			continue
		}
		if b.state == BuildWaiting {
			bs.finish(ob, b, BuildError, "the template was deleted", -1)
		}
		if b.cancel != nil {
			b.cancel() // a running build removes its own image as it ends
		}
		if b.image.Name != "" {
			gone = append(gone, templateImageName(owner, b))
		}
		delete(ob.builds, b.id)
	}
	ob.finished = slices.DeleteFunc(ob.finished, func(b *build) bool { return b.tmpl == t })
	bs.save(ob)
	ob.mu.Unlock()
	bs.mu.Lock()
	delete(bs.byID, t.id)
	bs.mu.Unlock()
	for _, name := range gone {
		bs.remove(name)
	}
	return nil
}

// AssignTags gives tags to the build target names ("name:tag", or
// "name" for its default tag) and returns that build's ID.
func (s *Service) AssignTags(owner, target string, tags []string) (string, error) {
	if _, _, err := parseTemplateRef(target); err != nil {
		return "", err
	}
	for _, t := range tags {
		if err := checkTag(t); err != nil {
			return "", err
		}
	}
	ob, err := s.builds.of(owner, false)
	if err != nil {
		return "", err
	}
	ob.mu.Lock()
	b := ob.lookup(target)
	if b == nil {
		ob.mu.Unlock()
		return "", fmt.Errorf("%w: %q (or it has no ready build of that tag)", ErrTemplateNotFound, target)
	}
	if len(b.tmpl.tags)+len(tags) > s.builds.cfg.MaxTags {
		ob.mu.Unlock()
		return "", fmt.Errorf("%w: a template has at most %d tags", template.ErrInvalid, s.builds.cfg.MaxTags)
	}
	for _, t := range tags {
		b.tmpl.tags[t] = tagged{build: b, assigned: s.builds.now()}
	}
	s.builds.save(ob)
	tmplName, pushed, local := b.tmpl.name, b.pushed, templateImageName(owner, b)
	ob.mu.Unlock()
	if reg := s.builds.registry; reg != nil && pushed != "" {
		// The registry's tags follow, outside the key's lock (a
		// registry's answers are slow on purpose, at worst).
		ctx, cancel := context.WithTimeout(context.Background(), registryLookup)
		defer cancel()
		if _, err := reg.publish(ctx, owner, local, tmplName, pushed, tags); err != nil {
			return "", err
		}
	}
	return b.id, nil
}

// RemoveTags removes tags of the template name names (by name or ID);
// a tag it does not have is ignored.
func (s *Service) RemoveTags(owner, name string, tags []string) error {
	ob, err := s.builds.of(owner, false)
	if err != nil {
		return err
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	t := ob.template(name)
	if t == nil {
		return fmt.Errorf("%w: %q", ErrTemplateNotFound, name)
	}
	for _, tag := range tags {
		delete(t.tags, tag)
	}
	s.builds.trim(ob)
	s.builds.save(ob)
	return nil
}

// closeOwner ends owner's builds and forgets its templates and files
// (its key revoked); the images of its templates are removed.
func (bs *builds) closeOwner(owner string) {
	bs.mu.Lock()
	ob := bs.owners[owner]
	delete(bs.owners, owner)
	for id, o := range bs.byID {
		if o == owner {
			delete(bs.byID, id)
		}
	}
	bs.mu.Unlock()
	if ob == nil {
		return
	}
	ob.mu.Lock()
	ob.closed = true
	var gone []string
	for _, b := range ob.builds {
		if b.cancel != nil {
			b.cancel()
		}
		if b.image.Name != "" {
			gone = append(gone, templateImageName(owner, b))
		}
	}
	ob.mu.Unlock()
	bs.files.removeOwner(owner)
	// Not on the caller's time: the service's reaper calls this.
	bs.wg.Add(1)
	go func() {
		defer bs.wg.Done()
		for _, name := range gone {
			bs.remove(name)
		}
	}()
}

// ownersNow lists the owners with templates or builds.
func (bs *builds) ownersNow() []string {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	out := make([]string, 0, len(bs.owners))
	for o := range bs.owners {
		out = append(out, o)
	}
	return out
}

// close cancels every build and waits for them to end.
func (bs *builds) close() {
	bs.cancel()
	bs.wg.Wait()
	bs.files.close()
}

// TemplateOwner is the owner of the template with that ID, for a URL
// that names a template and not its key (a signed upload URL).
func (s *Service) TemplateOwner(templateID string) (string, bool) {
	s.builds.mu.Lock()
	defer s.builds.mu.Unlock()
	o, ok := s.builds.byID[templateID]
	return o, ok
}

// templateID is a new template's ID: 20 lowercase letters and digits, as
// E2B's are; a cluster's node's names the node (tpl_NODE_HEX), so that a
// gateway sends the template's build, its uploads and its status there.
func templateID(node string) string {
	if node != "" {
		return sandboxid.Template.New(node)
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// buildID is a new build's ID, a random UUID as E2B's are.
func buildID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// buildLog is a build's log, bounded: past its bounds the oldest lines
// are dropped, and offsets go on counting from the first line.
type buildLog struct {
	lines   []BuildLogEntry
	dropped int
	bytes   int
}

func (l *buildLog) add(e BuildLogEntry, cfg BuildConfig) {
	if len(e.Message) > maxLogLine {
		e.Message = e.Message[:maxLogLine] + "..."
	}
	l.lines = append(l.lines, e)
	l.bytes += len(e.Message)
	for len(l.lines) > cfg.MaxLogLines || l.bytes > cfg.MaxLogBytes {
		l.bytes -= len(l.lines[0].Message)
		l.lines = l.lines[1:]
		l.dropped++
	}
}

// forget drops every line, offsets counting on.
func (l *buildLog) forget() {
	l.dropped += len(l.lines)
	l.lines, l.bytes = nil, 0
}

// from is the log from line offset on (the first kept if those were
// dropped), at most limit lines.
func (l *buildLog) from(offset, limit int) []BuildLogEntry {
	i := max(offset-l.dropped, 0)
	if i >= len(l.lines) {
		return nil
	}
	return slices.Clone(l.lines[i:min(len(l.lines), i+limit)])
}

// maxLogLine bounds a line of a build's log.
const maxLogLine = 8 << 10

// buildLogWriter is the log a builder writes: each line an entry.
type buildLogWriter struct {
	bs      *builds
	ob      *ownerBuilds
	b       *build
	mu      sync.Mutex
	partial []byte
}

func (w *buildLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := slices.Index(p, '\n')
		if i < 0 {
			w.partial = append(w.partial, p...)
			if len(w.partial) > maxLogLine {
				w.line()
			}
			break
		}
		w.partial = append(w.partial, p[:i]...)
		w.line()
		p = p[i+1:]
	}
	return n, nil
}

// line adds the partial line to the build's log. Called holding w.mu.
func (w *buildLogWriter) line() {
	msg := strings.TrimSuffix(string(w.partial), "\r")
	w.partial = w.partial[:0]
	w.ob.mu.Lock()
	w.b.log.add(BuildLogEntry{Time: w.bs.now(), Level: "info", Message: msg}, w.bs.cfg)
	w.ob.mu.Unlock()
}

func (w *buildLogWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.line()
	}
}

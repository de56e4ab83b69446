package native

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vivarium-sandbox/vivarium/internal/fileutil"
	"github.com/vivarium-sandbox/vivarium/internal/hostuid"
	"github.com/vivarium-sandbox/vivarium/internal/layers"
	"github.com/vivarium-sandbox/vivarium/internal/rootview"
	"github.com/vivarium-sandbox/vivarium/internal/sandbox"
)

// A template's sandbox (sandbox.Spec.Root) has the template's file system
// as its root, in place of the host's /usr. The layers are the image
// store's, owned on the host by the ids the image gives (root is host
// root); each sandbox sees them through its own user namespace. In order:
//
//  1. the supervisor makes the sandbox's writable layer, a tmpfs of the
//     sandbox's disk limit made as a detached mount (in no namespace: the
//     host never sees it), with its upper and work directories owned by
//     the sandbox's root;
//  2. it stacks the layers, each idmapped through the sandbox's user
//     namespace, under that writable layer into an overlay
//     (layers.MountLayers): a file of the image's root is the sandbox's
//     root's, and no other sandbox's, nor the host root's; what the
//     sandbox writes anywhere is copied up into its own tmpfs;
//  3. it sends the overlay, a detached mount, to init on the control
//     socket (opRoot), before the volumes and the config;
//  4. init attaches it where a classic sandbox mounts its root tmpfs and
//     builds the rest as buildRoot does for every sandbox: the runner on
//     a tmpfs of its own, /dev, the disk's directories, the volumes,
//     /proc. The image is hostile: every directory init makes or mounts
//     on is made a real directory first (rootDirs), so that no link of
//     the image leads a mount or a write out of the root before the
//     pivot; the files of /etc it writes replace whatever the image had
//     there.
//
// The template's Python (python3 on its PATH) runs the runner.
const opRoot = "root"

// RootsSupported implements sandbox.RootBackend: the kernel's support is
// checked when a template's sandbox starts (idmapped layers under
// overlayfs, Linux 5.19), which fails naming the step; `vivarium doctor`
// probes it beforehand.
func (b *Backend) RootsSupported() error { return nil }

// createFromTemplate starts a template's sandbox: forked from the
// template's zygote (its python3 with the preloads imported, started by
// the template's first sandbox) once it is ready, or else an init of its
// own (roleClassic) that runs the template's python3 or the runner
// without Python.
func (b *Backend) createFromTemplate(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if spec.Python != "" {
		return nil, fmt.Errorf("%w: a template's sandbox runs the template's python3; python cannot be chosen", sandbox.ErrInvalidSpec)
	}
	spec.Limits = spec.Limits.WithDefaults()
	if spec.Egress != nil {
		spec.Env = sandbox.WithEgressEnv(spec.Env)
	}
	cfg, err := b.initConfig(spec, nil, nil)
	if err != nil {
		return nil, err
	}
	cfg.Image, cfg.Workdir, cfg.Python, cfg.User = true, spec.Root.Dir, "", spec.Root.User
	cfg.HashSeed, cfg.Preload = "", nil
	z, warm := b.templateZygote(spec.Root, spec.Tenant)
	if z != nil {
		// As a default sandbox of a zygote (Create): one tree, its
		// runner from the zygote until a restore.
		cfg.Role, cfg.RunnerArgs = roleForked, nil
		return start(ctx, b, spec, cfg, z)
	}
	cfg.RunnerFiles = b.runnerFiles("")
	sb, err := start(ctx, b, spec, cfg, nil)
	if warm {
		// Once this sandbox is made: its start does not share the CPU
		// with the zygote's.
		go b.warmTemplate(zygoteKind{root: spec.Root, tenant: spec.Tenant})
	}
	return sb, err
}

// templateZygote returns the zygote of a template for a tenant, taken for
// a new sandbox, or nil where this sandbox starts without one: the backend
// runs without zygotes of templates; the template's zygote is not ready
// (this sandbox does not wait for its preloads; with warm, the caller
// starts the zygote in the background, which serves the template's next
// sandboxes once ready); or it failed to start within the last
// noZygoteRetry (the template has no python3 the zygote can run; tried
// again later, for a template may be rebuilt under its name).
func (b *Backend) templateZygote(root *sandbox.Root, tenant string) (z *zygote, warm bool) {
	if !b.cfg.Zygote || b.cfg.ZygoteTemplates < 0 {
		return nil, false
	}
	kind := zygoteKind{root: root, tenant: tenant}
	key := kind.key()
	b.zmu.Lock()
	defer b.zmu.Unlock()
	if failed, ok := b.zfailed[key]; ok && time.Since(failed) < noZygoteRetry {
		return nil, false
	}
	if z := b.zygotes[key]; z != nil && z.alive() {
		if z.expired() {
			b.replaceZygoteLocked(key, kind)
		}
		z.acquire()
		return z, false
	}
	return nil, b.zstarting[key] == nil && !b.closed
}

// WarmTemplate starts the zygote of a template for a tenant, if the
// backend has one for it, and returns once it is ready (or failed: the
// template's sandboxes then start without one).
func (b *Backend) WarmTemplate(ctx context.Context, root *sandbox.Root, tenant string) error {
	if !b.cfg.Zygote || b.cfg.ZygoteTemplates < 0 {
		return nil
	}
	b.zsweep.Do(func() { go b.sweepTemplates() })
	_, err := b.zygoteFor(ctx, zygoteKind{root: root, tenant: tenant}, false)
	return err
}

// templateZygoteIdle is how long a template's zygote that starts no
// sandbox is kept: then it retires, and ends with its last sandbox, its
// memory and its hold on the template's layers let go of.
const templateZygoteIdle = 10 * time.Minute

// sweepTemplates retires the templates' zygotes that have been idle for
// templateZygoteIdle, every minute until the backend closes.
func (b *Backend) sweepTemplates() {
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		select {
		case <-b.zdone:
			return
		case <-tick.C:
		}
		b.zmu.Lock()
		for key, z := range b.zygotes {
			if z.root != nil && time.Since(z.lastUsed()) >= templateZygoteIdle {
				b.log.Info("zygote: a template's retires, idle", "template", z.root.Template)
				b.retireLocked(key)
			}
		}
		b.zmu.Unlock()
	}
}

// warmTemplate starts a template's zygote, and records its failure.
func (b *Backend) warmTemplate(kind zygoteKind) {
	b.zsweep.Do(func() { go b.sweepTemplates() })
	_, err := b.zygoteFor(context.Background(), kind, false)
	if err == nil || errors.Is(err, sandbox.ErrClosed) {
		return
	}
	b.zmu.Lock()
	for key, at := range b.zfailed {
		if time.Since(at) >= noZygoteRetry {
			delete(b.zfailed, key)
		}
	}
	b.zfailed[kind.key()] = time.Now()
	b.zmu.Unlock()
	b.log.Warn("zygote: the template's did not start; its sandboxes start a python3 each", "template", kind.root.Template, "err", err)
}

// noZygoteRetry is how long a template whose zygote failed to start
// starts its sandboxes without one.
const noZygoteRetry = 10 * time.Minute

// rootMount makes the root of a template's sandbox, as a detached mount:
// its layers idmapped through userns (nil: as they are, for a zygote of
// the host's user namespace), under a writable layer of disk bytes whose
// directories are the host user owner's. With keep, the tmpfs of the
// writable layer is returned too.
func rootMount(userns *os.File, root *sandbox.Root, owner uint32, disk, inodes int64, keep bool) (_, _ *os.File, err error) {
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, nil, fmt.Errorf("template root: the writable layer: %w", err)
	}
	defer unix.Close(fs)
	for k, v := range map[string]string{"size": fmt.Sprint(disk), "nr_inodes": fmt.Sprint(inodes), "mode": "0700"} {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return nil, nil, fmt.Errorf("template root: the writable layer's %s: %w", k, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return nil, nil, fmt.Errorf("template root: the writable layer: %w", err)
	}
	tmp, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, nil, fmt.Errorf("template root: the writable layer: %w", err)
	}
	defer func() {
		if !keep || err != nil {
			unix.Close(tmp)
		}
	}()
	for _, d := range []string{"upper", "work"} {
		if err := unix.Mkdirat(tmp, d, 0o755); err != nil {
			return nil, nil, fmt.Errorf("template root: %s: %w", d, err)
		}
		if err := unix.Fchownat(tmp, d, int(owner), int(owner), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, nil, fmt.Errorf("template root: %s: %w", d, err)
		}
	}
	dir := fmt.Sprintf("/proc/self/fd/%d/", tmp)
	m, err := layers.MountLayers(root.Layers, userns, dir+"upper", dir+"work")
	if err != nil {
		return nil, nil, fmt.Errorf("template %s: %w", root.Template, err)
	}
	if keep {
		return m, os.NewFile(uintptr(tmp), "writable layer"), nil
	}
	return m, nil, nil
}

// sendRoot makes and sends a template sandbox's root to its init.
func (s *Sandbox) sendRoot() error {
	if s.spec.Root == nil {
		return nil
	}
	unhold, err := layers.HoldLayers(s.spec.Root.Layers)
	if err != nil {
		return fmt.Errorf("template %s: %w", s.spec.Root.Template, err)
	}
	s.unhold = unhold
	// The init's pid is not reaped yet: its namespace is the sandbox's.
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", s.init.pid))
	if err != nil {
		return fmt.Errorf("template root: the sandbox's user namespace: %w", err)
	}
	defer userns.Close()
	m, upper, err := rootMount(userns, s.spec.Root, s.owner.ID(0), s.cfg.DiskBytes, s.cfg.DiskInodes+rootInodes, true)
	if err != nil {
		return err
	}
	s.upper = upper
	defer m.Close()
	if err := sendCtl(s.ctl, ctlMsg{Op: opRoot}, int(m.Fd())); err != nil {
		return fmt.Errorf("send the template's root to init: %w", err)
	}
	return nil
}

// sendRoot makes and sends a template zygote's root to its init: the
// template's layers as they are (the zygote is of the host's user
// namespace), read by the zygote alone, under a small writable layer of
// root's, which its init makes read-only once built. The layers are held
// while the zygote lives: its sandboxes map its files.
func (z *zygote) sendRoot() error {
	unhold, err := layers.HoldLayers(z.root.Layers)
	if err != nil {
		return fmt.Errorf("template %s: %w", z.root.Template, err)
	}
	z.unhold = unhold
	m, _, err := rootMount(nil, z.root, 0, 64<<20, 16384, false)
	if err != nil {
		return err
	}
	defer m.Close()
	z.ctlMu.Lock()
	err = sendCtl(z.ctl, ctlMsg{Op: opRoot}, int(m.Fd()))
	z.ctlMu.Unlock()
	if err != nil {
		return fmt.Errorf("send the template's root to the zygote's init: %w", err)
	}
	return nil
}

// rootEnv is a template's environment, as sandboxEnv takes it (nil: no
// template).
func rootEnv(root *sandbox.Root) map[string]string {
	if root == nil {
		return nil
	}
	env := map[string]string{}
	for _, kv := range root.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	return env
}

// upperDir is the template sandbox's writable layer, as the supervisor
// reaches it (its tmpfs held by s.upper), or "" for a sandbox without a
// template.
func (s *Sandbox) upperDir() string {
	if s.upper == nil {
		return ""
	}
	return fmt.Sprintf("/proc/%d/fd/%d/upper", os.Getpid(), s.upper.Fd())
}

// copyTemplateRoot mounts at root the root of c, a copy of a template's
// sandbox: the template's layers, held for c and idmapped to c's host
// user, under a copy of the source's writable layer (snap.rootFiles) on a
// tmpfs of c's own, its owners shifted to c's. done unmounts what root's
// mount does not need once CRIU has it.
func (c *Sandbox) copyTemplateRoot(snap *forkSnapshot, dir, root string) (done func(), err error) {
	fsDir := filepath.Join(dir, "writable")
	done = func() {
		unix.Unmount(fsDir, unix.MNT_DETACH)
		os.Remove(fsDir)
	}
	unhold, err := layers.HoldLayers(c.spec.Root.Layers)
	if err != nil {
		return done, fmt.Errorf("template %s: %w", c.spec.Root.Template, err)
	}
	// A paused sandbox resumed from disk had its own before.
	if c.unhold != nil {
		c.unhold()
	}
	if c.upper != nil {
		c.upper.Close()
		c.upper = nil
	}
	c.unhold = unhold
	if err := os.Mkdir(fsDir, 0o700); err != nil {
		return done, err
	}
	if err := unix.Mount("tmpfs", fsDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, snap.rootOpts); err != nil {
		return done, fmt.Errorf("fork: the copy's writable layer: %w", err)
	}
	upper, work := filepath.Join(fsDir, "upper"), filepath.Join(fsDir, "work")
	// cp -a (whiteouts and overlayfs's attributes kept), in the copy's
	// cgroup: the tmpfs's memory is charged to the copy.
	if err := fileutil.CopyTree(snap.rootFiles, upper, c.cg); err != nil {
		return done, fmt.Errorf("fork: copy the writable layer: %w", err)
	}
	if err := shiftOwners(upper, snap.owner.First, c.owner.First); err != nil {
		return done, err
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return done, err
	}
	if err := os.Chown(work, int(c.owner.ID(0)), int(c.owner.ID(0))); err != nil {
		return done, err
	}
	if c.upper, err = os.OpenFile(fsDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return done, err
	}
	userns, release, err := idmapNamespace(c.owner.ID(0))
	if err != nil {
		return done, fmt.Errorf("fork: %w", err)
	}
	defer release()
	m, err := layers.MountLayers(c.spec.Root.Layers, userns, upper, work)
	if err != nil {
		return done, fmt.Errorf("fork: template %s: %w", c.spec.Root.Template, err)
	}
	defer m.Close()
	if err := unix.MoveMount(int(m.Fd()), "", unix.AT_FDCWD, root, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return done, fmt.Errorf("fork: attach the copy's root: %w", err)
	}
	return done, nil
}

// idmapArg0 is argv[0] of this binary re-executed by idmapNamespace: a
// process that holds a user namespace until its standard input closes.
const idmapArg0 = "vivarium-idmap-userns"

// idmapNamespace returns a user namespace whose ids 0 to 65,535 are the
// host's from first on, as a sandbox's of that host user: the layers of a
// copy of a template's sandbox are idmapped through it before CRIU makes
// the copy's own. release ends the process that holds it.
func idmapNamespace(first uint32) (userns *os.File, release func(), err error) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Args = []string{idmapArg0}
	cmd.Env = []string{}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(first), Size: hostuid.RangeSize}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: ids, GidMappings: ids,
		Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("a user namespace to idmap the layers: %w", err)
	}
	end := func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	}
	if userns, err = os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid)); err != nil {
		end()
		return nil, nil, err
	}
	return userns, func() { userns.Close(); end() }, nil
}

// sendMounts sends init the mounts it attaches while it builds the root:
// a template's root first, then the volumes.
func (s *Sandbox) sendMounts() error {
	if err := s.sendRoot(); err != nil {
		return err
	}
	return s.sendVolumes()
}

// attachRoot is init's side: it receives the root and attaches it at dst.
func attachRoot(dst string) error {
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4))
	m, fds, err := recvCtl(fdControl, buf, oob)
	if err != nil {
		return step("receive the template's root", err)
	}
	defer closeAll(fds)
	if m.Op != opRoot || len(fds) != 1 {
		return step("receive the template's root", fmt.Errorf("expected it, got %q with %d descriptors", m.Op, len(fds)))
	}
	if err := unix.MoveMount(fds[0], "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return step("attach the template's root (move_mount)", err)
	}
	return nil
}

// imageDirs are the directories of a template's root that init makes,
// mounts on or writes in.
var imageDirs = []string{"dev", "proc", "tmp", "workspace", "home/user", "root", "run/shm", "var", "etc",
	strings.TrimPrefix(runnerDir, "/")}

// buildDirs are those of a build's sandbox: no runner's.
var buildDirs = imageDirs[:len(imageDirs)-1]

// sticky is the sticky bit of m in the kernel's form.
func sticky(m os.FileMode) os.FileMode {
	if m&os.ModeSticky != 0 {
		return unix.S_ISVTX
	}
	return 0
}

// rootDirs makes each of dirs (relative, clean) a directory of the root
// at root, component by component: a link or a file of the image in the
// way is removed first (the removal is the sandbox's writable layer's,
// the image is unchanged), so that nothing init does below follows a link
// the image made.
func rootDirs(root string, dirs []string) error {
	for _, d := range dirs {
		fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		for _, part := range strings.Split(d, "/") {
			next, err := unix.Openat(fd, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				if err = unix.Unlinkat(fd, part, 0); err == nil {
					err = unix.ENOENT
				}
			}
			if errors.Is(err, unix.ENOENT) {
				if err = unix.Mkdirat(fd, part, 0o755); err == nil {
					next, err = unix.Openat(fd, part, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				}
			}
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("/%s: %w", d, err)
			}
			fd = next
		}
		unix.Close(fd)
	}
	return nil
}

// imageEtc writes what a template sandbox's /etc must say whatever the
// image says (its host name and hosts, no name server), and, with
// user1000 (the sandbox user is uid 1000, not an image's USER of another
// id), gives it an entry of its own if the image has none.
func imageEtc(etc, name, home string, user1000 bool) error {
	for _, f := range []string{"hostname", "hosts", "resolv.conf"} {
		if err := replaceFile(filepath.Join(etc, f), []byte(rootview.GeneratedEtc(f))); err != nil {
			return err
		}
	}
	if !user1000 {
		return nil // the sandbox user is the image's USER, another id
	}
	if name == "" {
		name = "sandbox"
	}
	for _, f := range []struct{ file, entry string }{
		{"passwd", name + ":x:1000:1000:" + name + ":" + home + ":/bin/sh\n"},
		{"group", name + ":x:1000:\n"},
	} {
		p := filepath.Join(etc, f.file)
		old, err := readImageFile(p)
		if err != nil {
			return err
		}
		if hasID(string(old)) {
			continue
		}
		if len(old) > 0 && !strings.HasSuffix(string(old), "\n") {
			old = append(old, '\n')
		}
		if err := replaceFile(p, append(old, f.entry...)); err != nil {
			return err
		}
	}
	return nil
}

// maxImageEtcFile bounds a file of the image's /etc that init reads.
const maxImageEtcFile = 1 << 20

// readImageFile reads a file of the image at p (its directory a real one,
// rootDirs), or nothing if it is absent or not a regular file: a link of
// the image's is never followed (it could name the host's files, before
// the pivot), and a file too large is refused.
func readImageFile(p string) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ELOOP) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxImageEtcFile+1))
	if err == nil && len(b) > maxImageEtcFile {
		err = fmt.Errorf("%s is larger than %d bytes", filepath.Base(p), maxImageEtcFile)
	}
	return b, err
}

// hasID reports whether an /etc/passwd (or /etc/group) has an entry of id
// 1000.
func hasID(db string) bool {
	for _, l := range strings.Split(db, "\n") {
		f := strings.Split(l, ":")
		if len(f) >= 3 && f[2] == "1000" {
			return true
		}
	}
	return false
}

// replaceFile writes a new file at p in place of whatever is there (a link
// of the image's is removed, never followed).
func replaceFile(p string, data []byte) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

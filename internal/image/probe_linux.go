package image

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// probeArg0 is argv[0] of this binary re-executed by CheckRootMount.
const probeArg0 = "vivarium-image-probe"

func init() {
	if len(os.Args) > 0 && os.Args[0] == probeArg0 {
		if err := probeChild(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// CheckRootMount reports whether this host can give a sandbox an image's
// root as RootMount makes it: a one-file layer owned by root is stacked,
// idmapped to a throwaway user namespace (this binary again, root of it
// being the host's nobody), whose process attaches it in a mount
// namespace of its own and must see the file as its root's. It needs
// root.
func CheckRootMount() error {
	dir, err := os.MkdirTemp("", "vivarium-image-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// The namespace's root is the host's nobody: what it reaches must be
	// open to any user.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	s, err := Open(filepath.Join(dir, "store"), DefaultLimits)
	if err != nil {
		return err
	}
	const id = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
	if err := os.Mkdir(s.LayerDir(id), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.LayerDir(id), "probe"), []byte("root's"), 0o600); err != nil {
		return err
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	parent, child := os.NewFile(uintptr(pair[0]), "probe"), os.NewFile(uintptr(pair[1]), "probe child")
	defer parent.Close()
	ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}}
	var out bytes.Buffer
	cmd := &exec.Cmd{
		Path: "/proc/self/exe", Args: []string{probeArg0, mnt}, ExtraFiles: []*os.File{child},
		Stdout: &out, Stderr: &out,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS, UidMappings: ids, GidMappings: ids,
			Credential: &syscall.Credential{Uid: 0, Gid: 0}, Pdeathsig: syscall.SIGKILL,
		},
	}
	err = cmd.Start()
	child.Close()
	if err != nil {
		return err
	}
	sent := func() error {
		userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
		if err != nil {
			return err
		}
		defer userns.Close()
		root, err := s.RootMount([]string{id}, userns, "", "")
		if err != nil {
			return err
		}
		defer root.Close()
		return unix.Sendmsg(int(parent.Fd()), []byte{1}, unix.UnixRights(int(root.Fd())), nil, 0)
	}()
	if sent != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return sent
	}
	if err := cmd.Wait(); err != nil {
		msg := strings.TrimSpace(out.String())
		if msg == "" {
			msg = err.Error()
		}
		return errors.New(msg)
	}
	return nil
}

// probeChild is CheckRootMount's child: root of a new user namespace, in
// a new mount namespace, it attaches the root it is sent on fd 3 at
// os.Args[1] and reads the probe file as its own.
func probeChild() error {
	sock := os.NewFile(3, "probe")
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(int(sock.Fd()), buf, oob, 0)
	if err != nil {
		return fmt.Errorf("receive the image root: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return errors.New("receive the image root: no descriptor came")
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return errors.New("receive the image root: no descriptor came")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	dst := os.Args[1]
	if err := unix.MoveMount(fds[0], "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the image root in a user namespace (move_mount): %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "probe"), &st); err != nil {
		return fmt.Errorf("the image root shows no file: %w", err)
	}
	if st.Uid != 0 {
		return fmt.Errorf("a file of the image's root is seen as owned by %d, not by the namespace's root: idmapped layers do not work here", st.Uid)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "probe")); err != nil || string(b) != "root's" {
		return fmt.Errorf("the namespace's root cannot read its root-only file (%v)", err)
	}
	return nil
}

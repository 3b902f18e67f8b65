package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/internal/linux"
)

// imageOverlays is the root filesystem of an image: one overlay at / whose lower is the
// image's layers (stacked by imageLower in init).
func imageOverlays(lowers []string) []overlay {
	return []overlay{{Target: "/", Lowers: lowers, Sub: "root", Layers: true}}
}

// imageLower stacks an image's layer directories (top first) in a read-only overlay of
// their own, a detached mount whose descriptor it returns: the one lower of the
// session's overlay at /. The stack is mounted in overlay's trusted. namespace (the
// store's opaque directories are marked there) while the session's overlay keeps
// userxattr, so its upper's markers stay readable by a confined init (snapshot, a RUN
// step's layer). Layers are given one by one (fsconfig lowerdir+, Linux 6.8), so no
// option string limits how many there are; an older kernel gets one lowerdir= of names
// relative to their common parent.
func imageLower(lowers []string) (int, error) {
	switch len(lowers) {
	case 0:
		return emptyLower()
	case 1: // an overlay of one lower is refused, and there is nothing to stack
		return unix.Open(lowers[0], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	fs, err := linux.OpenFS("overlay")
	if err != nil {
		return -1, err
	}
	defer fs.Close()
	plus := true
	for _, l := range lowers {
		if err := fs.SetString("lowerdir+", l); err != nil {
			if !errors.Is(err, unix.EINVAL) || l != lowers[0] {
				return -1, fmt.Errorf("image layer %s: %w", l, err)
			}
			plus = false
			break
		}
	}
	if !plus {
		return imageLowerLegacy(lowers)
	}
	for _, kv := range [][2]string{{"redirect_dir", "nofollow"}, {"metacopy", "off"}, {"index", "off"}} {
		if err := fs.SetString(kv[0], kv[1]); err != nil {
			return -1, err
		}
	}
	if err := fs.Create(); err != nil {
		return -1, fmt.Errorf("image layers: %w", err)
	}
	return fs.Mount(unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
}

// imageLowerLegacy is imageLower with one lowerdir= option (kernels before 6.8): names
// relative to the layers' common parent, which is the working directory while the
// overlay is made.
func imageLowerLegacy(lowers []string) (int, error) {
	parent := filepath.Dir(lowers[0])
	names := make([]string, len(lowers))
	for i, l := range lowers {
		if filepath.Dir(l) != parent {
			return -1, fmt.Errorf("image layers are not in one directory (%s, %s)", lowers[0], l)
		}
		names[i] = filepath.Base(l)
	}
	opts := "lowerdir=" + strings.Join(names, ":") + ",redirect_dir=nofollow,metacopy=off,index=off"
	if len(opts) >= 4096 {
		return -1, fmt.Errorf("the image has %d layers, more than one overlay option holds on this kernel (Linux 6.8 takes any number)", len(lowers))
	}
	tmp, err := os.MkdirTemp("", "virtx-layers-")
	if err != nil {
		return -1, err
	}
	defer os.Remove(tmp)
	if err := unix.Chdir(parent); err != nil {
		return -1, err
	}
	err = linux.Mount("overlay", tmp, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts)
	unix.Chdir("/")
	if err != nil {
		return -1, fmt.Errorf("image layers: %w", err)
	}
	fd, err := linux.CloneTree(unix.AT_FDCWD, tmp, false)
	linux.Unmount(tmp, unix.MNT_DETACH)
	return fd, err
}

// emptyLower is a read-only empty directory: the lower of an image with no layers.
func emptyLower() (int, error) {
	fs, err := linux.OpenFS("tmpfs")
	if err != nil {
		return -1, err
	}
	defer fs.Close()
	for _, kv := range [][2]string{{"size", "4k"}, {"mode", "0755"}} {
		if err := fs.SetString(kv[0], kv[1]); err != nil {
			return -1, err
		}
	}
	if err := fs.Create(); err != nil {
		return -1, err
	}
	return fs.Mount(unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
}

// makeWorkdir makes an image's working directory in the root init has pivoted into, as
// docker does when WORKDIR names one the layers lack.
func makeWorkdir(dir string) error {
	if dir == "" || dir == "/" {
		return nil
	}
	if err := os.MkdirAll(path.Clean(dir), 0o755); err != nil {
		return fmt.Errorf("the image's working directory: %w", err)
	}
	return nil
}

// RunStep runs a build's RUN step (store.StepRunner): `sh -c shellCmd` in a sandbox whose
// root is lowers with a new upper, env and workdir as given, and returns the upper as a
// layer tar. The sandbox is the session's kind but apart from it (the session's upper is
// not touched); it has the network a network:true session has where the host has a
// user-space stack (confine). Output is
// written once the command has ended, stdout then stderr.
func (b *Backend) RunStep(ctx context.Context, lowers []string, env []string, workdir string, shellCmd string, output io.Writer) (io.ReadCloser, error) {
	if b.rootless {
		return nil, fmt.Errorf("%w: RUN: %s", backend.ErrUnsupportedImage, errRootlessImages)
	}
	if workdir == "" {
		workdir = "/"
	}
	disk, _ := diskBytes(&backend.Spec{})
	cfg := bootConfig{Overlays: imageOverlays(lowers), Env: imageEnv(env), NewUpper: disk, Workdir: workdir}
	// A cgroup without limits, to find and kill what the step leaves running.
	m, err := b.spawnIn(machineShape{})
	if err != nil {
		return nil, err
	}
	defer m.Shutdown(context.Background())
	// Network on, as for a network:true session, where this host has a user-space stack;
	// loopback only where it has none. No cgroup limits.
	if err := m.confine(ctx, machineShape{}, networkAvailable() == nil, &cfg); err != nil {
		return nil, err
	}
	upper, err := m.boot(ctx, &cfg, nil, nil)
	if err != nil {
		return nil, err
	}
	defer upper.Close()
	res, err := m.Exec(ctx, executor.ExecRequest{Cmd: []string{"sh", "-c", shellCmd}, Cwd: workdir})
	if err != nil {
		return nil, fmt.Errorf("RUN: %w", err)
	}
	if output != nil {
		output.Write(res.Stdout)
		output.Write(res.Stderr)
		if res.Truncated {
			fmt.Fprintf(output, "[output truncated]\n")
		}
	}
	if res.Code != 0 {
		return nil, fmt.Errorf("%w: RUN exited with status %d", backend.ErrBuildFailed, res.Code)
	}
	layer, err := m.Snapshot(ctx)
	if err != nil {
		return nil, fmt.Errorf("RUN: the step's layer: %w", err)
	}
	if layer, err = dropMountPoints(layer, lowers); err != nil {
		return nil, fmt.Errorf("RUN: the step's layer: %w", err)
	}
	return io.NopCloser(bytes.NewReader(layer)), nil
}

// initMade are what init makes in a root that lacks them, as mount points: /proc, /sys,
// /dev, and /etc/resolv.conf (with /etc) for a session with network. They are the
// sandbox's, not the step's: dropMountPoints keeps them out of the layer.
var initMade = []string{"etc/resolv.conf", "proc", "sys", "dev", "etc"}

// dropMountPoints removes from a step's layer the mount points init made (initMade) where
// no lower has them and the step put nothing below them.
func dropMountPoints(layer []byte, lowers []string) ([]byte, error) {
	type entry struct {
		hdr  *tar.Header
		body []byte
	}
	var ents []entry
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		ents = append(ents, entry{hdr, body})
	}
	drop := map[string]bool{}
	for _, mp := range initMade {
		inLower := false
		for _, l := range lowers {
			if _, err := os.Lstat(filepath.Join(l, mp)); err == nil {
				inLower = true
				break
			}
		}
		if inLower {
			continue
		}
		ok := false
		for _, e := range ents {
			name := strings.TrimSuffix(path.Clean(e.hdr.Name), "/")
			switch {
			case name == mp:
				ok = e.hdr.Size == 0 && (e.hdr.Typeflag == tar.TypeDir || e.hdr.Typeflag == tar.TypeReg)
			case strings.HasPrefix(name, mp+"/") && !drop[name]:
				ok = false
			default:
				continue
			}
			if !ok {
				break
			}
		}
		if ok {
			drop[mp] = true
		}
	}
	if len(drop) == 0 {
		return layer, nil
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, e := range ents {
		if drop[strings.TrimSuffix(path.Clean(e.hdr.Name), "/")] {
			continue
		}
		if err := tw.WriteHeader(e.hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// rootImage is what a boot's root is made of: the host image, or the layers of the
// image spec's init resolved (as a hostImage of one overlay, which holds no lock: the
// image's lease is held from Admit).
func (b *Backend) rootImage(spec *backend.Spec) (*hostImage, error) {
	if spec.Image == nil {
		return b.image()
	}
	im := b.heldImage(spec)
	if im == nil {
		return nil, fmt.Errorf("image %s: not resolved at init", spec.Image)
	}
	return &hostImage{overlays: imageOverlays(im.Lowers)}, nil
}

// imageEnv sets a boot on an image to the image's environment and working directory.
func (b *Backend) imageEnv(spec *backend.Spec, cfg *bootConfig) {
	if spec.Image == nil {
		return
	}
	if im := b.heldImage(spec); im != nil {
		cfg.Env = imageEnv(im.Config.Env)
		cfg.Workdir = imageCwd(im)
	}
}

// A cgo-linked init executes itself again to be confined (serveConfined), after the
// pivot into the session's root. On the host image that root has this host's loader and
// libc; an image has its own or none (busybox, alpine's musl), which cannot load this
// binary. So before the pivot an init on an image opens the host's program interpreter,
// the directories of the shared libraries this process has mapped, and its own
// executable, and the re-execution runs the interpreter (static) by descriptor with those
// directories as its only library path (/proc/self/fd/N: the descriptors cross the
// execve and the serving stage closes them first thing). Nothing of the host is mounted
// in the image, and nothing is left open once commands can run.
type hostLoader struct {
	interp int   // the program interpreter (ld.so), O_PATH
	exe    int   // this executable
	dirs   []int // library directories, O_PATH
}

// loader is the host loader an init on an image opened, nil otherwise.
var loader *hostLoader

// loaderEnv names the descriptors the serving stage closes.
const loaderEnv = "VIRTX_SANDBOX_LOADER_FDS"

// openHostLoader opens what re-executing this binary in an image's root needs; nil when
// the binary is static (nothing is needed).
func openHostLoader() (*hostLoader, error) {
	f, err := elf.Open("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("reading this executable: %w", err)
	}
	interp := ""
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err == nil {
				interp = strings.TrimRight(string(b), "\x00")
			}
		}
	}
	f.Close()
	if interp == "" {
		return nil, nil
	}
	h := &hostLoader{interp: -1, exe: -1}
	fail := func(err error) (*hostLoader, error) {
		h.close()
		return nil, err
	}
	if h.interp, err = unix.Open(interp, unix.O_PATH|unix.O_CLOEXEC, 0); err != nil {
		return fail(fmt.Errorf("the program interpreter %s: %w", interp, err))
	}
	if h.exe, err = unix.Open("/proc/self/exe", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return fail(fmt.Errorf("this executable: %w", err))
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return fail(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(maps), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 6 || !strings.HasPrefix(fields[5], "/") || !strings.Contains(path.Base(fields[5]), ".so") {
			continue
		}
		d := path.Dir(fields[5])
		if seen[d] {
			continue
		}
		seen[d] = true
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("library directory %s: %w", d, err))
		}
		h.dirs = append(h.dirs, fd)
	}
	return h, nil
}

func (h *hostLoader) close() {
	for _, fd := range append([]int{h.interp, h.exe}, h.dirs...) {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// execStage2 executes this binary again as argv with env: through the host loader when
// an image is the root, else as /proc/self/exe.
func execStage2(argv, env []string) error {
	h := loader
	if h == nil {
		return unix.Exec("/proc/self/exe", argv, env)
	}
	fds := append([]int{h.exe}, h.dirs...)
	var libs, list []string
	for _, fd := range fds {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return err
		}
		list = append(list, fmt.Sprint(fd))
	}
	for _, fd := range h.dirs {
		libs = append(libs, linux.FdPath(fd))
	}
	args := append([]string{"ld.so", "--inhibit-cache", "--library-path", strings.Join(libs, ":"), "--argv0", argv[0], linux.FdPath(h.exe)}, argv[1:]...)
	env = append(env, loaderEnv+"="+strings.Join(list, ","))
	return execveat(h.interp, args, env)
}

// execveat executes the file fd refers to (AT_EMPTY_PATH); it returns only on failure.
func execveat(fd int, argv, env []string) error {
	empty, err := syscall.BytePtrFromString("")
	if err != nil {
		return err
	}
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return err
	}
	envp, err := syscall.SlicePtrFromStrings(env)
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(fd), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), unix.AT_EMPTY_PATH, 0)
	return errno
}

// closeLoader closes, in the serving stage, what execStage2 passed to the loader.
func closeLoader() {
	v, ok := os.LookupEnv(loaderEnv)
	if !ok {
		return
	}
	os.Unsetenv(loaderEnv)
	for _, s := range strings.Split(v, ",") {
		if fd, err := strconv.Atoi(s); err == nil && fd > 4 {
			unix.Close(fd)
		}
	}
}

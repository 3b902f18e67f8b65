package sandbox

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/internal/linux"
	"virtx.dev/virtx/internal/relay"
)

// newRoot is where init assembles the sandbox's root before pivoting into it: a directory
// every Linux host has, mounted over only inside the sandbox's own mount namespace (the
// host's /tmp is untouched). Everything init needs from the host is opened before it.
const newRoot = "/tmp"

// stage2Env carries the serving stage's settings across the execve that confines a
// cgo-linked init (see serveConfined).
const stage2Env = "VIRTX_SANDBOX_STAGE2"

// stage2 is what the serving stage needs.
type stage2 struct {
	Upper    int      `json:"upper"` // fd of the session's upper filesystem
	Env      []string `json:"env"`
	ReadOnly []string `json:"read_only"`
}

// defaultCaps are what commands keep: Docker's default set. Everything else — mounting,
// loading modules, tracing, raw I/O, the host's clock and host name, administering the
// network — is gone from the bounding set, so no program regains it.
var defaultCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_FOWNER, unix.CAP_MKNOD,
	unix.CAP_NET_RAW, unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETFCAP, unix.CAP_SETPCAP,
	unix.CAP_NET_BIND_SERVICE, unix.CAP_SYS_CHROOT, unix.CAP_KILL, unix.CAP_AUDIT_WRITE,
}

// RunInit is the hidden `virtx __sandbox-init` command: a sandbox's PID 1. It builds the
// root filesystem inside the namespaces the server made it in, confines itself, and then
// serves the relay on fd 3 as the session's executor until the stream ends.
func RunInit(args []string) error {
	log := initLogger()
	if len(args) > 0 && args[0] == "serve" {
		return serveStage2(log)
	}
	if os.Getpid() != 1 {
		return errors.New("__sandbox-init runs only as the PID 1 of a sandbox the server made")
	}
	// Descriptors the server inherited from its own parent without close-on-exec came
	// along: none of them is the sandbox's business.
	unix.CloseRange(5, ^uint(0), 0)
	// What serving needs and the root filesystem does not, made while init builds it.
	ignoreSignals(log)
	starts := newStarter()
	// fds 3 and 4 stay open (close-on-exec, so no command inherits them) for
	// serveConfined's execve; this process talks through duplicates.
	unix.CloseOnExec(3)
	unix.CloseOnExec(4)
	c, err := net.FileConn(os.NewFile(3, "relay"))
	if err != nil {
		return fmt.Errorf("sandbox init: fd 3: %w", err)
	}
	conn := c.(*net.UnixConn)
	var cfg bootConfig
	fds, err := recvFrame(conn, &cfg, 1)
	if (errors.Is(err, io.EOF) || err == io.ErrUnexpectedEOF) && len(fds) == 0 {
		return nil // the server let go of an init spawned ahead: nothing to do
	}
	if err != nil {
		return fmt.Errorf("sandbox init: reading the boot config: %w", err)
	}
	given := -1
	if len(fds) > 0 && cfg.NewUpper == 0 {
		given = fds[0]
	} else {
		closeFds(fds)
	}
	var snapshot []byte
	if cfg.Snapshot > 0 {
		snapshot = make([]byte, cfg.Snapshot)
		if _, err := io.ReadFull(conn, snapshot); err != nil {
			return fmt.Errorf("sandbox init: reading the snapshot: %w", err)
		}
	}
	t0 := time.Now()
	upper, err := setup(&cfg, snapshot, given)
	log.Debug("root filesystem", "took", time.Since(t0), "err", err)
	st := bootStatus{}
	var mfe *mountFailure
	if errors.As(err, &mfe) {
		st = bootStatus{Err: err.Error(), Mount: true}
	} else if err != nil {
		st = bootStatus{Err: err.Error()}
	}
	frame, ferr := appendFrame(st)
	if ferr != nil {
		return ferr
	}
	var out []int
	if err == nil && cfg.NewUpper > 0 {
		out = []int{upper}
	}
	if serr := linux.SendFds(conn, frame, out...); serr != nil {
		return fmt.Errorf("sandbox init: answering the server: %w", serr)
	}
	if err != nil {
		return err
	}
	s2 := stage2{Upper: upper, Env: cfg.Env, ReadOnly: cfg.ReadOnly}
	return serveConfined(log, conn, s2, starts)
}

func initLogger() *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(os.Getenv("VIRTX_LOG")))); err != nil {
		l = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})).With("sandbox", "init")
}

// mountFailure is a tree that could not be put in place (MOUNT_FAILED to the client).
type mountFailure struct{ err error }

func (m *mountFailure) Error() string { return m.err.Error() }
func (m *mountFailure) Unwrap() error { return m.err }

// setup builds the sandbox's root filesystem and everything else a boot sets up inside
// the namespaces, and returns the descriptor of the session's upper filesystem.
func setup(cfg *bootConfig, snapshot []byte, given int) (int, error) {
	names := setNames(cfg)
	if err := linux.MakeRPrivate("/"); err != nil {
		return -1, err
	}
	upper, err := upperFS(cfg, snapshot, given)
	if err != nil {
		return -1, err
	}
	// Open everything taken from the host before anything is mounted over any path.
	lowers := make([][]string, len(cfg.Overlays))
	for i, o := range cfg.Overlays {
		if o.Layers { // an image's layers, stacked on their own (image_linux.go)
			if loader, err = openHostLoader(); err != nil {
				return -1, fmt.Errorf("image: %w", err)
			}
			fd, err := imageLower(o.Lowers)
			if err != nil {
				return -1, fmt.Errorf("image: %w", err)
			}
			defer unix.Close(fd)
			lowers[i] = []string{linux.FdPath(fd)}
			continue
		}
		for _, l := range o.Lowers {
			fd, err := unix.Open(l, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return -1, fmt.Errorf("host image: %s: %w", l, err)
			}
			defer unix.Close(fd)
			lowers[i] = append(lowers[i], linux.FdPath(fd))
		}
	}
	sources := make([]int, len(cfg.Trees))
	for i, t := range cfg.Trees {
		fd, err := unix.Open(t.Source, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, &mountFailure{fmt.Errorf("mount %d (%s): the host directory %s: %w", t.N, t.URL, t.Source, err)}
		}
		defer unix.Close(fd)
		sources[i] = fd
	}

	var root int
	for i, o := range cfg.Overlays {
		up := "upper" + strings.TrimSuffix(o.Target, "/")
		opts := "lowerdir=" + strings.Join(lowers[i], ":") +
			",upperdir=" + linux.FdPath(upper) + "/" + up +
			",workdir=" + linux.FdPath(upper) + "/work/" + o.Sub +
			",userxattr,redirect_dir=nofollow,metacopy=off,index=off"
		target := newRoot
		if o.Target != "/" {
			fd, err := linux.MkdirAllInRoot(root, o.Target, 0o755)
			if err != nil {
				return -1, err
			}
			defer unix.Close(fd)
			target = linux.FdPath(fd)
		}
		if err := linux.Mount("overlay", target, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return -1, fmt.Errorf("overlay for %s: %w", o.Target, err)
		}
		if o.Target == "/" {
			if root, err = unix.Open(newRoot, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
				return -1, fmt.Errorf("new root: %w", err)
			}
			defer unix.Close(root)
		}
	}
	if err := mountProc(root, !cfg.Rootless); err != nil {
		return -1, err
	}
	if err := mountSys(root); err != nil {
		return -1, err
	}
	if err := mountDev(root, cfg.Rootless); err != nil {
		return -1, err
	}
	if err := bindDevices(root, cfg.Devices); err != nil {
		return -1, err
	}
	if cfg.ResolvConf != "" {
		if err := mountResolvConf(root, cfg.ResolvConf); err != nil {
			return -1, fmt.Errorf("the session's resolv.conf: %w", err)
		}
	}
	for i, t := range cfg.Trees {
		if err := mountTree(root, sources[i], t); err != nil {
			return -1, &mountFailure{fmt.Errorf("mount %d (%s → %s): %w", t.N, t.URL, t.Target, err)}
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return -1, fmt.Errorf("chdir new root: %w", err)
	}
	if err := linux.PivotRoot(".", "."); err != nil {
		return -1, err
	}
	if err := linux.Unmount(".", unix.MNT_DETACH); err != nil {
		return -1, err
	}
	if err := unix.Chdir("/"); err != nil {
		return -1, fmt.Errorf("chdir /: %w", err)
	}
	if err := makeWorkdir(cfg.Workdir); err != nil {
		return -1, err
	}
	if err := <-names; err != nil {
		return -1, err
	}
	return upper, nil
}

// setNames gives the sandbox's UTS and network namespaces what they hold: the host name,
// and loopback up (and, for network false, checks that lo is all there is). Neither
// touches the mounts, so it goes on beside them.
func setNames(cfg *bootConfig) <-chan error {
	done := make(chan error, 1)
	go func() {
		err := linux.SetHostname(Hostname)
		if err == nil {
			err = loopbackUp()
		}
		if err == nil && cfg.LoopbackOnly {
			err = checkLoopbackOnly()
		}
		done <- err
	}()
	return done
}

// upperFS makes the session's upper filesystem (a size-limited tmpfs that is mounted
// nowhere, only held by descriptors) and applies the snapshot to it, or takes a copy of
// the one the server holds (given, a descriptor that came with the boot); then makes sure every overlay's upper and work
// directories are there.
func upperFS(cfg *bootConfig, snapshot []byte, given int) (int, error) {
	var upper int
	if cfg.NewUpper > 0 {
		fs, err := linux.OpenFS("tmpfs")
		if err != nil {
			return -1, err
		}
		defer fs.Close()
		if err := fs.SetString("size", strconv.FormatInt(cfg.NewUpper, 10)); err != nil {
			return -1, err
		}
		if err := fs.SetString("mode", "0755"); err != nil {
			return -1, err
		}
		if err := fs.Create(); err != nil {
			return -1, err
		}
		if upper, err = fs.Mount(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV); err != nil {
			return -1, err
		}
		for _, d := range []string{"upper", "work"} {
			if err := unix.Mkdirat(upper, d, 0o755); err != nil {
				return -1, fmt.Errorf("upper filesystem: mkdir %s: %w", d, err)
			}
		}
		if len(snapshot) > 0 {
			if err := executor.ApplyLayerXattrPrefix(bytes.NewReader(snapshot), linux.FdPath(upper)+"/upper", "user."); err != nil {
				return -1, fmt.Errorf("applying the snapshot: %w", err)
			}
		}
	} else {
		if given < 0 {
			return -1, errors.New("the server sent no upper filesystem")
		}
		var err error
		if upper, err = linux.CloneTree(given, "", false); err != nil {
			return -1, fmt.Errorf("the session's upper filesystem: %w", err)
		}
		unix.Close(given)
	}
	for _, o := range cfg.Overlays {
		for _, d := range []string{"upper" + strings.TrimSuffix(o.Target, "/"), "work/" + o.Sub} {
			err := unix.Mkdirat(upper, d, 0o755)
			if err != nil && err != unix.EEXIST {
				return -1, fmt.Errorf("upper filesystem: mkdir %s: %w", d, err)
			}
			var st unix.Stat_t
			if err := unix.Fstatat(upper, d, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return -1, fmt.Errorf("upper filesystem: %s is not a directory (did the snapshot remove %s?)", d, o.Target)
			}
		}
	}
	return upper, nil
}

// Parts of /proc that would reach the host from a real root: hidden (files get /dev/null
// bound over them, directories an empty read-only tmpfs) or read-only, as Docker does.
var (
	procNull  = []string{"kcore", "keys", "timer_list", "sched_debug", "latency_stats", "sysrq-trigger"}
	procEmpty = []string{"acpi", "scsi"}
	procRO    = []string{"bus", "fs", "irq", "sys"}
)

// mountProc mounts the PID namespace's own /proc; with mask (a real root inside), the
// parts that are the host's are hidden or made read-only. Rootless, the user namespace
// already denies them.
func mountProc(root int, mask bool) error {
	const procFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	p, err := linux.MkdirAllInRoot(root, "/proc", 0o555)
	if err != nil {
		return err
	}
	defer unix.Close(p)
	if err := linux.Mount("proc", linux.FdPath(p), "proc", procFlags, ""); err != nil {
		return err
	}
	if !mask {
		return nil
	}
	open := func(name string, flags int) (int, bool) {
		fd, err := linux.OpenInRoot(root, "/proc/"+name, unix.O_PATH|flags)
		return fd, err == nil
	}
	for _, name := range procNull {
		if fd, ok := open(name, 0); ok {
			err := linux.Mount("/dev/null", linux.FdPath(fd), "", unix.MS_BIND, "")
			unix.Close(fd)
			if err != nil {
				return err
			}
		}
	}
	for _, name := range procEmpty {
		if fd, ok := open(name, unix.O_DIRECTORY); ok {
			err := linux.Mount("tmpfs", linux.FdPath(fd), "tmpfs", unix.MS_RDONLY|procFlags, "size=4k,mode=0555")
			unix.Close(fd)
			if err != nil {
				return err
			}
		}
	}
	for _, name := range procRO {
		if fd, ok := open(name, unix.O_DIRECTORY); ok {
			target := linux.FdPath(fd)
			err := linux.Mount(target, target, "", unix.MS_BIND|unix.MS_REC, "")
			unix.Close(fd)
			if err != nil {
				return err
			}
			fd, ok := open(name, unix.O_DIRECTORY)
			if !ok {
				return fmt.Errorf("/proc/%s vanished", name)
			}
			err = linux.Mount("", linux.FdPath(fd), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|procFlags, "")
			unix.Close(fd)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// mountSys mounts a read-only sysfs of the sandbox's network namespace (so
// /sys/class/net lists its interfaces), with /sys/firmware hidden.
func mountSys(root int) error {
	s, err := linux.MkdirAllInRoot(root, "/sys", 0o555)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	if err := linux.Mount("sysfs", linux.FdPath(s), "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if fd, err := linux.OpenInRoot(root, "/sys/firmware", unix.O_PATH|unix.O_DIRECTORY); err == nil {
		defer unix.Close(fd)
		return linux.Mount("tmpfs", linux.FdPath(fd), "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0555")
	}
	return nil
}

// devices are the host's device nodes a sandbox's /dev has (bound, not made: a user
// namespace cannot make them).
var devices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// mountDev makes a minimal /dev: a small tmpfs (nodev: only the bound devices work) with
// the devices above, its own devpts instance, /dev/shm and the usual links.
func mountDev(root int, rootless bool) error {
	d, err := linux.MkdirAllInRoot(root, "/dev", 0o755)
	if err != nil {
		return err
	}
	defer unix.Close(d)
	if err := linux.Mount("tmpfs", linux.FdPath(d), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=65536k"); err != nil {
		return err
	}
	dev, err := linux.OpenInRoot(root, "/dev", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(dev)
	for _, name := range devices {
		fd, err := unix.Openat(dev, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o666)
		if err != nil {
			return fmt.Errorf("/dev/%s: %w", name, err)
		}
		err = linux.Mount("/dev/"+name, linux.FdPath(fd), "", unix.MS_BIND, "")
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	for _, dir := range []struct {
		name string
		mode uint32
	}{{"pts", 0o755}, {"shm", 0o1777}} {
		if err := unix.Mkdirat(dev, dir.name, 0o700); err != nil {
			return fmt.Errorf("/dev/%s: %w", dir.name, err)
		}
		if err := unix.Fchmodat(dev, dir.name, dir.mode, 0); err != nil {
			return fmt.Errorf("/dev/%s: %w", dir.name, err)
		}
	}
	pts, err := linux.OpenInRoot(root, "/dev/pts", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(pts)
	ptsOpts := "newinstance,ptmxmode=0666,mode=0620"
	if !rootless {
		ptsOpts += ",gid=5" // tty; a user namespace maps no such group
	}
	if err := linux.Mount("devpts", linux.FdPath(pts), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, ptsOpts); err != nil {
		return err
	}
	for _, l := range [][2]string{{"ptmx", "pts/ptmx"}, {"fd", "/proc/self/fd"}, {"stdin", "/proc/self/fd/0"}, {"stdout", "/proc/self/fd/1"}, {"stderr", "/proc/self/fd/2"}} {
		if err := unix.Symlinkat(l[1], dev, l[0]); err != nil {
			return fmt.Errorf("/dev/%s: %w", l[0], err)
		}
	}
	return nil
}

// mountTree binds a tree's host directory (and the mounts below it) at its guest path,
// making the mount point and its parents as needed, resolved inside the new root so no
// symlink can place it elsewhere. It is nosuid and nodev, and read-only for ro, all set
// before it is attached.
func mountTree(root, source int, t treeSpec) error {
	dst, err := linux.MkdirAllInRoot(root, t.Target, 0o755)
	if err != nil {
		return fmt.Errorf("the mount point: %w", err)
	}
	defer unix.Close(dst)
	clone, err := linux.CloneTree(source, "", true)
	if err != nil {
		return err
	}
	defer unix.Close(clone)
	attrs := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if t.ReadOnly {
		attrs |= unix.MOUNT_ATTR_RDONLY
	}
	if err := linux.SetMountAttr(clone, t.Source, attrs, 0, true); err != nil {
		return err
	}
	return linux.MoveMount(clone, dst, ".") // "." of the mount point itself: move_mount does not follow a magic link
}

// loopbackUp brings lo up in the sandbox's network namespace: with nothing else there, it
// is all a network:false session has. A new namespace's loopback is always interface 1
// (LOOPBACK_IFINDEX), so one netlink request does it.
func loopbackUp() error {
	lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1, Name: "lo"}}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("netlink: lo up: %w", err)
	}
	return nil
}

// serveConfined drops every capability but defaultCaps and sets no_new_privs for the
// whole process, then serves. Capabilities belong to threads: where the Go runtime owns
// every thread (no cgo) one call reaches them all (and starts, made as init started, holds
// the bounding set commands start with); otherwise the calling thread is confined and
// executes this program again, so every thread of the serving stage starts confined.
func serveConfined(log *slog.Logger, conn *net.UnixConn, s2 stage2, starts *starter) error {
	// The thread commands start from confines its bounding set with the capabilities it
	// was born with (its last step writes its sets back as it read them): it must be done
	// before every thread's sets shrink, or that write-back is refused.
	if err := starts.wait(); err != nil {
		return err
	}
	err := linux.LimitProcessCaps(defaultCaps)
	if err == nil {
		return serve(log, conn, s2, starts)
	}
	if !errors.Is(err, linux.ErrThreadsUnsupported) {
		return fmt.Errorf("sandbox init: %w", err)
	}
	runtime.LockOSThread() // never unlocked: this thread execs or the process exits
	if err := linux.LimitThreadCaps(defaultCaps); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	if err := linux.SetNoNewPrivs(); err != nil {
		return fmt.Errorf("sandbox init: %w", err)
	}
	for _, fd := range []int{3, 4, s2.Upper} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			return fmt.Errorf("sandbox init: keeping fd %d: %w", fd, err)
		}
	}
	b, err := json.Marshal(s2)
	if err != nil {
		return err
	}
	env := []string{stage2Env + "=" + string(b), "VIRTX_LOG=" + os.Getenv("VIRTX_LOG")}
	err = execStage2([]string{"virtx", InitCommand, "serve"}, env) // image_linux.go
	return fmt.Errorf("sandbox init: execve /proc/self/exe: %w", err)
}

// serveStage2 is the serving stage after serveConfined's execve.
func serveStage2(log *slog.Logger) error {
	if os.Getpid() != 1 {
		return errors.New("__sandbox-init serve runs only as the PID 1 of a sandbox")
	}
	var s2 stage2
	if err := json.Unmarshal([]byte(os.Getenv(stage2Env)), &s2); err != nil {
		return fmt.Errorf("sandbox init: %s: %w", stage2Env, err)
	}
	os.Unsetenv(stage2Env)
	closeLoader() // an image's root: what the host's loader needed (image_linux.go)
	log.Debug("serving stage started")
	for _, fd := range []int{3, 4, s2.Upper} {
		unix.CloseOnExec(fd)
	}
	ignoreSignals(log)
	return serve(log, os.NewFile(3, "relay"), s2, newStarter())
}

// serve is the session's executor, as PID 1: it reaps what is orphaned to it, ignores
// the signals a command may send it, and answers the relay until the server closes it.
// Its memory and descriptors are out of the commands' reach (not dumpable, and they hold
// no CAP_SYS_PTRACE).
func serve(log *slog.Logger, conn io.ReadWriter, s2 stage2, starts *starter) error {
	if err := linux.SetDumpable(false); err != nil {
		return err
	}
	go prewarmThreads(initThreads, prewarmAfter)
	if err := starts.wait(); err != nil {
		return err
	}
	ex, err := executor.New(executor.Config{Env: s2.Env, ReadOnly: s2.ReadOnly, Subreaper: true, StartOn: starts.start})
	if err != nil {
		return err
	}
	upperDir := path.Join(linux.FdPath(s2.Upper), "upper")
	snapshot := func(ctx context.Context) ([]byte, error) {
		var buf bytes.Buffer
		if err := executor.WriteLayer(&buf, upperDir); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	}
	if dial, err := net.FileConn(os.NewFile(4, "dial")); err == nil {
		go dialService(log, dial.(*net.UnixConn))
	} else {
		log.Warn("no port dialing", "err", err)
	}
	// Between requests, init holds little more than its heap.
	trim := linux.NewIdleTrimmer(linux.IdleTrimAfter)
	defer trim.Stop()
	err = relay.Serve(context.Background(), struct {
		io.Reader
		io.Writer
	}{trim.Reader(conn), conn}, ex, snapshot)
	ex.KillAll()
	if err != nil {
		log.Debug("relay ended", "err", err)
	}
	os.Exit(0) // PID 1 leaving ends the PID namespace: the kernel kills what is left
	return nil
}

// ignoreSignals makes PID 1 ignore what a command may send it: the kernel delivers to a
// PID namespace's init, from inside, only the signals it handles, and the Go runtime
// handles SIGTERM and the like by exiting. Here they are received and dropped.
func ignoreSignals(log *slog.Logger) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	go func() {
		for s := range sigs {
			log.Debug("ignored a signal", "signal", s)
		}
	}()
}

// starter is the thread every command is started from (executor.Config.StartOn): locked
// to its goroutine for the life of init, with its bounding set confined to defaultCaps
// (a bounding set is a thread's own, and a child starts with the forking thread's; the
// thread's own effective and permitted sets go with the rest of the process's, in
// serveConfined). It is made as init starts, so that the thread's creation and its
// thirty-odd prctl calls happen while init builds the root filesystem rather than after,
// and so that the relay's goroutine need not be locked to it: a locked goroutine hands
// its thread over and back at every blocking step (reading the next request, waiting for
// the command, its pipes), where one start handed over is one round trip.
type starter struct {
	starts chan func()
	ready  chan error // one value: whether the thread is confined
	err    error
	once   sync.Once
}

func newStarter() *starter {
	s := &starter{starts: make(chan func()), ready: make(chan error, 1)}
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives as long as init
		if err := linux.LimitThreadCaps(defaultCaps); err != nil {
			s.ready <- fmt.Errorf("sandbox init: confining the thread commands start from: %w", err)
			return
		}
		s.ready <- nil
		for f := range s.starts {
			f()
		}
	}()
	return s
}

// wait returns once the thread is confined, or why it could not be.
func (s *starter) wait() error {
	s.once.Do(func() { s.err = <-s.ready })
	return s.err
}

// start runs a command's start on the thread.
func (s *starter) start(f func() error) error {
	if err := s.wait(); err != nil {
		return err
	}
	done := make(chan error, 1)
	s.starts <- func() { done <- f() }
	return <-done
}

// dialTimeout bounds one connection attempt to a port inside the sandbox.
const dialTimeout = 10 * time.Second

// dialService answers the server's DialPort: each request is a port (2 bytes, big
// endian); each answer is a 0 byte with the connected socket attached, or a 1 byte and
// why not. It connects to 127.0.0.1, or to ::1 when nothing listens on the former.
func dialService(log *slog.Logger, c *net.UnixConn) {
	buf := make([]byte, 16)
	for {
		n, err := c.Read(buf)
		if err != nil || n == 0 {
			return
		}
		if n != 2 {
			continue
		}
		port := strconv.Itoa(int(binary.BigEndian.Uint16(buf)))
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), dialTimeout)
		if err != nil && errors.Is(err, unix.ECONNREFUSED) {
			if c6, err6 := net.DialTimeout("tcp", net.JoinHostPort("::1", port), dialTimeout); err6 == nil {
				conn, err = c6, nil
			}
		}
		if err != nil {
			msg := err.Error()
			if len(msg) > 400 {
				msg = msg[:400]
			}
			if _, err := c.Write(append([]byte{1}, msg...)); err != nil {
				return
			}
			continue
		}
		f, err := conn.(*net.TCPConn).File()
		conn.Close()
		if err != nil {
			c.Write(append([]byte{1}, err.Error()...))
			continue
		}
		err = linux.SendFds(c, []byte{0}, int(f.Fd()))
		f.Close()
		if err != nil {
			log.Debug("dial service", "err", err)
			return
		}
	}
}

package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/linux"
	"virtx.dev/virtx/internal/linux/cgroup"
	"virtx.dev/virtx/internal/relay"
)

// bootTimeout bounds how long init may take to answer a boot.
const bootTimeout = 30 * time.Second

// Available says whether this host can run sandboxes, from what is cheap to look at
// (it is asked by `virtx serve --backend auto` on every start), and if not how to fix it.
func Available() error {
	for _, ns := range []string{"mnt", "pid", "uts", "ipc", "net", "cgroup"} {
		if _, err := os.Stat("/proc/self/ns/" + ns); err != nil {
			return fmt.Errorf("this kernel has no %s namespaces (/proc/self/ns/%s): %v", ns, ns, err)
		}
	}
	if os.Geteuid() == 0 {
		caps, err := linux.ThreadCaps()
		if err != nil {
			return err
		}
		if caps&(1<<unix.CAP_SYS_ADMIN) == 0 {
			return errors.New("running as root without CAP_SYS_ADMIN (an unprivileged container?): run virtx with CAP_SYS_ADMIN, or as an ordinary user where user namespaces are enabled")
		}
	} else {
		if v := readInt("/proc/sys/user/max_user_namespaces"); v == 0 {
			return errors.New("user namespaces are disabled (user.max_user_namespaces = 0): sysctl -w user.max_user_namespaces=15000, or run virtx as root")
		}
		if v := readInt("/proc/sys/kernel/unprivileged_userns_clone"); v == 0 {
			return errors.New("unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone = 0): sysctl -w kernel.unprivileged_userns_clone=1, or run virtx as root")
		}
		if v := readInt("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); v == 1 {
			return errors.New("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns = 1): give virtx an AppArmor profile that allows userns, or run it as root")
		}
	}
	if !hasOverlay() {
		return errors.New("the kernel has no overlay filesystem loaded: modprobe overlay (Debian: it ships with the kernel)")
	}
	return nil
}

// readInt reads a number from a /proc file; -1 when there is none.
func readInt(p string) int {
	b, err := os.ReadFile(p)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

func hasOverlay() bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err == nil && bytes.Contains(b, []byte("\toverlay\n")) {
		return true
	}
	if _, err := os.Stat("/sys/module/overlay"); err == nil {
		return true
	}
	// Not loaded yet: root's first mount loads it.
	return os.Geteuid() == 0
}

// memTotal is the host's physical memory in bytes (0 if unknown).
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// diskBytes is the size of a session's upper filesystem, a tmpfs: memory, charged to
// whoever writes it. It may be at most half the host's memory: a disk_gib over that is
// refused, and left out it is DefaultDiskGiB or half the memory, whichever is less (a
// tmpfs takes memory only for what is written, but a ceiling the host cannot hold is no
// ceiling).
func diskBytes(spec *backend.Spec) (int64, error) {
	limit := memTotal() / 2
	if spec.DiskGiB == 0 {
		size := int64(DefaultDiskGiB) << 30
		if limit > 0 && size > limit {
			size = limit
		}
		return size, nil
	}
	if spec.DiskGiB > 1<<20 || (limit > 0 && int64(spec.DiskGiB)<<30 > limit) {
		return 0, fmt.Errorf("%w: disk_gib %d: a sandbox keeps the session's writes on tmpfs, in memory, and this host holds at most %d GiB that way (half its memory); ask for at most that", backend.ErrUnsupportedMachine, spec.DiskGiB, limit>>30)
	}
	return int64(spec.DiskGiB) << 30, nil
}

// image returns the prepared host image, preparing it on the first boot of this process
// (or taking what prespawn prepared).
func (b *Backend) image() (*hostImage, error) {
	if b.img != nil {
		return b.img, nil
	}
	if b.imgEarly != nil {
		r := <-b.imgEarly
		b.imgEarly = nil
		if r.err == nil {
			b.img = r.img
			return b.img, nil
		}
	}
	img, err := prepareHostImage(b.cacheDir)
	if err != nil {
		return nil, err
	}
	b.img = img
	return img, nil
}

// Boot makes the namespaces, starts init in them and waits until it answers that the
// root filesystem is in place.
func (b *Backend) Boot(ctx context.Context, spec *backend.Spec) (backend.Machine, error) {
	if _, err := b.Admit(ctx, spec); err != nil {
		return nil, err
	}
	disk, _ := diskBytes(spec)
	ms, _ := shape(spec)
	b.mu.Lock()
	defer b.mu.Unlock()
	t0 := time.Now()
	img, err := b.rootImage(spec) // the host image, or spec's (image_linux.go)
	if err != nil {
		return nil, fmt.Errorf("%w: the host image: %v", backend.ErrBootFailed, err)
	}
	if b.state == nil || b.state.spec != spec {
		b.state.release() // a new init: the last session's writes go
		b.releaseImages(spec)
		b.state = &sessionState{spec: spec}
	}
	st := b.state

	cfg := bootConfig{Overlays: img.overlays, Env: defaultEnv, Rootless: b.rootless, Devices: ms.gpu}
	b.imageEnv(spec, &cfg) // an image's own environment and working directory
	for i, m := range spec.Mounts {
		src, err := treeSource(i, m)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", backend.ErrMountFailed, err)
		}
		g := path.Clean(m.GuestPath)
		cfg.Trees = append(cfg.Trees, treeSpec{N: i + 1, URL: m.URL, Source: src, Target: g, ReadOnly: m.ReadOnly})
		if m.ReadOnly {
			cfg.ReadOnly = append(cfg.ReadOnly, g)
		}
	}
	var upper *os.File
	if st.upper == nil {
		cfg.NewUpper = disk
		cfg.Snapshot = int64(len(spec.Snapshot))
	} else {
		upper = st.upper.(*os.File)
	}

	t1 := time.Now()
	m := b.takeSpareFor(spec.Network)
	if m == nil {
		if m, err = b.spawnIn(ms); err != nil {
			return nil, err
		}
	}
	// Before init is told to go: its cgroup, if the init spawned ahead is not in one of
	// this shape (everything it starts is born inside), and its network (the first command
	// finds it up, and resolv.conf naming its resolver).
	t2 := time.Now()
	if err := m.confine(ctx, ms, spec.Network, &cfg); err != nil {
		m.Shutdown(ctx)
		return nil, err
	}
	t3 := time.Now()
	if cfg.Snapshot > 0 {
		if err := m.joined(); err != nil { // the snapshot's pages are the session's
			m.Shutdown(ctx)
			return nil, err
		}
	}
	newUpper, err := m.boot(ctx, &cfg, spec.Snapshot, upper)
	if err != nil {
		return nil, err
	}
	err = m.joined()
	if err == nil {
		err = m.netUp(ctx)
	}
	if m.group != nil {
		waitReaper() // started with the backend or after init's spawn: there before the session runs anything
	}
	if err != nil {
		m.Shutdown(ctx)
		if newUpper != nil {
			newUpper.Close()
		}
		return nil, err
	}
	b.log.Debug("sandbox up", "pid", m.pid, "image", t1.Sub(t0), "spawn", t2.Sub(t1), "cgroup+network", t3.Sub(t2), "boot", time.Since(t3))
	if newUpper != nil {
		st.upper = newUpper
	}
	return m, nil
}

// spawnIn makes the cgroup of machine shape ms (none when ms.none) and spawns an init
// born inside it.
func (b *Backend) spawnIn(ms machineShape) (*machine, error) {
	g, err := newGroup(ms)
	if err != nil {
		return nil, err
	}
	m, err := b.spawn(g)
	if err != nil {
		if g != nil {
			if derr := g.Destroy(); derr != nil {
				slog.Warn("sandbox: removing the cgroup of an init that did not start", "err", derr)
			}
		}
		return nil, err
	}
	if g != nil {
		m.group, m.limits = g, ms.limits
	}
	return m, nil
}

// spawn starts a sandbox's init in new namespaces: PID 1 of a new PID namespace, with a
// mount, UTS, IPC, cgroup and network namespace of its own, and a user namespace mapping
// root to the server's user when the server is not root. It dies with the server (a
// parent-death signal, and a killed PID 1 takes its namespace with it). Init waits for
// its boot on fd 3, so one spawned early serves whatever boot comes. With g, init is born
// in that cgroup (cgroup.Group.StartProcess): it never runs outside it, and it is never
// moved between cgroups (a move waits for an RCU grace period).
func (b *Backend) spawn(g *cgroup.Group) (*machine, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: socketpair: %v", backend.ErrBootFailed, err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "relay"), os.NewFile(uintptr(fds[1]), "relay-init")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("%w: relay socket: %v", backend.ErrBootFailed, err)
	}
	conn := fc.(*net.UnixConn)
	dial, theirDial, err := dialPair()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	defer theirDial.Close()

	attr := &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWCGROUP | unix.CLONE_NEWNET,
		Setsid:     true, // no controlling terminal: nothing inside reaches one outside
		Pdeathsig:  unix.SIGKILL,
	}
	if b.rootless {
		attr.Cloneflags |= unix.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
	var cmd *exec.Cmd
	start := func(attr *syscall.SysProcAttr) (int, error) {
		cmd = &exec.Cmd{
			Path: b.exe,
			Args: []string{"virtx", InitCommand},
			Env:  []string{"VIRTX_LOG=" + os.Getenv("VIRTX_LOG")},
			Dir:  "/",
			// init's logs join the server's; stdout is the protocol's, never init's.
			Stderr:      os.Stderr,
			ExtraFiles:  []*os.File{theirs, theirDial}, // fds 3 and 4
			SysProcAttr: attr,
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		return cmd.Process.Pid, nil
	}
	err = onForkThread(func() error {
		if g == nil {
			_, err := start(attr)
			return err
		}
		_, err := g.StartProcess(attr, start)
		return err
	})
	if err != nil {
		if cmd != nil && cmd.Process != nil {
			// Started, but not in its cgroup: killed already (StartProcess), reaped here.
			cmd.Process.Kill()
			cmd.Wait()
		}
		conn.Close()
		dial.Close()
		return nil, fmt.Errorf("%w: starting the sandbox's init (%s): %v", backend.ErrBootFailed, b.exe, err)
	}
	m := &machine{conn: conn, dial: dial, cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		m.waitErr = cmd.Wait()
		close(m.exited)
	}()
	return m, nil
}

// boot sends init its boot (with the session's upper filesystem when there is one) and
// waits for its answer: the relay starts once init says the root filesystem is in place.
// It returns the new upper filesystem init made, if it made one.
func (m *machine) boot(ctx context.Context, cfg *bootConfig, snapshot []byte, upper *os.File) (*os.File, error) {
	fail := func(kind error, format string, args ...any) (*os.File, error) {
		m.Shutdown(context.Background())
		return nil, fmt.Errorf("%w: "+format, append([]any{kind}, args...)...)
	}
	deadline := time.Now().Add(bootTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	m.conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { m.conn.SetDeadline(time.Now()) })
	defer stop()
	frame, err := appendFrame(cfg)
	if err != nil {
		return fail(backend.ErrBootFailed, "%v", err)
	}
	var fds []int
	if upper != nil {
		fds = []int{int(upper.Fd())}
	}
	err = linux.SendFds(m.conn, frame, fds...)
	if err == nil && cfg.Snapshot > 0 {
		_, err = m.conn.Write(snapshot)
	}
	if err != nil {
		return fail(backend.ErrBootFailed, "sending the boot to init: %v%s", err, m.exitNote())
	}
	var status bootStatus
	got, err := recvFrame(m.conn, &status, 1)
	m.conn.SetDeadline(time.Time{})
	if err != nil {
		closeFds(got)
		return fail(backend.ErrBootFailed, "init did not answer: %v%s", err, m.exitNote())
	}
	var newUpper *os.File
	if len(got) > 0 {
		newUpper = os.NewFile(uintptr(got[0]), "upper")
	}
	if status.Err != "" {
		if newUpper != nil {
			newUpper.Close()
		}
		if status.Mount {
			return fail(backend.ErrMountFailed, "%s", status.Err)
		}
		return fail(backend.ErrBootFailed, "%s", status.Err)
	}
	if cfg.NewUpper > 0 && newUpper == nil {
		return fail(backend.ErrBootFailed, "init made the session's upper filesystem but did not hand it over")
	}
	m.Client = relay.NewClient(m.conn)
	return newUpper, nil
}

// The parent-death signal is sent when the *thread* that forked a process ends, and the
// Go runtime ends a thread whose goroutine exits while locked to it. Every sandbox is
// therefore started from one goroutine locked to its thread for the life of the process,
// so no sandbox is killed because an unrelated thread went away. (That thread also visits
// each session's v1 cgroups for the moment it forks the session's init: see
// cgroup.Group.StartProcess.)
var (
	forkOnce sync.Once
	forkReqs chan func()
)

// onForkThread runs f, which starts a process, on the fork thread.
func onForkThread(f func() error) error {
	forkOnce.Do(func() {
		forkReqs = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked
			// Sessions never inherit a real-time policy from a server run under one (chrt):
			// a sandbox at SCHED_FIFO could starve the host, and on a v1 host with RT group
			// scheduling a real-time task cannot even join a cpu cgroup (rt_runtime_us 0).
			if a, err := unix.SchedGetAttr(0, 0); err == nil && (a.Policy == unix.SCHED_FIFO || a.Policy == unix.SCHED_RR) {
				if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL}, 0); err != nil {
					slog.Warn("sandbox: the fork thread keeps the server's real-time policy", "err", err)
				}
			}
			for f := range forkReqs {
				f()
			}
		}()
	})
	done := make(chan error, 1)
	forkReqs <- func() { done <- f() }
	return <-done
}

// dialPair is the socketpair for dialing ports (a packet socket: one request, one answer
// with the descriptor).
func dialPair() (*net.UnixConn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "dial")
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("dial socket: %w", err)
	}
	return fc.(*net.UnixConn), os.NewFile(uintptr(fds[1]), "dial-init"), nil
}

// platform is the Linux part of a Backend: work started ahead of the first boot
// (WithPrespawn), each a result to wait for.
type platform struct {
	spare    chan *machine   // an init spawned ahead (nil when it could not be)
	imgEarly chan imageReady // the host image, prepared ahead
	netHint  chan bool       // the first init's network, for the init spawned ahead
}

type imageReady struct {
	img *hostImage
	err error
}

// prespawn starts, in the background, what the first boot will need: an init (its process
// start overlaps with the server's own and with the client's first calls) and the host
// image's check.
func (b *Backend) prespawn() {
	b.spare = make(chan *machine, 1)
	b.netHint = make(chan bool, 1)
	b.imgEarly = make(chan imageReady, 1)
	go func() {
		// Its cgroup, as a session that says nothing gets it, first: init is born inside.
		// Failing that, init is spawned without, and Boot makes the group or refuses.
		t0 := time.Now()
		g, lim := b.preGroup()
		t1 := time.Now()
		m, err := b.spawn(g)
		b.log.Debug("init spawned ahead", "cgroup", t1.Sub(t0), "spawn", time.Since(t1), "err", err)
		// What a SIGKILLed server left, and this server's reaper: after the spawn, so
		// that neither competes with it for the CPU (Boot waits for the reaper).
		go reapStaleGroups()
		if err != nil {
			if g != nil {
				g.Destroy()
			}
		} else {
			if g != nil {
				m.group, m.limits = g, lim
			}
			// Its network, once the first init says it wants one.
			m.ready = make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			m.cancelPre = cancel
			go func() {
				m.preconfine(ctx, b.netHint)
				close(m.ready)
			}()
		}
		b.spare <- m
	}()
	go func() {
		img, err := prepareHostImage(b.cacheDir)
		b.imgEarly <- imageReady{img, err}
	}()
}

// takeSpare returns the init spawned ahead if there is one still waiting, else nil.
func (b *Backend) takeSpare() *machine {
	if b.spare == nil {
		return nil
	}
	m := <-b.spare
	b.spare = nil
	if m == nil {
		return nil
	}
	if m.ready != nil {
		<-m.ready
	}
	select {
	case <-m.exited:
		return nil
	default:
		return m
	}
}

func (b *Backend) closePlatform() {
	if m := b.takeSpare(); m != nil {
		m.Shutdown(context.Background())
	}
	if b.imgEarly != nil {
		if r := <-b.imgEarly; r.img != nil {
			r.img.close()
		}
		b.imgEarly = nil
	}
}

// machine is one booted sandbox: the relay to its init, and init itself.
type machine struct {
	*relay.Client
	conn      *net.UnixConn
	dial      *net.UnixConn // to init's dialService
	dialMu    sync.Mutex
	cmd       *exec.Cmd
	pid       int
	net       io.Closer
	group     *cgroup.Group // nil: no limits (NoLimitsEnv)
	limits    cgroup.Limits // what group enforces
	dns       []string      // the resolvers net relays to
	netDone   chan struct{} // closed when a network start in the background has ended (startNet)
	netErr    error         // why it failed
	cancelNet func()        // cancels it
	added     chan struct{} // closed when init, spawned ahead, has moved to group (join)
	addErr    error
	ready     chan struct{} // closed when preconfine is done (an init spawned ahead)
	cancelPre func()        // cancels preconfine's network start
	exited    chan struct{}
	waitErr   error
	once      sync.Once
}

// exitNote says how init ended, if it has, for a boot failure's message.
func (m *machine) exitNote() string {
	select {
	case <-m.exited:
		return fmt.Sprintf(" (init: %v)", m.waitErr)
	case <-time.After(50 * time.Millisecond):
		return ""
	}
}

// Shutdown ends the sandbox: the relay is closed (a call in flight ends as stopped), PID 1
// is killed — the kernel then kills everything else in its PID namespace — and waited
// for, and its namespaces and mounts go with it. The session's upper filesystem stays with
// the Backend for the next boot.
func (m *machine) Shutdown(ctx context.Context) error {
	m.once.Do(func() {
		if m.Client != nil {
			m.Client.Close()
		} else {
			m.conn.Close()
		}
		m.cmd.Process.Kill()
		<-m.exited
		m.dial.Close()
		m.joined()
		m.stopNet()
		if m.net != nil {
			m.net.Close() // the image builder's (startNetwork)
		}
		if m.group != nil {
			if err := m.group.Destroy(); err != nil {
				slog.Warn("sandbox: removing the session's cgroup", "err", err)
			}
		}
	})
	return nil
}

// DialPort connects to a TCP port on the sandbox's loopback. The socket is made inside
// the sandbox's network namespace by its init (dialService), which hands the connected
// descriptor back: a server without privileges cannot enter a namespace its user
// namespace owns (setns needs CAP_SYS_ADMIN where the caller is too), so this one way
// serves root and rootless alike.
func (m *machine) DialPort(ctx context.Context, port uint16) (net.Conn, error) {
	m.dialMu.Lock()
	defer m.dialMu.Unlock()
	deadline := time.Now().Add(dialTimeout + time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	m.dial.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { m.dial.SetDeadline(time.Now()) })
	defer stop()
	if _, err := m.dial.Write(binary.BigEndian.AppendUint16(nil, port)); err != nil {
		return nil, fmt.Errorf("%w: asking the sandbox to dial port %d: %v", backend.ErrSessionStopped, port, err)
	}
	buf := make([]byte, 512)
	n, fds, err := linux.RecvFds(m.dial, buf, 1)
	if err != nil {
		return nil, fmt.Errorf("%w: dialing port %d in the sandbox: %v", backend.ErrSessionStopped, port, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: dialing port %d in the sandbox: init went away", backend.ErrSessionStopped, port)
	}
	if buf[0] != 0 || len(fds) == 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("port %d in the sandbox: %s", port, buf[1:n])
	}
	f := os.NewFile(uintptr(fds[0]), "port")
	defer f.Close()
	return net.FileConn(f)
}

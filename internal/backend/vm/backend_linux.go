package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/internal/guest"
	"virtx.dev/virtx/internal/network"
	"virtx.dev/virtx/internal/relay"
	"virtx.dev/virtx/protocol"
)

// Backend boots a QEMU microVM per session.
type Backend struct {
	log      *slog.Logger
	cacheDir string
	fetch    bool
	prov     provisioner
	reapOnce sync.Once

	mu       sync.Mutex
	diskSpec *backend.Spec // the session the disk belongs to
	disk     *os.File      // unlinked; nil until the first boot of that session

	imgs images

	accelOnce sync.Once
	accel     string
	accelWhy  string
}

// New makes the vm backend. cacheDir is virtx's cache directory (console.CacheDir).
func New(cacheDir string, opts ...Option) *Backend {
	b := &Backend{log: slog.New(slog.DiscardHandler), cacheDir: cacheDir, fetch: true}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Name is "vm".
func (b *Backend) Name() string { return "vm" }

// Admit refuses what a microVM cannot give, without booting anything.
func (b *Backend) Admit(ctx context.Context, spec *backend.Spec) (string, error) {
	if spec.Network {
		if err := networkAvailable(); err != nil {
			return "", err
		}
	}
	if spec.GPU != nil && *spec.GPU {
		return "", fmt.Errorf("%w: gpu true: the vm backend gives its guests no GPU device", backend.ErrUnsupportedMachine)
	}
	if n := uint64(runtime.NumCPU()); spec.VCPUs > n {
		return "", fmt.Errorf("%w: vcpus %d: this host has %d CPUs, and the vm backend does not give a guest more vCPUs than the host can run at once", backend.ErrUnsupportedMachine, spec.VCPUs, n)
	}
	if spec.MemoryMiB != 0 {
		if spec.MemoryMiB < MinMemoryMiB {
			return "", fmt.Errorf("%w: memory_mib %d: a guest needs at least %d MiB", backend.ErrUnsupportedMachine, spec.MemoryMiB, MinMemoryMiB)
		}
		if total := hostMemoryMiB(); total > 0 && spec.MemoryMiB > total {
			return "", fmt.Errorf("%w: memory_mib %d: this host has %d MiB", backend.ErrUnsupportedMachine, spec.MemoryMiB, total)
		}
	}
	if spec.DiskGiB != 0 {
		var st unix.Statfs_t
		root := runRoot(b.cacheDir)
		for ; root != "/"; root = filepath.Dir(root) {
			if unix.Statfs(root, &st) == nil {
				break
			}
		}
		if size := st.Blocks * uint64(st.Bsize) >> 30; size > 0 && spec.DiskGiB > size {
			return "", fmt.Errorf("%w: disk_gib %d: the filesystem of %s holds %d GiB in all", backend.ErrUnsupportedMachine, spec.DiskGiB, b.cacheDir, size)
		}
	}
	for i, m := range spec.Mounts {
		if _, err := treePath(i, m); err != nil {
			return "", err
		}
	}
	cwd := "/root"
	if spec.Image != nil {
		var err error
		if cwd, err = b.admitImage(ctx, spec); err != nil {
			return "", err
		}
	}
	// This init replaces the session: only its image and the booted one's stay held
	// (the booted one goes at the next boot).
	b.mu.Lock()
	booted := b.diskSpec
	b.mu.Unlock()
	b.releaseImages(spec, booted)
	return cwd, nil
}

// treePath is the host directory of a file:// tree.
func treePath(i int, m protocol.Mount) (string, error) {
	return backend.FileTree("vm", i, m)
}

func hostMemoryMiB() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return si.Totalram * uint64(si.Unit) >> 20
}

func (b *Backend) logf(msg string, args ...any) { b.log.Info(msg, args...) }

// Boot boots a VM for spec.
func (b *Backend) Boot(ctx context.Context, spec *backend.Spec) (backend.Machine, error) {
	t0 := time.Now()
	b.reapOnce.Do(func() {
		if n := reap(b.cacheDir); n > 0 {
			b.log.Info("reaped the leftovers of killed servers", "dirs", n)
		}
	})
	assets, err := b.prov.Provision(ctx, b.cacheDir, b.fetch, b.logf)
	if err != nil {
		return nil, err
	}
	var trees []shareTree
	cfg := &guest.Config{
		Port:     guest.DefaultPort,
		Network:  spec.Network,
		Disk:     true,
		Snapshot: len(spec.Snapshot) > 0,
		Hostname: "virtx",
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"HOME=/root", "USER=root", "LOGNAME=root", "LANG=C.UTF-8",
		},
	}
	var img *heldImage
	if spec.Image != nil {
		img = b.heldImage(spec)
		if img == nil { // an init admitted elsewhere: resolve it now
			if _, err := b.admitImage(ctx, spec); err != nil {
				return nil, err
			}
			img = b.heldImage(spec)
		}
		cfg.Image = true
		cfg.Env = imageEnv(img.im.Config.Env, cfg.Hostname)
		cfg.Workdir = img.im.Config.WorkingDir
	}
	mem := spec.MemoryMiB
	if mem == 0 {
		mem = DefaultMemoryMiB
	}
	cfg.PidsMax = int(max(mem, 512)) // a process per MiB: room for real work, not for a fork bomb
	if spec.Network {
		cfg.Address, cfg.Gateway = guest.GuestAddress, guest.GuestGateway
	}
	for i, m := range spec.Mounts {
		p, err := backend.TreeDir("vm", i, m)
		if err != nil {
			return nil, err
		}
		trees = append(trees, shareTree{host: p, ro: m.ReadOnly})
		cfg.Trees = append(cfg.Trees, guest.Tree{Index: i, Guest: path.Clean(m.GuestPath), ReadOnly: m.ReadOnly})
	}
	b.log.Debug("vm provisioned", "took", time.Since(t0))
	disk, err := b.diskFor(ctx, spec, assets)
	if err != nil {
		return nil, err
	}
	b.log.Debug("vm disk", "took", time.Since(t0))
	accel := b.acceleration()
	m, err := b.boot(ctx, spec, assets, cfg, trees, img, disk, accel)
	if err != nil && accel == "kvm" && errors.Is(err, errBootTimeout) {
		// KVM that cannot run this guest (a PVM-only host): say so once, use TCG.
		b.kvmBroken(err)
		m, err = b.boot(ctx, spec, assets, cfg, trees, img, disk, "tcg")
	}
	return m, err
}

// diskFor answers the session disk of spec: made (sparse, unlinked, ext4) at the first
// boot of a session and kept open across stops; a new session drops the old one.
func (b *Backend) diskFor(ctx context.Context, spec *backend.Spec, a *Assets) (*os.File, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.diskSpec == spec && b.disk != nil {
		return b.disk, nil
	}
	if b.disk != nil {
		b.disk.Close()
		b.disk = nil
	}
	b.releaseImages(spec) // a new session: the last one's image is no one's
	gib := spec.DiskGiB
	if gib == 0 {
		gib = DefaultDiskGiB
	}
	dir := runRoot(b.cacheDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	f, err := newSessionDisk(ctx, b.cacheDir, dir, a.MkfsExt4, gib)
	if err != nil {
		return nil, err
	}
	b.diskSpec, b.disk = spec, f
	return f, nil
}

var errBootTimeout = errors.New("the guest did not answer in time")

// boot starts virtiofsd and QEMU and waits for the guest's executor to answer. img is
// the session's OCI image, nil on the host image.
func (b *Backend) boot(ctx context.Context, spec *backend.Spec, a *Assets, cfg *guest.Config, trees []shareTree, img *heldImage, disk *os.File, accel string) (_ backend.Machine, err error) {
	start := time.Now()
	run, err := newRunDir(b.cacheDir)
	if err != nil {
		return nil, fmt.Errorf("%w: run dir: %v", backend.ErrBootFailed, err)
	}
	m := &machine{run: run, log: b.log, exited: make(chan struct{})}
	defer func() {
		if err != nil {
			m.teardown()
		}
	}()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", backend.ErrBootFailed, fmt.Sprintf(format, args...))
	}

	// virtiofsd, on a socket we listen on (so QEMU can connect at once), in the share's
	// own mount namespace.
	share := filepath.Join(run, "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		return nil, fail("%v", err)
	}
	fsFile, err := listenFile(filepath.Join(run, "fs.sock"))
	if err != nil {
		return nil, fail("virtiofsd socket: %v", err)
	}
	defer fsFile.Close()
	fsdLog, err := os.Create(filepath.Join(run, "virtiofsd.log"))
	if err != nil {
		return nil, fail("%v", err)
	}
	defer fsdLog.Close()
	m.fsd = virtiofsd(a.Virtiofsd, share, fsFile, fsdLog)
	cmds := []*exec.Cmd{m.fsd}
	ss := &shareSpec{dir: share, trees: trees, config: cfg}
	if cfg.Snapshot {
		ss.snapshot = spec.Snapshot
	}
	if img != nil {
		// The image itself is its erofs disk (qemuArgs); the share has only what goes
		// over it, made with the attributes of the layers' own.
		ss.image, ss.layers = true, img.im.Lowers
	}
	if err := theSpawner.inPrivateNS(func() error { return buildShare(ss) }, cmds...); err != nil {
		if strings.Contains(err.Error(), "bind ") {
			return nil, fmt.Errorf("%w: %v", backend.ErrMountFailed, err)
		}
		return nil, fail("the share: %v", err)
	}
	for _, c := range cmds {
		_ = recordPid(run, "virtiofsd", c.Process.Pid)
		go c.Wait()
	}
	b.log.Debug("vm share", "took", time.Since(start))

	// The control channel: QEMU connects to us as it starts.
	ctlLn, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(run, "ctl.sock"), Net: "unix"})
	if err != nil {
		return nil, fail("control socket: %v", err)
	}
	defer ctlLn.Close()

	args, err := b.qemuArgs(spec, a, run, accel, cfg.Image)
	if err != nil {
		return nil, err
	}
	qemuLog, err := os.Create(filepath.Join(run, "qemu.log"))
	if err != nil {
		return nil, fail("%v", err)
	}
	defer qemuLog.Close()
	m.qemu = exec.Command(a.QEMU, args...)
	m.qemu.ExtraFiles = []*os.File{disk}
	if img != nil {
		m.qemu.ExtraFiles = append(m.qemu.ExtraFiles, img.disk) // /dev/fd/4: imageDiskFD
	}
	m.qemu.Stdout, m.qemu.Stderr = qemuLog, qemuLog
	if spec.Network {
		// A network namespace of QEMU's own, where its tap meets slirp4netns's.
		m.qemu.SysProcAttr = &unix.SysProcAttr{Cloneflags: unix.CLONE_NEWNET}
	}
	if err := theSpawner.startCmd(m.qemu); err != nil {
		m.qemu = nil
		return nil, fail("starting %s: %v", a.QEMU, err)
	}
	_ = recordPid(run, "qemu", m.qemu.Process.Pid)
	go func() { m.qemu.Wait(); close(m.exited) }()
	if spec.Network {
		if m.net, err = startNetwork(ctx, m.qemu.Process.Pid); err != nil {
			return nil, fail("the guest's network: %v", err)
		}
		b.log.Debug("vm network", "took", time.Since(start))
	}

	deadline := time.Now().Add(BootTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn, err := acceptUntil(ctlLn, deadline, m.exited)
	if err != nil {
		return nil, m.bootError(err)
	}
	m.conn = conn
	if err := probe(conn, deadline, m.exited); err != nil {
		return nil, m.bootError(err)
	}
	m.Client = relay.NewClient(conn)
	b.log.Debug("vm booted", "accel", accel, "took", time.Since(start), "run", run)
	return m, nil
}

// listenFile listens on a unix socket at p and answers the listener as a file for a
// child (virtiofsd's --fd); the socket's name stays until the run dir goes.
func listenFile(p string) (*os.File, error) {
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	defer ln.Close()
	return ln.File()
}

// virtiofsd is the command of a virtiofsd serving dir on the listening socket sock
// (passed as fd 3), without extended attributes: a guest cannot set trusted.* or
// security.* attributes on a read-write tree.
func virtiofsd(bin, dir string, sock, log *os.File) *exec.Cmd {
	args := []string{"--fd=3", "-o", "source=" + dir, "-o", "cache=always",
		"-o", "sandbox=namespace", "-o", "log_level=err", "-o", "no_posix_lock", "-o", "no_flock"}
	cmd := exec.Command(bin, args...)
	cmd.ExtraFiles = []*os.File{sock}
	cmd.Stdout, cmd.Stderr = log, log
	return cmd
}

// qemuArgs is the QEMU command line for one boot.
func (b *Backend) qemuArgs(spec *backend.Spec, a *Assets, run, accel string, image bool) ([]string, error) {
	vcpus, mem := spec.VCPUs, spec.MemoryMiB
	if vcpus == 0 {
		vcpus = DefaultVCPUs
	}
	if mem == 0 {
		mem = DefaultMemoryMiB
	}
	// initcall_blacklist: kprobe trace events and the SP800-108 KDF self-test cost
	// ~150 ms of a TCG boot (initcall_debug) and no guest uses them. mitigations=off:
	// every process in the guest is the session's root, so the guest kernel guards
	// nothing between them; the host's isolation is the hypervisor's, not these. lsm:
	// AppArmor, TOMOYO and IMA/EVM have no policy in a guest and cost their init (~50 ms
	// under TCG). virtx.disk and virtx.net tell /init what to wait for before it can
	// read the config (internal/guest).
	cmdline := "console=ttyS0 quiet panic=-1 rdinit=/init tsc=reliable no_timer_check cryptomgr.notests random.trust_cpu=on" +
		" initcall_blacklist=init_kprobe_trace,crypto_kdf108_init mitigations=off lsm=landlock,yama,bpf virtx.disk"
	if spec.Network {
		cmdline += " virtx.net"
	}
	if os.Getenv("VIRTX_VM_DEBUG") != "" {
		cmdline = strings.Replace(cmdline, " quiet", "", 1) + " virtx.debug"
	}
	if extra := os.Getenv("VIRTX_VM_APPEND"); extra != "" {
		cmdline += " " + extra
	}
	if khz := hostTSCkHz(); khz > 0 {
		// lpj: the delay loop's calibration, which the boot CPU skips given the TSC's
		// rate but every other vCPU repeats (~200 ms under TCG, and it fails there:
		// "calibrate_delay_direct() failed"). loops per jiffy = TSC Hz / HZ, with
		// Debian's HZ=250; a kernel built with another HZ only gets udelay scaled.
		cmdline += " tsc_early_khz=" + strconv.Itoa(khz) + " lpj=" + strconv.Itoa(khz*1000/250)
	}
	cpu := "max"
	if accel == "kvm" {
		cpu = "host"
	}
	if c := os.Getenv("VIRTX_VM_CPU"); c != "" {
		cpu = c
	}
	args := []string{
		"-M", "microvm,acpi=on,memory-backend=mem", "-accel", accel, "-cpu", cpu,
		"-smp", strconv.FormatUint(vcpus, 10), "-m", strconv.FormatUint(mem, 10) + "M",
		"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", mem),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", a.Kernel.Vmlinux, "-initrd", a.Initramfs, "-append", cmdline,
		"-global", "virtio-mmio.force-legacy=false",
		"-chardev", "file,id=con,path=" + filepath.Join(run, "console.log"), "-serial", "chardev:con",
		"-chardev", "socket,id=fs,path=" + filepath.Join(run, "fs.sock"),
		"-device", "vhost-user-fs-device,chardev=fs,tag=" + guest.ShareTag,
		"-chardev", "socket,id=ctl,path=" + filepath.Join(run, "ctl.sock"),
		"-device", "virtio-serial-device", "-device", "virtserialport,chardev=ctl,name=" + guest.DefaultPort,
		"-drive", "file=/dev/fd/3,format=raw,if=none,id=disk,cache=unsafe,discard=unmap",
		"-device", "virtio-blk-device,drive=disk",
	}
	if image {
		// The image's erofs, read-only down to the host file QEMU opens; the guest finds
		// it by its serial (the session disk has none).
		args = append(args, "-drive", fmt.Sprintf("file=/dev/fd/%d,format=raw,if=none,readonly=on,id=image", imageDiskFD),
			"-device", "virtio-blk-device,drive=image,serial="+guest.ImageDiskSerial)
	}
	if spec.Network {
		// A tap in QEMU's own network namespace, bridged there to slirp4netns's
		// (network_linux.go).
		args = append(args, "-netdev", "tap,id=net,ifname="+qemuTap+",script=no,downscript=no",
			"-device", "virtio-net-device,netdev=net,mac="+guestMAC)
	}
	return args, nil
}

// hostTSCkHz is the host's TSC frequency in kHz as /proc/cpuinfo gives it (cpu MHz).
func hostTSCkHz() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "cpu MHz"); ok {
			v = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
			if f, err := strconv.ParseFloat(v, 64); err == nil {
				return int(f * 1000)
			}
		}
	}
	return 0
}

// acceptUntil accepts QEMU's connection to the control socket.
func acceptUntil(ln *net.UnixListener, deadline time.Time, exited <-chan struct{}) (*net.UnixConn, error) {
	for {
		if time.Now().After(deadline) {
			return nil, errBootTimeout
		}
		select {
		case <-exited:
			return nil, errors.New("QEMU exited")
		default:
		}
		ln.SetDeadline(time.Now().Add(50 * time.Millisecond))
		c, err := ln.AcceptUnix()
		if err == nil {
			return c, nil
		}
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			return nil, err
		}
	}
}

// probe sends one request the relay does not serve and waits for the answer: any
// answer says the executor is up; an error of the guest's init says why it is not.
func probe(conn *net.UnixConn, deadline time.Time, exited <-chan struct{}) error {
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-exited:
			conn.SetReadDeadline(time.Now()) // wake the read
		case <-stop:
		}
	}()
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	if err := protocol.WriteFrame(conn, protocol.AppendRequest(nil, 0, protocol.MethodVersion, nil)); err != nil {
		return err
	}
	fr := protocol.NewFrameReader(conn)
	f, err := fr.ReadFrame()
	if err != nil {
		select {
		case <-exited:
			return errors.New("QEMU exited")
		default:
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return errBootTimeout
		}
		return err
	}
	msg, err := protocol.Decode(f)
	if err != nil {
		return err
	}
	if msg.Err != nil && msg.Err.Code != protocol.CodeMethodNotFound {
		if msg.Err.Code == protocol.CodeMountFailed {
			return fmt.Errorf("%w: %s", backend.ErrMountFailed, msg.Err.Message)
		}
		return fmt.Errorf("%w: %s", backend.ErrBootFailed, msg.Err.Message)
	}
	return nil
}

// machine is one booted VM.
type machine struct {
	*relay.Client
	log    *slog.Logger
	run    string
	conn   *net.UnixConn
	qemu   *exec.Cmd
	fsd    *exec.Cmd
	exited chan struct{}
	net    *network.UserNet // slirp4netns, with network on
	once   sync.Once
}

// bootError is err with what the console and QEMU said.
func (m *machine) bootError(err error) error {
	if errors.Is(err, backend.ErrMountFailed) || errors.Is(err, backend.ErrBootFailed) {
		return err
	}
	var tail []string
	for _, f := range []string{"qemu.log", "virtiofsd.log", "console.log"} {
		b, _ := os.ReadFile(filepath.Join(m.run, f))
		if s := strings.TrimSpace(string(b)); s != "" {
			if len(s) > 1500 {
				s = "…" + s[len(s)-1500:]
			}
			tail = append(tail, f+": "+s)
		}
	}
	msg := fmt.Sprintf("%v: the VM did not come up", err)
	if len(tail) > 0 {
		msg += " (" + strings.Join(tail, "; ") + ")"
	}
	if errors.Is(err, errBootTimeout) {
		return fmt.Errorf("%w: %w: %s", backend.ErrBootFailed, errBootTimeout, msg)
	}
	return fmt.Errorf("%w: %s", backend.ErrBootFailed, msg)
}

// Exec relays a command. A guest that has not answered ExecGrace after the command's
// own timeout is taken as hung (the executor in it kills at the timeout): QEMU is
// killed by PID and the call answers BOOT_FAILED as backend.ErrMachineGone, so the
// server drops the machine and the next call boots a new one; no call waits forever on
// a guest that cannot answer.
func (m *machine) Exec(ctx context.Context, req executor.ExecRequest) (executor.ExecResult, error) {
	if req.Timeout <= 0 {
		return m.Client.Exec(ctx, req)
	}
	var hung atomic.Bool
	wd := time.AfterFunc(req.Timeout+ExecGrace, func() {
		hung.Store(true)
		m.log.Warn("vm: the guest did not answer after the command's timeout; killing QEMU", "pid", m.qemu.Process.Pid)
		m.qemu.Process.Kill()
	})
	defer wd.Stop()
	res, err := m.Client.Exec(ctx, req)
	if hung.Load() {
		// ErrMachineGone: the server drops this machine, and the next call boots anew.
		return executor.ExecResult{}, fmt.Errorf("%w: the guest did not answer %v after the command's %v timeout and was killed; the next call boots it again", backend.ErrMachineGone, ExecGrace, req.Timeout)
	}
	return res, err
}

// DialPort connects to a guest port from inside QEMU's network namespace.
func (m *machine) DialPort(ctx context.Context, port uint16) (net.Conn, error) {
	if m.net == nil {
		return nil, fmt.Errorf("%w: guest port %d: the session has no network (init with network true to reach its ports)", backend.ErrUnsupportedNetwork, port)
	}
	return dialGuest(ctx, m.qemu.Process.Pid, port)
}

// Shutdown ends the VM: the guest is told by the end of its channel (it kills
// everything, syncs its disk and powers off); QEMU is killed by PID if it has not
// exited within ShutdownGrace.
func (m *machine) Shutdown(ctx context.Context) error {
	start := time.Now()
	m.teardown()
	m.log.Debug("vm shut down", "took", time.Since(start))
	return nil
}

func (m *machine) teardown() {
	m.once.Do(func() {
		if m.Client != nil {
			m.Client.Close()
		} else if m.conn != nil {
			m.conn.Close()
		}
		if m.qemu != nil {
			select {
			case <-m.exited:
			case <-time.After(ShutdownGrace):
				m.log.Warn("the VM did not power off in time; killing QEMU", "pid", m.qemu.Process.Pid)
				m.qemu.Process.Kill()
				<-m.exited
			}
		}
		if m.net != nil {
			m.net.Close()
		}
		if m.fsd != nil && m.fsd.Process != nil {
			m.fsd.Process.Kill()
		}
		if os.Getenv("VIRTX_VM_DEBUG") == "" {
			os.RemoveAll(m.run)
		}
	})
}

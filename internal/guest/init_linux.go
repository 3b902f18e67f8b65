package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/internal/fault"
	"virtx.dev/virtx/internal/relay"
	"virtx.dev/virtx/protocol"
)

// debugf logs boot steps to the console when the kernel command line says virtx.debug.
var debugf = func(string, ...any) {}

const (
	hostDir  = "/mnt/host"
	imageDir = "/mnt/image"
	diskDir  = "/mnt/disk"
	newRoot  = "/newroot"
)

// Main is /init. It returns only on failure before serving could start; otherwise it
// ends by powering the VM off.
func Main() error {
	if os.Getpid() != 1 {
		return errors.New("guest init runs as PID 1 of a VM guest (it is /init of the vm backend's initramfs), not here")
	}
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) // when main began, for virtx.debug
	mainAt = float64(ts.Nano()) / 1e9
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "virtx-init: "+format+"\n", args...) }
	cfg, upper, err := setup(logf)
	ctx := context.Background()
	port := DefaultPort
	if cfg != nil && cfg.Port != "" {
		port = cfg.Port
	}
	rw, perr := openPort(port, 10*time.Second)
	if perr != nil {
		if err == nil {
			err = perr
		}
		logf("%v", err)
		powerOff()
	}
	if err != nil {
		logf("%v", err)
		serveFailure(rw, err)
		powerOff()
	}
	var ro []string
	for _, t := range cfg.Trees {
		if t.ReadOnly {
			ro = append(ro, t.Guest)
		}
	}
	ex, err := executor.New(executor.Config{Env: cfg.Env, ReadOnly: ro, Subreaper: true})
	if err != nil {
		serveFailure(rw, fmt.Errorf("%w: executor: %v", backend.ErrBootFailed, err))
		powerOff()
	}
	snapshot := func(ctx context.Context) ([]byte, error) {
		var buf bytes.Buffer
		if err := executor.WriteLayer(&buf, upper); err != nil {
			return nil, err
		}
		if buf.Len() > protocol.MaxPayload-1<<20 {
			return nil, fmt.Errorf("%w: the session's writes are %d bytes as a layer, more than a frame carries", backend.ErrSnapshotTooLarge, buf.Len())
		}
		return buf.Bytes(), nil
	}
	debugf("serving")
	if err := relay.Serve(ctx, rw, ex, snapshot); err != nil {
		logf("relay: %v", err)
	}
	ex.KillAll()
	powerOff()
	return nil
}

// mainAt is when Main began, in seconds since boot.
var mainAt float64

// setup does everything up to the switch of root; it answers the config and the path
// of the overlay's upper dir as seen after the switch.
func setup(logf func(string, ...any)) (*Config, string, error) {
	boot := func(format string, args ...any) error {
		return fmt.Errorf("%w: guest: %s", backend.ErrBootFailed, fmt.Sprintf(format, args...))
	}
	for _, d := range []string{"/proc", "/sys", "/dev", hostDir, imageDir, diskDir, newRoot} {
		_ = os.MkdirAll(d, 0o755)
	}
	if err := mount("proc", "/proc", "proc", 0, ""); err != nil {
		return nil, "", boot("%v", err)
	}
	if err := mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
		return nil, "", boot("%v", err)
	}
	if err := mount("devtmpfs", "/dev", "devtmpfs", 0, ""); err != nil {
		return nil, "", boot("%v", err)
	}
	consoleStdio()
	cmdline, _ := os.ReadFile("/proc/cmdline")
	flags := map[string]bool{}
	for _, f := range strings.Fields(string(cmdline)) {
		flags[f] = true
	}
	if flags["virtx.debug"] {
		debugf = func(format string, args ...any) {
			up, _ := os.ReadFile("/proc/uptime")
			fmt.Fprintf(os.Stderr, "virtx-init: [%s] "+format+"\n", append([]any{strings.Fields(string(up))[0]}, args...)...)
		}
	}

	// The modules load in the background, each as soon as its dependencies are in;
	// the share and the session disk are mounted as soon as their drivers are, while
	// the rest (overlay, the NIC's) still load. The host says on the kernel command
	// line whether there is a disk (virtx.disk) and a NIC (virtx.net): the config that
	// says so is on the share, which is what the first of them waits for. erofs (and
	// what only it needs) loads only when there is an image's disk: as soon as the
	// virtio disks are found, else when the config says there is an image.
	debugf("main began at %.3f", mainAt)
	debugf("modules")
	skip := map[string]bool{}
	if !flags["virtx.net"] {
		for _, m := range netModules {
			skip[m] = true
		}
	}
	for _, m := range imageModules {
		skip[m] = true
	}
	mods := loadModules("/modules", skip)
	go func() {
		// Once both drivers are in, every virtio disk is there (each is probed as
		// its driver or its transport registers); a serial that does not read yet
		// only leaves erofs for the config to start.
		if mods.wait("virtio_mmio.ko") != nil || mods.wait("virtio_blk.ko") != nil {
			return
		}
		if _, err := virtioDisk(func(serial string) bool { return serial == ImageDiskSerial }); err == nil {
			for _, m := range imageModules {
				mods.start(m)
			}
		}
	}()
	var diskErr error
	diskDone := make(chan struct{})
	go func() {
		defer close(diskDone)
		if !flags["virtx.disk"] {
			diskErr = mount("tmpfs", diskDir, "tmpfs", 0, "mode=0755")
			return
		}
		if diskErr = mods.wait("virtio_mmio.ko"); diskErr != nil {
			return
		}
		if diskErr = mods.wait("virtio_blk.ko"); diskErr != nil {
			return
		}
		// noinit_itable: the disk is a fresh sparse file, so its inode tables already
		// read as zeros; the kernel need not spend the guest's CPU zeroing them behind
		// a session. The session disk is the virtio disk that is not the image's (which
		// may well be vda: the order drivers find disks in is no contract).
		diskErr = retry(5*time.Second, func() error {
			dev, err := virtioDisk(func(serial string) bool { return serial != ImageDiskSerial })
			if err != nil {
				return err
			}
			return mount(dev, diskDir, "ext4", unix.MS_NOATIME, "noinit_itable")
		})
		if diskErr != nil {
			diskErr = fmt.Errorf("the session disk: %w", diskErr)
		}
		debugf("disk mounted")
	}()
	for _, m := range []string{"virtio_mmio.ko", "virtiofs.ko"} {
		if err := mods.wait(m); err != nil {
			return nil, "", boot("%v", err)
		}
	}
	if err := retry(5*time.Second, func() error { return mount(ShareTag, hostDir, "virtiofs", 0, "") }); err != nil {
		return nil, "", boot("the host's share: %v", err)
	}
	debugf("share mounted")
	raw, err := os.ReadFile(filepath.Join(hostDir, ShareConfig))
	if err != nil {
		return nil, "", boot("%v", err)
	}
	cfg := &Config{}
	if err := json.Unmarshal(raw, cfg); err != nil {
		return nil, "", boot("config: %v", err)
	}
	if cfg.Hostname != "" {
		_ = unix.Sethostname([]byte(cfg.Hostname))
	}
	// An image's disk: erofs, read-only (the device is, too: QEMU's readonly=on).
	imageDone := make(chan error, 1)
	go func() {
		if !cfg.Image {
			imageDone <- nil
			return
		}
		for _, m := range append([]string{"virtio_mmio.ko", "virtio_blk.ko"}, imageModules...) {
			if err := mods.wait(m); err != nil {
				imageDone <- err
				return
			}
		}
		err := retry(5*time.Second, func() error {
			dev, err := virtioDisk(func(serial string) bool { return serial == ImageDiskSerial })
			if err != nil {
				return err
			}
			return mount(dev, imageDir, "erofs", unix.MS_RDONLY, "")
		})
		debugf("image mounted")
		imageDone <- err
	}()
	// The network is the kernel's, not the root's: it is set up meanwhile.
	netDone := make(chan error, 1)
	go func() {
		if cfg.Network {
			if err := mods.wait("virtio_net.ko"); err != nil {
				netDone <- err
				return
			}
		}
		netDone <- network(cfg)
		debugf("network up")
	}()
	<-diskDone
	if diskErr != nil {
		return cfg, "", boot("%v", diskErr)
	}
	if err := mods.waitAll(); err != nil {
		return cfg, "", boot("%v", err)
	}
	debugf("modules loaded")
	upper, work := filepath.Join(diskDir, "upper"), filepath.Join(diskDir, "work")
	fresh := false
	if _, err := os.Stat(upper); errors.Is(err, os.ErrNotExist) {
		fresh = true
	}
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return cfg, "", boot("%v", err)
		}
	}
	if cfg.Snapshot && fresh {
		f, err := os.Open(filepath.Join(hostDir, ShareSnapshot))
		if err != nil {
			return cfg, "", boot("init snapshot: %v", err)
		}
		err = executor.ApplyLayer(f, upper)
		f.Close()
		if err != nil {
			return cfg, "", fmt.Errorf("%w: init snapshot: %v", backend.ErrBootFailed, err)
		}
	}
	debugf("root overlay")
	lower := filepath.Join(hostDir, ShareBase)
	if err := <-imageDone; err != nil {
		return cfg, "", boot("the image's disk: %v", err)
	}
	if cfg.Image {
		lower += ":" + imageDir // the image, flattened, under base/
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,metacopy=off,redirect_dir=off,index=off", lower, upper, work)
	if err := mount("overlay", newRoot, "overlay", 0, opts); err != nil {
		return cfg, "", boot("root overlay: %v", err)
	}
	for _, m := range []struct{ src, dst, fs, data string }{
		{"proc", "proc", "proc", ""},
		{"sysfs", "sys", "sysfs", ""},
		{"devtmpfs", "dev", "devtmpfs", ""},
		{"devpts", "dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620"},
		{"tmpfs", "dev/shm", "tmpfs", "mode=1777"},
		{"tmpfs", "run", "tmpfs", "mode=0755"},
	} {
		dst := filepath.Join(newRoot, m.dst)
		_ = os.MkdirAll(dst, 0o755)
		if err := mount(m.src, dst, m.fs, unix.MS_NOSUID, m.data); err != nil {
			return cfg, "", boot("%v", err)
		}
	}
	_ = os.Symlink("pts/ptmx", filepath.Join(newRoot, "dev/ptmx"))
	if err := limitPids(cfg.PidsMax); err != nil {
		return cfg, "", boot("pids cgroup: %v", err)
	}
	for _, t := range cfg.Trees {
		if err := mountTree(t); err != nil {
			return cfg, "", fmt.Errorf("%w: %s: %v", backend.ErrMountFailed, t.Guest, err)
		}
	}
	if w := path.Clean("/" + cfg.Workdir); w != "/" {
		if err := os.MkdirAll(filepath.Join(newRoot, w), 0o755); err != nil {
			return cfg, "", boot("the image's working directory %s: %v", w, err)
		}
	}
	if err := <-netDone; err != nil {
		return cfg, "", boot("network: %v", err)
	}
	// Keep the upper reachable after the switch: an O_PATH fd, read through /proc.
	fd, err := unix.Open(upper, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return cfg, "", boot("open %s: %v", upper, err)
	}
	debugf("if err := switchRoot()")
	if err := switchRoot(); err != nil {
		return cfg, "", boot("switch root: %v", err)
	}
	return cfg, fmt.Sprintf("/proc/self/fd/%d", fd), nil
}

// virtioDisk answers /dev/vdX of the first virtio disk (by name) whose serial, as
// /sys/block/vdX/serial has it, want accepts (a disk without a serial reads as "").
func virtioDisk(want func(serial string) bool) (string, error) {
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		return "", err
	}
	var seen []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "vd") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
		if err != nil { // asks the device: not answering yet, try again
			seen = append(seen, fmt.Sprintf("%s (serial: %v)", e.Name(), err))
			continue
		}
		serial := strings.TrimRight(string(b), "\x00\n ")
		if want(serial) {
			return "/dev/" + e.Name(), nil
		}
		seen = append(seen, fmt.Sprintf("%s (serial %q)", e.Name(), serial))
	}
	return "", fmt.Errorf("no such virtio disk among %v", seen)
}

// limitPids mounts cgroup2 in the new root and moves this process (and so everything
// it will start) into a cgroup whose pids.max is max.
func limitPids(max int) error {
	cg := filepath.Join(newRoot, "sys/fs/cgroup")
	if err := mount("cgroup2", cg, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if max <= 0 {
		return nil
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
		return err
	}
	sess := filepath.Join(cg, "session")
	if err := os.Mkdir(sess, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	if err := os.WriteFile(filepath.Join(sess, "pids.max"), []byte(fmt.Sprint(max)), 0); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(sess, "cgroup.procs"), []byte("1"), 0); err != nil {
		return err
	}
	spareThreads(16)
	return nil
}

// spareThreads makes the Go runtime start n OS threads now and keep them idle. PID 1
// shares the session's pids limit with the commands, and a fork bomb takes every pid
// there is: the runtime then cannot start a thread, which is fatal to it (and a dead
// PID 1 ends the VM). Threads the runtime already has are reused instead of started.
func spareThreads(n int) {
	var started, release sync.WaitGroup
	started.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	done.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer done.Done()
			runtime.LockOSThread() // a thread of its own while locked
			started.Done()
			release.Wait()
			runtime.UnlockOSThread() // back to the runtime's idle list, not ended
		}()
	}
	started.Wait()
	release.Done()
	done.Wait()
}

// mountTree binds /mnt/host/trees/N at the tree's guest path inside the new root.
func mountTree(t Tree) error {
	src := filepath.Join(hostDir, ShareTrees, fmt.Sprint(t.Index))
	dst := filepath.Join(newRoot, path.Clean("/"+t.Guest))
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if err := mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if t.ReadOnly {
		if err := mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return err
		}
	}
	return nil
}

// network brings lo up, and eth0 when the session has a network.
func network(cfg *Config) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	if !cfg.Network {
		return nil
	}
	var eth netlink.Link
	if err := retry(5*time.Second, func() error {
		eth, err = netlink.LinkByName("eth0")
		return err
	}); err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	addr, err := netlink.ParseAddr(cfg.Address)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("eth0 address: %w", err)
	}
	if err := netlink.LinkSetUp(eth); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	gw := net.ParseIP(cfg.Gateway)
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// switchRoot deletes the initramfs's files (their memory is freed), moves the new root
// onto / and enters it.
func switchRoot() error {
	for _, m := range []string{"/proc", "/sys", "/dev"} {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	_ = os.RemoveAll("/modules")
	_ = os.Remove("/init")
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := mount(newRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return err
	}
	if err := unix.Chroot("."); err != nil {
		return &os.PathError{Op: "chroot", Path: newRoot, Err: err}
	}
	return unix.Chdir("/")
}

// netModules are the modules only a guest with a NIC needs.
var netModules = []string{"virtio_net.ko", "net_failover.ko", "failover.ko"}

// imageModules are the modules only a guest on an OCI image needs (its erofs disk);
// erofs's own dependencies (libcrc32c) load with it.
var imageModules = []string{"erofs.ko"}

// modules is the loading of the initramfs's modules, in the background.
type modules struct {
	dir  string
	mods map[string]*module // by file name; made before any loading starts
	err  error              // reading order.txt

	mu      sync.Mutex
	started []*module
}

type module struct {
	file string
	deps []string
	once sync.Once
	done chan struct{}
	err  error // set before done is closed
}

// start starts loading the module in file name, after what it needs, unless it is
// loading already; it answers nil for a module the initramfs lacks.
func (m *modules) start(name string) *module {
	md, ok := m.mods[name]
	if !ok {
		return nil
	}
	md.once.Do(func() {
		m.mu.Lock()
		m.started = append(m.started, md)
		m.mu.Unlock()
		for _, d := range md.deps {
			m.start(d)
		}
		go func() {
			var err error
			for _, d := range md.deps {
				if derr := m.wait(d); derr != nil && err == nil {
					err = fmt.Errorf("%s needs %s: %w", md.file, d, derr)
				}
			}
			if err == nil {
				err = finitModule(filepath.Join(m.dir, md.file))
			}
			md.err = err
			close(md.done)
		}()
	})
	return md
}

// wait loads the module in file name (and what it needs), if it is not loading yet,
// and waits for it; a module the initramfs lacks (a kernel with it built in) is not
// waited for.
func (m *modules) wait(name string) error {
	if m.err != nil {
		return m.err
	}
	md := m.start(name)
	if md == nil {
		return nil
	}
	<-md.done
	return md.err
}

// waitAll waits for every module started so far and answers the first failure.
func (m *modules) waitAll() error {
	if m.err != nil {
		return m.err
	}
	m.mu.Lock()
	started := append([]*module(nil), m.started...)
	m.mu.Unlock()
	var first error
	for _, md := range started {
		<-md.done
		if md.err != nil && first == nil {
			first = md.err
		}
	}
	return first
}

// loadModules starts loading dir's modules as its order.txt lists them (a line is a
// module's file and the files of the modules it depends on): every one that is not in
// skip and that no other module needs, each after its dependencies, so that a module
// only skipped ones need (the NIC's failover, erofs's libcrc32c) is not loaded either;
// wait loads a skipped one later. Several load at once (a guest has more than one
// vCPU, and under TCG loading a module is mostly CPU).
func loadModules(dir string, skip map[string]bool) *modules {
	m := &modules{dir: dir, mods: map[string]*module{}}
	order, err := os.ReadFile(filepath.Join(dir, "order.txt"))
	if errors.Is(err, os.ErrNotExist) {
		return m // a kernel with everything built in
	}
	if err != nil {
		m.err = err
		return m
	}
	var files []string
	needed := map[string]bool{}
	for _, line := range strings.Split(string(order), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		files = append(files, f[0])
		m.mods[f[0]] = &module{file: f[0], deps: f[1:], done: make(chan struct{})}
		for _, d := range f[1:] {
			needed[d] = true
		}
	}
	for _, f := range files {
		if !skip[f] && !needed[f] {
			m.start(f)
		}
	}
	return m
}

// finitModule loads one module; one already there is fine.
func finitModule(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return &os.PathError{Op: "finit_module", Path: p, Err: err}
	}
	return nil
}

// mount wraps mount(2) with the operation and paths in the error.
func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s (%s %s): %w", src, dst, fstype, data, err)
	}
	return nil
}

func retry(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// openPort finds the virtio-serial port named name and opens it.
func openPort(name string, wait time.Duration) (io.ReadWriter, error) {
	var dev string
	err := retry(wait, func() error {
		ents, _ := os.ReadDir("/sys/class/virtio-ports")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", e.Name(), "name"))
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev = "/dev/" + e.Name()
				return nil
			}
		}
		return fmt.Errorf("no virtio-serial port named %s under /sys/class/virtio-ports", name)
	})
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return newPort(f, func() {
		killEverything()
		powerOff()
	}), nil
}

// port reads a virtio-serial port in its own goroutine, so the end of the host's side
// is seen even while an exec is running: until the first byte, a read of 0 means the
// host is not connected yet and is retried; after it, it means the host went away, and
// gone runs (for /init: everything killed, the disk synced, the VM powered off).
type port struct {
	f  io.ReadWriter
	pr *io.PipeReader
	mu sync.Mutex
}

func newPort(f io.ReadWriter, gone func()) *port {
	pr, pw := io.Pipe()
	p := &port{f: f, pr: pr}
	go func() {
		buf := make([]byte, 256<<10)
		started := false
		for {
			n, err := f.Read(buf)
			if n > 0 {
				started = true
				if _, werr := pw.Write(buf[:n]); werr != nil {
					return
				}
				continue
			}
			if !started && (err == nil || err == io.EOF) {
				time.Sleep(2 * time.Millisecond)
				continue
			}
			pw.CloseWithError(io.EOF)
			gone()
			return
		}
	}()
	return p
}

func (p *port) Read(b []byte) (int, error) { return p.pr.Read(b) }

func (p *port) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.f.Write(b)
}

// serveFailure answers every request on rw with err, until the host goes away.
func serveFailure(rw io.ReadWriter, err error) {
	if rw == nil {
		return
	}
	pe := fault.ToProtocol(err)
	fr := protocol.NewFrameReader(rw)
	for {
		f, rerr := fr.ReadFrame()
		if rerr != nil {
			return
		}
		msg, derr := protocol.Decode(f)
		if derr != nil || msg.Kind != protocol.KindRequest {
			continue
		}
		if werr := protocol.WriteFrame(rw, protocol.AppendError(nil, msg.ID, true, pe)); werr != nil {
			return
		}
	}
}

// consoleStdio gives this process /dev/console as stdin, stdout and stderr when the
// kernel found no /dev/console to give it (an initramfs without one).
func consoleStdio() {
	if _, err := unix.FcntlInt(2, unix.F_GETFD, 0); err == nil {
		return
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR, 0)
	if err != nil {
		return
	}
	for i := 0; i < 3; i++ {
		_ = unix.Dup2(fd, i)
	}
	if fd > 2 {
		unix.Close(fd)
	}
}

// killEverything kills every process but this one.
func killEverything() {
	_ = unix.Kill(-1, unix.SIGKILL)
}

// powerOff syncs the disks and powers the VM off (QEMU then exits).
func powerOff() {
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	os.Exit(1) // PID 1 exiting panics the kernel, and -no-reboot ends QEMU anyway
}

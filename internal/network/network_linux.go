package network

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// startTimeout bounds Start when its context has no deadline.
const startTimeout = 10 * time.Second

// Start polls the namespace for its default route every pollMin at first, backing off to
// pollMax: a helper is usually ready within a few milliseconds, and one poll (two netlink
// dumps) costs tens of microseconds.
var pollMin, pollMax = 250 * time.Microsecond, 2 * time.Millisecond

// SetupLoopback brings lo up in the calling thread's network namespace (for the sandbox's
// PID 1 that is its new namespace: every thread of a process cloned with CLONE_NEWNET is
// in it). The kernel then gives lo 127.0.0.1/8 and ::1.
func SetupLoopback() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("network: find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("network: set lo up: %w", err)
	}
	return nil
}

// Available reports which tool Start would use with Options.Tool "", or an error matching
// ErrUnavailable that names the Debian package to install.
func Available() (tool string, err error) {
	tool, _, err = findTool("")
	return tool, err
}

// findTool resolves Options.Tool to a tool and its executable.
func findTool(want string) (tool, path string, err error) {
	switch want {
	case ToolPasta, ToolSlirp4netns:
		if path, ok := lookPath(want); ok {
			return want, path, nil
		}
		return "", "", fmt.Errorf("network: %w: %s is not installed (Debian package %q)", ErrUnavailable, want, packageOf(want))
	case "":
		for _, t := range preference {
			if path, ok := lookPath(t); ok {
				return t, path, nil
			}
		}
		return "", "", fmt.Errorf("network: %w: neither pasta nor slirp4netns is installed (Debian package \"passt\", or \"slirp4netns\")", ErrUnavailable)
	default:
		return "", "", fmt.Errorf("network: unknown tool %q (want %q or %q)", want, ToolPasta, ToolSlirp4netns)
	}
}

// preference is the order in which Options.Tool "" tries the tools.
var preference = []string{ToolSlirp4netns, ToolPasta}

// searchDirs are where lookPath looks after $PATH.
var searchDirs = []string{"/usr/bin", "/usr/local/bin", "/bin"}

// lookPath finds a tool on $PATH, then where Debian installs it (a server started with a
// bare environment still finds it).
func lookPath(name string) (string, bool) {
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	for _, dir := range searchDirs {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// sysUserNet is the helper process behind a UserNet.
type sysUserNet struct {
	cmd       *exec.Cmd
	pid       int
	exited    chan struct{} // closed once the helper has been waited for
	waitErr   error         // valid after exited
	output    *tailBuffer   // the helper's stdout and stderr, last bytes
	exitW     *os.File      // slirp4netns: closing it asks the helper to exit
	closeOnce sync.Once
}

// Start connects the network namespace of process pid to the outside through pasta or
// slirp4netns (see the package doc) and returns once the namespace has its interface
// (Interface) up with a default route. ctx bounds the start only (10 s when it has no
// deadline); the helper then lives until Close, or until the server dies.
//
// The namespace must not be the server's own: Start refuses it rather than give the host
// a tap device. When pid is in another user namespace (a rootless sandbox), the helper
// joins that too, which it needs to configure the interface.
func Start(ctx context.Context, pid int, opts Options) (*UserNet, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("network: start: bad pid %d", pid)
	}
	tool, toolPath, err := findTool(opts.Tool)
	if err != nil {
		return nil, err
	}
	mtu := opts.MTU
	if mtu == 0 {
		mtu = DefaultMTU
	}
	if mtu < 1280 || mtu > DefaultMTU {
		return nil, fmt.Errorf("network: start: MTU %d out of range 1280..%d", mtu, DefaultMTU)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, startTimeout)
		defer cancel()
	}

	// The helper reaches the namespaces through descriptors we pass it (/proc/self/fd/N):
	// pasta drops its capabilities before opening a path, and could no longer open
	// another process's /proc/PID/ns files. Identities are taken from the same
	// descriptors, so what is checked is what the helper gets.
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	addFile := func(f *os.File) string {
		files = append(files, f)
		return "/proc/self/fd/" + strconv.Itoa(2+len(files))
	}
	netnsPath := "/proc/" + strconv.Itoa(pid) + "/ns/net"
	nsFile, err := os.Open(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("network: start: %w", err)
	}
	nsArg := addFile(nsFile)
	target, err := nsOfFile(nsFile)
	if err != nil {
		return nil, fmt.Errorf("network: start: %w", err)
	}
	hostNetns := opts.hostNetns
	if hostNetns == "" {
		hostNetns = "/proc/self/ns/net"
	}
	for _, own := range []string{"/proc/self/ns/net", hostNetns} {
		id, err := nsOf(own)
		if err != nil {
			return nil, fmt.Errorf("network: start: %w", err)
		}
		if id == target {
			return nil, fmt.Errorf("network: start: process %d is in the host's network namespace; refusing to give it a tap device", pid)
		}
	}
	userFile, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("network: start: %w", err)
	}
	theirs, err := nsOfFile(userFile)
	if err != nil {
		userFile.Close()
		return nil, fmt.Errorf("network: start: %w", err)
	}
	ours, err := nsOf("/proc/self/ns/user")
	if err != nil {
		userFile.Close()
		return nil, fmt.Errorf("network: start: %w", err)
	}
	usernsArg := ""
	if theirs != ours {
		usernsArg = addFile(userFile)
	} else {
		userFile.Close()
	}

	var args []string
	var dns []netip.Addr
	var readyR, exitW *os.File
	switch tool {
	case ToolPasta:
		args = []string{
			"--foreground", "--quiet",
			"--config-net", "--ns-ifname", Interface, "--mtu", strconv.Itoa(mtu),
			"--no-map-gw",
			"--tcp-ports", "none", "--udp-ports", "none", "--tcp-ns", "none", "--udp-ns", "none",
			"--dns-forward", pastaDNS.String(),
			"--no-netns-quit",
		}
		if os.Geteuid() == 0 {
			args = append(args, "--runas", "0:0")
		}
		if usernsArg != "" {
			args = append(args, "--userns", usernsArg)
		}
		args = append(args, "--netns", nsArg)
		dns = []netip.Addr{pastaDNS}
	case ToolSlirp4netns:
		var readyW, exitR *os.File
		if readyR, readyW, err = pipe(true); err != nil {
			return nil, fmt.Errorf("network: start: %w", err)
		}
		defer readyR.Close()
		readyArg := addFile(readyW)
		if exitR, exitW, err = pipe(false); err != nil {
			return nil, fmt.Errorf("network: start: %w", err)
		}
		exitArg := addFile(exitR)
		args = []string{
			"--configure", "--mtu", strconv.Itoa(mtu),
			"--disable-host-loopback",
			"--enable-sandbox", "--enable-seccomp",
			"--ready-fd", fdNum(readyArg), "--exit-fd", fdNum(exitArg),
			"--netns-type=path",
		}
		if usernsArg != "" {
			args = append(args, "--userns-path="+usernsArg)
		}
		args = append(args, nsArg, Interface)
		dns = []netip.Addr{slirpDNS}
	}

	out := &tailBuffer{max: 16 << 10}
	argv := wrapForTest(opts, append([]string{toolPath}, args...))
	cmd := exec.Command(argv[0], argv[1:]...)
	if opts.resolvConf != "" {
		cmd.Env = append(os.Environ(), "VIRTX_TEST_RESOLV="+opts.resolvConf)
	}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	u := &UserNet{tool: tool, dns: dns, sys: sysUserNet{cmd: cmd, exited: make(chan struct{}), output: out, exitW: exitW}}
	t0 := time.Now()
	if err := u.sys.spawn(); err != nil {
		if exitW != nil {
			exitW.Close()
		}
		return nil, fmt.Errorf("network: start %s: %w", tool, err)
	}
	spawned := time.Since(t0)

	if err := u.waitReady(ctx, pid, readyR); err != nil {
		u.Close()
		return nil, fmt.Errorf("network: start %s for process %d: %w", tool, pid, err)
	}
	ready := time.Since(t0)
	if err := guardTap(u.sys.pid, Interface); err != nil {
		u.Close()
		return nil, fmt.Errorf("network: start %s for process %d: %w", tool, pid, err)
	}
	slog.Debug("network: helper ready", "tool", tool, "pid", u.sys.pid, "netns", netnsPath,
		"spawned", spawned, "ready", ready, "guarded", time.Since(t0))
	return u, nil
}

// fdNum turns "/proc/self/fd/N" back into "N".
func fdNum(procPath string) string { return filepath.Base(procPath) }

// spawn starts the helper from a goroutine locked to its OS thread until the helper has
// exited. A parent-death signal fires when the *thread* that forked the child ends, not
// the process, and the Go runtime ends a thread whose goroutine exits while locked to it
// (golang.org/issue/27505); holding the thread keeps any other code from doing that to
// it while the helper lives. The thread is unlocked, never ended, afterwards: it may have
// forked other children with a parent-death signal before.
func (s *sysUserNet) spawn() error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := s.cmd.Start(); err != nil {
			started <- err
			return
		}
		s.pid = s.cmd.Process.Pid
		started <- nil
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	return <-started
}

// wrapForTest applies the test hooks by exec'ing the helper through nsenter (another
// network namespace) and unshare + sh (a mount namespace with another resolv.conf).
// Both exec in place, so the helper keeps the pid, the descriptors and the parent-death
// signal; the spawning thread is never changed.
func wrapForTest(opts Options, argv []string) []string {
	if opts.resolvConf != "" {
		const script = `mount --bind "$VIRTX_TEST_RESOLV" /etc/resolv.conf && exec "$@"`
		argv = append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"}, argv...)
	}
	if opts.hostNetns != "" {
		argv = append([]string{"nsenter", "--net=" + opts.hostNetns, "--"}, argv...)
	}
	return argv
}

// waitReady returns once the namespace of pid has a default route through Interface
// (both tools set the address, the MTU and the link up before the route), the helper has
// died, or ctx is done.
func (u *UserNet) waitReady(ctx context.Context, pid int, readyR *os.File) error {
	if readyR != nil {
		// slirp4netns writes "1" to the ready pipe once it has configured the interface.
		got := make(chan error, 1)
		go func() {
			var b [1]byte
			_, err := readyR.Read(b[:])
			got <- err
		}()
		select {
		case err := <-got:
			if err != nil {
				return u.diedOr(fmt.Errorf("ready pipe: %w", err))
			}
		case <-u.sys.exited:
			return u.diedOr(nil)
		case <-ctx.Done():
			readyR.Close() // ends the reader
			return fmt.Errorf("waiting for the ready signal: %w", ctx.Err())
		}
	}

	delay := pollMin
	for {
		ready, err := hasDefaultRoute(pid, Interface)
		if err != nil {
			return err
		}
		if ready {
			return nil
		}
		select {
		case <-u.sys.exited:
			return u.diedOr(nil)
		case <-ctx.Done():
			return fmt.Errorf("no default route through %s yet: %w", Interface, ctx.Err())
		case <-time.After(delay):
		}
		if delay < pollMax {
			delay *= 2
		}
	}
}

// hasDefaultRoute reports whether the network namespace of pid has a default route
// through ifname, IPv4 or IPv6. It reads /proc/PID/net, which needs no privilege over the
// namespace: a rootless server may not setns into a namespace of its sandbox's user
// namespace.
func hasDefaultRoute(pid int, ifname string) (bool, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/net/"
	v4, err := os.ReadFile(dir + "route")
	if err != nil {
		return false, fmt.Errorf("read routes: %w", err)
	}
	// Iface Destination Gateway Flags RefCnt Use Metric Mask ...
	for _, line := range strings.Split(string(v4), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) >= 8 && f[0] == ifname && f[1] == "00000000" && f[7] == "00000000" {
			return true, nil
		}
	}
	v6, err := os.ReadFile(dir + "ipv6_route")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) { // IPv6 disabled
			return false, nil
		}
		return false, fmt.Errorf("read routes: %w", err)
	}
	// Destination PrefixLen Source SrcPrefixLen NextHop Metric RefCnt Use Flags Iface
	for _, line := range strings.Split(string(v6), "\n") {
		f := strings.Fields(line)
		if len(f) == 10 && f[9] == ifname && f[1] == "00" && strings.Trim(f[0], "0") == "" {
			return true, nil
		}
	}
	return false, nil
}

// diedOr explains a helper that exited during Start (its exit status and last output),
// or returns err when it is still running.
func (u *UserNet) diedOr(err error) error {
	select {
	case <-u.sys.exited:
		msg := helperMessage(u.sys.output.Bytes())
		if len(msg) == 0 {
			return fmt.Errorf("helper exited: %v", u.sys.waitErr)
		}
		return fmt.Errorf("helper exited (%v): %s", u.sys.waitErr, msg)
	default:
		return err
	}
}

// helperMessage is the helper's output without pasta's complaints that it has no
// system logger to write to.
func helperMessage(out []byte) []byte {
	var keep [][]byte
	for _, line := range bytes.Split(out, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("Failed to send ")) && bytes.HasSuffix(line, []byte(" to syslog")) {
			continue
		}
		keep = append(keep, line)
	}
	return bytes.TrimSpace(bytes.Join(keep, []byte("\n")))
}

// Close kills the helper and waits for it; the namespace loses its interface. Calling it
// again does nothing.
func (u *UserNet) Close() error {
	var err error
	u.sys.closeOnce.Do(func() {
		if u.sys.exitW != nil {
			u.sys.exitW.Close()
		}
		if kerr := u.sys.cmd.Process.Signal(syscall.SIGKILL); kerr != nil && !errors.Is(kerr, os.ErrProcessDone) {
			err = fmt.Errorf("network: kill %s (pid %d): %w", u.tool, u.sys.pid, kerr)
		}
		<-u.sys.exited
		slog.Debug("network: helper stopped", "tool", u.tool, "pid", u.sys.pid)
	})
	return err
}

// DialInNetns connects to addr ("IP:port", no host names: they would be resolved in the
// server's view) from inside the network namespace nsPath (e.g. /proc/PID/ns/net).
// network is "tcp", "tcp4", "tcp6", "udp", "udp4" or "udp6". The socket is made and
// connected on a thread that is in that namespace only meanwhile; the connection then
// works from anywhere. 127.0.0.1:G reaches a service listening inside on 0.0.0.0:G as
// well as on 127.0.0.1:G.
//
// Entering a network namespace takes CAP_SYS_ADMIN both over it and in the caller's own
// user namespace, so this works for a server running as root. A rootless server cannot
// enter its sandbox's namespace, even one its own user namespace owns (EPERM): there,
// something inside the sandbox must connect and pass the socket out (SCM_RIGHTS).
func DialInNetns(ctx context.Context, nsPath string, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6", "udp", "udp4", "udp6":
	default:
		return nil, fmt.Errorf("network: dial in %s: unsupported network %q", nsPath, network)
	}
	if _, err := netip.ParseAddrPort(addr); err != nil {
		return nil, fmt.Errorf("network: dial in %s: %q is not IP:port: %w", nsPath, addr, err)
	}
	var conn net.Conn
	err := inNetns(nsPath, func() error {
		// One literal address: the dialer makes the socket in this goroutine, on this
		// thread (several addresses would race in goroutines of their own).
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		conn = c
		return err
	})
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("network: dial in %s: %w", nsPath, err)
	}
	return conn, nil
}

// inNetns runs fn on a locked OS thread that is in the network namespace nsPath for the
// duration, then moves the thread back. Sockets fn creates stay in nsPath. A thread that
// cannot be moved back (it never happens in practice) is parked for good rather than
// ended.
func inNetns(nsPath string, fn func() error) error {
	target, err := openNs(nsPath)
	if err != nil {
		return err
	}
	defer closeFd(target)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := openNs(threadNetns)
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer closeFd(orig)
		if err := setns(target, unix.CLONE_NEWNET, nsPath); err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		ferr := fn()
		if err := setns(orig, unix.CLONE_NEWNET, threadNetns); err != nil {
			// The thread must not run anything else, and must not end either: children
			// it forked earlier with a parent-death signal would die with it.
			slog.Error("network: cannot return a thread to its network namespace; parking it for good", "err", err)
			done <- ferr
			select {}
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// Bytes is a copy of what is kept.
func (t *tailBuffer) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]byte(nil), t.buf...)
}

var _ io.Writer = (*tailBuffer)(nil)

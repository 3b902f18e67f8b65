package network

// Test scaffolding: namespaces made by re-executing this test binary with CLONE_NEWNET
// (killed in t.Cleanup, and by a parent-death signal if the test binary dies), and a
// fake "host" built from a veth pair between two such namespaces. Nothing here touches
// the real host's interfaces, routes or firewall.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const roleEnv = "VIRTX_NETTEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "guest":
		os.Exit(guestMain())
	case "owner":
		os.Exit(ownerMain())
	}
	os.Exit(m.Run())
}

// guestMain is a process in a network namespace of its own, as the sandbox's PID 1 would
// be. With VIRTX_NETTEST_LO=1 it brings lo up itself and serves an echo on 127.0.0.1.
// It prints "ready PORT" and lives until its stdin closes.
func guestMain() int {
	port := 0
	if os.Getenv("VIRTX_NETTEST_LO") == "1" {
		if err := SetupLoopback(); err != nil {
			fmt.Println("error", err)
			return 1
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		go serveEcho(ln)
		port = ln.Addr().(*net.TCPAddr).Port
	}
	fmt.Println("ready", port)
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// ownerMain plays the server for the parent-death test: it starts a helper for the
// namespace of VIRTX_NETTEST_PID, prints "helper PID" and waits to be killed.
func ownerMain() int {
	pid, _ := strconv.Atoi(os.Getenv("VIRTX_NETTEST_PID"))
	u, err := Start(context.Background(), pid, Options{Tool: os.Getenv("VIRTX_NETTEST_TOOL")})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("helper", u.sys.pid)
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// ci reports whether missing prerequisites must fail rather than skip.
func ci() bool { return os.Getenv("CI") == "true" }

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if ci() {
			t.Fatal("needs root (CI runs as root)")
		}
		t.Skip("needs root to make network namespaces")
	}
}

func requireTool(t testing.TB, tool string) {
	t.Helper()
	requireRoot(t)
	if _, ok := lookPath(tool); !ok {
		msg := fmt.Sprintf("%s is not installed: apt-get install %s", tool, packageOf(tool))
		if ci() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

var tools = []string{ToolPasta, ToolSlirp4netns}

// netnsProc is a process in a network namespace of its own.
type netnsProc struct {
	pid    int
	path   string // /proc/PID/ns/net
	loPort int    // the echo port on 127.0.0.1 inside, with withLoopback
}

// newNetns starts a guest process in a new network namespace; withLoopback makes it call
// SetupLoopback and serve an echo on 127.0.0.1 from inside.
func newNetns(t testing.TB, withLoopback bool) *netnsProc {
	t.Helper()
	return newNetnsIn(t, withLoopback, false)
}

// newNetnsIn is newNetns; with userns the guest also gets a user namespace of its own
// (root inside mapped to root outside), which owns its network namespace, as a rootless
// sandbox's does.
func newNetnsIn(t testing.TB, withLoopback, userns bool) *netnsProc {
	t.Helper()
	requireRoot(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"=guest")
	if withLoopback {
		cmd.Env = append(cmd.Env, "VIRTX_NETTEST_LO=1")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if userns {
		cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("guest: %v", err)
	}
	var port int
	if _, err := fmt.Sscanf(line, "ready %d", &port); err != nil {
		t.Fatalf("guest said %q", line)
	}
	return &netnsProc{pid: cmd.Process.Pid, path: fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid), loPort: port}
}

// in runs fn inside the namespace, failing the test on error.
func (p *netnsProc) in(t testing.TB, fn func() error) {
	t.Helper()
	if err := inNetns(p.path, fn); err != nil {
		t.Fatal(err)
	}
}

// listen makes a listener inside the namespace, closed in Cleanup.
func (p *netnsProc) listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	p.in(t, func() (err error) { ln, err = net.Listen(network, addr); return err })
	t.Cleanup(func() { ln.Close() })
	return ln
}

// links names the interfaces in the namespace.
func (p *netnsProc) links(t testing.TB) []string {
	t.Helper()
	var names []string
	p.in(t, func() error {
		ls, err := netlink.LinkList()
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
		}
		return err
	})
	return names
}

// hasDefaultRoute reports whether the namespace has a default route.
func (p *netnsProc) hasDefaultRoute(t testing.TB) bool {
	t.Helper()
	found := false
	p.in(t, func() error {
		rs, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
		for _, r := range rs {
			if r.Dst == nil {
				found = true
			} else if ones, _ := r.Dst.Mask.Size(); ones == 0 {
				found = true
			}
		}
		return err
	})
	return found
}

// addr4 is the namespace's IPv4 address on Interface.
func (p *netnsProc) addr4(t testing.TB) netip.Addr {
	t.Helper()
	var a netip.Addr
	p.in(t, func() error {
		l, err := netlink.LinkByName(Interface)
		if err != nil {
			return err
		}
		as, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		if len(as) == 0 {
			return errors.New("no IPv4 address on " + Interface)
		}
		a, _ = netip.AddrFromSlice(as[0].IP.To4())
		return nil
	})
	return a
}

// addr6 is the namespace's global IPv6 address on Interface, if it has one.
func (p *netnsProc) addr6(t testing.TB) (netip.Addr, bool) {
	t.Helper()
	var a netip.Addr
	p.in(t, func() error {
		l, err := netlink.LinkByName(Interface)
		if err != nil {
			return err
		}
		as, err := netlink.AddrList(l, netlink.FAMILY_V6)
		for _, x := range as {
			if ip, ok := netip.AddrFromSlice(x.IP); ok && ip.IsGlobalUnicast() {
				a = ip
			}
		}
		return err
	})
	return a, a.IsValid()
}

// serveEcho echoes every connection the listener accepts.
func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() { io.Copy(c, c); c.Close() }()
	}
}

// countAccepts counts the connections a listener gets (closing each), e.g. the host's
// 127.0.0.1 listener that a session must never reach.
func countAccepts(ln net.Listener) *atomic.Int64 {
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return &n
}

// echoOnce checks a connection echoes what it is sent.
// dialEcho connects from inside the namespace ns to addr, has one message echoed, and
// hangs up.
func dialEcho(t testing.TB, ns, network, addr string) {
	t.Helper()
	c, err := DialInNetns(context.Background(), ns, network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echoOnce(t, c)
}

func echoOnce(t testing.TB, c net.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := []byte("hello through the namespace")
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if string(got) != string(msg) {
		t.Fatalf("echo: got %q", got)
	}
}

// fakeHost is a "host" network namespace H joined to a "remote" namespace R by a veth
// pair: H is 198.51.100.1/24 with its default route via R, 198.51.100.2. A helper run in
// H (Options.hostNetns) reaches R exactly as a real helper reaches the internet.
type fakeHost struct {
	h, r *netnsProc
}

var (
	fakeHostAddr   = netip.MustParseAddr("198.51.100.1")
	fakeRemoteAddr = netip.MustParseAddr("198.51.100.2")
)

func newFakeHost(t testing.TB) *fakeHost {
	t.Helper()
	f := &fakeHost{h: newNetns(t, false), r: newNetns(t, false)}
	rfd, err := openNs(f.r.path)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFd(rfd)
	f.h.in(t, func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vh"}, PeerName: "vr", PeerNamespace: netlink.NsFd(rfd)}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth: %w", err)
		}
		return configure("vh", fakeHostAddr, &fakeRemoteAddr)
	})
	f.r.in(t, func() error { return configure("vr", fakeRemoteAddr, nil) })
	return f
}

// configure gives ifname addr/24 and brings it and lo up; with gw, a default route too.
func configure(ifname string, addr netip.Addr, gw *netip.Addr) error {
	for _, name := range []string{"lo", ifname} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return err
		}
	}
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return err
	}
	if gw != nil {
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()})
	}
	return nil
}

// resolvConf writes a resolv.conf naming server and returns its path.
func resolvConf(t testing.TB, server netip.Addr) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("nameserver "+server.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// serveDNS answers every UDP query on pc with an empty NOERROR answer, counting them.
func serveDNS(pc net.PacketConn) *atomic.Int64 {
	var n atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if k < 12 {
				continue
			}
			n.Add(1)
			resp := append([]byte(nil), buf[:k]...)
			resp[2] |= 0x80 // QR: a response
			pc.WriteTo(resp, from)
		}
	}()
	return &n
}

// dnsQuery asks server (from inside ns) for an A record and returns the answer's id.
func dnsQuery(ctx context.Context, ns string, server netip.Addr) error {
	c, err := DialInNetns(ctx, ns, "udp", netip.AddrPortFrom(server, 53).String())
	if err != nil {
		return err
	}
	defer c.Close()
	q := []byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, label := range strings.Split("probe.invalid", ".") {
		q = append(q, byte(len(label)))
		q = append(q, label...)
	}
	q = append(q, 0, 0, 1, 0, 1)
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(q); err != nil {
		return err
	}
	buf := make([]byte, 2048)
	k, err := c.Read(buf)
	if err != nil {
		return err
	}
	if k < 12 || buf[0] != 0x12 || buf[1] != 0x34 || buf[2]&0x80 == 0 {
		return fmt.Errorf("not an answer: % x", buf[:k])
	}
	return nil
}

// sendRawSYN writes, from inside ns, a TCP SYN from src to dst straight onto Interface as
// an Ethernet frame (an AF_PACKET socket, as root inside the session could): the
// namespace's own routing, which keeps 127.0.0.1 local, never sees it, so this is what a
// session with CAP_NET_RAW could send the helper.
func sendRawSYN(t testing.TB, ns string, src, dst netip.AddrPort) {
	t.Helper()
	if err := sendFrame(ns, Interface, tcpSynFrame(src, dst, nil)); err != nil {
		t.Fatal(err)
	}
}

// sendFrame writes one Ethernet frame (source MAC filled in) onto ifname inside ns.
func sendFrame(ns, ifname string, frame []byte) error {
	return inNetns(ns, func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return os.NewSyscallError("socket AF_PACKET", err)
		}
		defer unix.Close(fd)
		f := append([]byte(nil), frame...)
		copy(f[6:12], l.Attrs().HardwareAddr)
		sa := &unix.SockaddrLinklayer{Protocol: htons(binary.BigEndian.Uint16(f[12:14])), Ifindex: l.Attrs().Index}
		if err := unix.Sendto(fd, f, 0, sa); err != nil {
			return os.NewSyscallError("sendto AF_PACKET", err)
		}
		return nil
	})
}

// ethFrame is a broadcast Ethernet frame (both tools take any destination MAC; the source
// is filled in by sendFrame) carrying payload and then trailer.
func ethFrame(ethertype uint16, payload, trailer []byte) []byte {
	f := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, byte(ethertype >> 8), byte(ethertype)}
	return append(append(f, payload...), trailer...)
}

// tcpSynFrame is an Ethernet frame carrying a TCP SYN from src to dst, IPv4 or IPv6 as
// dst is, checksums included; trailer follows the packet (a marker for the guard test).
func tcpSynFrame(src, dst netip.AddrPort, trailer []byte) []byte {
	tcp := make([]byte, 20)
	binary.BigEndian.PutUint16(tcp[0:], src.Port())
	binary.BigEndian.PutUint16(tcp[2:], dst.Port())
	binary.BigEndian.PutUint32(tcp[4:], 0x1000)
	tcp[12] = 5 << 4 // data offset
	tcp[13] = 0x02   // SYN
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	s, d := src.Addr().AsSlice(), dst.Addr().AsSlice()
	pseudo := append(append([]byte{}, s...), d...)
	if dst.Addr().Is4() {
		pseudo = append(pseudo, 0, unix.IPPROTO_TCP, 0, byte(len(tcp)))
	} else {
		pseudo = append(pseudo, 0, 0, 0, byte(len(tcp)), 0, 0, 0, unix.IPPROTO_TCP)
	}
	binary.BigEndian.PutUint16(tcp[16:], checksum(append(pseudo, tcp...)))

	if dst.Addr().Is4() {
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		binary.BigEndian.PutUint16(ip[4:], 0x4242)
		ip[8] = 64
		ip[9] = unix.IPPROTO_TCP
		copy(ip[12:], s)
		copy(ip[16:], d)
		binary.BigEndian.PutUint16(ip[10:], checksum(ip))
		return ethFrame(unix.ETH_P_IP, append(ip, tcp...), trailer)
	}
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(tcp)))
	ip[6] = unix.IPPROTO_TCP
	ip[7] = 64
	copy(ip[8:], s)
	copy(ip[24:], d)
	return ethFrame(unix.ETH_P_IPV6, append(ip, tcp...), trailer)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// alive reports whether pid is a live (non-zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// startNet starts a helper for p and closes it in Cleanup.
func startNet(t testing.TB, p *netnsProc, opts Options) *UserNet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	u, err := Start(ctx, p.pid, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

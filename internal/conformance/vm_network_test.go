package conformance

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"virtx.dev/virtx/protocol"
)

// Outbound network of a VM session, tested without the real network: the server runs in
// a fake "host" network namespace H joined by a veth pair to a fake "remote" namespace R
// (198.51.100.0/24, TEST-NET-2), both made here and gone with the test. The guest reaches
// a listener in R through slirp4netns (which the server starts in H), and never a
// listener on H's 127.0.0.1 — neither through the gateway nor by a raw frame for
// 127.0.0.1 written straight onto its NIC. Nothing here sends a packet to an address
// outside these namespaces.

var (
	fakeHostIP   = net.ParseIP("198.51.100.1")
	fakeRemoteIP = net.ParseIP("198.51.100.2")
)

// netnsHolder is a process (sleep) in a network namespace of its own; its /proc path
// names the namespace. It is killed in Cleanup, and by a parent-death signal with the
// test binary.
func netnsHolder(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("sleep", "infinity")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net"
}

// inNS runs fn on a locked thread that is in the network namespace ns meanwhile.
// Sockets fn makes, and processes it starts, stay in ns.
func inNS(t *testing.T, ns string, fn func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- err
			return
		}
		defer orig.Close()
		target, err := os.Open(ns)
		if err != nil {
			done <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("back to the test's namespace: %v", err)
			select {} // never run anything else on this thread
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// upWith brings lo and ifname up and gives ifname ip/24, and a default route via gw.
func upWith(ifname string, ip, gw net.IP) error {
	for _, n := range []string{"lo", ifname} {
		l, err := netlink.LinkByName(n)
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
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}}); err != nil {
		return err
	}
	if gw != nil {
		return netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw})
	}
	return nil
}

// acceptCount accepts and counts connections on ln; with echo, it echoes one line back.
func acceptCount(ln net.Listener, echo bool) *atomic.Int64 {
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			go func() {
				defer c.Close()
				if echo {
					c.SetDeadline(time.Now().Add(10 * time.Second))
					line, _ := bufio.NewReader(c).ReadString('\n')
					fmt.Fprintf(c, "echo %s", line)
				}
			}()
		}
	}()
	return &n
}

// rawSYN is a python3 program (the host image has it) that writes one TCP SYN from the
// guest's address to argv[1]:argv[2] straight onto eth0 (AF_PACKET), addressed to the
// gateway's MAC, past the guest kernel's routing.
const rawSYN = `
import socket, struct, sys
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); s += s >> 16
    return ~s & 0xffff
dst, dport, sport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
src = '10.0.2.15'
gw = [l.split()[3] for l in open('/proc/net/arp') if l.startswith('10.0.2.2 ')][0]
mine = open('/sys/class/net/eth0/address').read().strip()
mac = lambda m: bytes.fromhex(m.replace(':', ''))
tcp = struct.pack('!HHIIBBHHH', sport, dport, 1, 0, 5 << 4, 0x02, 65535, 0, 0)
pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack('!BBH', 0, 6, len(tcp))
tcp = tcp[:16] + struct.pack('!H', csum(pseudo + tcp)) + tcp[18:]
ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(tcp), 1, 0, 64, 6, 0, socket.inet_aton(src), socket.inet_aton(dst))
ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
s.send(mac(gw) + mac(mine) + b'\x08\x00' + ip + tcp)
print('sent')
`

// TestVMNetworkOutbound: with network on, the guest reaches a remote listener through
// the user-space stack, its resolver is the stack's DNS relay, and the host's loopback
// services stay unreachable however the guest tries.
func TestVMNetworkOutbound(t *testing.T) {
	requireVM(t)
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces")
	}
	if _, err := exec.LookPath("slirp4netns"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("prerequisite missing in CI: slirp4netns (apt-get install slirp4netns)")
		}
		t.Skip("prerequisite missing: slirp4netns (apt-get install slirp4netns)")
	}
	h, r := netnsHolder(t), netnsHolder(t)
	inNS(t, h, func() error {
		rf, err := os.Open(r)
		if err != nil {
			return err
		}
		defer rf.Close()
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vh"}, PeerName: "vr", PeerNamespace: netlink.NsFd(int(rf.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("veth: %w", err)
		}
		return upWith("vh", fakeHostIP, fakeRemoteIP)
	})
	inNS(t, r, func() error { return upWith("vr", fakeRemoteIP, nil) })

	var remote, probe, hostLo net.Listener
	inNS(t, r, func() (err error) {
		if remote, err = net.Listen("tcp", fakeRemoteIP.String()+":0"); err != nil {
			return err
		}
		probe, err = net.Listen("tcp", fakeRemoteIP.String()+":0")
		return err
	})
	inNS(t, h, func() (err error) { hostLo, err = net.Listen("tcp", "127.0.0.1:0"); return err })
	for _, ln := range []net.Listener{remote, probe, hostLo} {
		t.Cleanup(func() { ln.Close() })
	}
	remoteHits, probeHits, hostLoHits := acceptCount(remote, true), acceptCount(probe, false), acceptCount(hostLo, false)
	remotePort := remote.Addr().(*net.TCPAddr).Port
	probePort := probe.Addr().(*net.TCPAddr).Port
	hostLoPort := hostLo.Addr().(*net.TCPAddr).Port

	// The fake host's resolver is in R: the server (and so slirp4netns) sees a
	// resolv.conf naming it, bind-mounted in a mount namespace of the server's own.
	var dns net.PacketConn
	inNS(t, r, func() (err error) { dns, err = net.ListenPacket("udp", fakeRemoteIP.String()+":53"); return err })
	t.Cleanup(func() { dns.Close() })
	dnsHits := serveFakeDNS(dns, fakeAnswerIP)
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+fakeRemoteIP.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	var p *peer
	inNS(t, h, func() error {
		p = startPeerCmd(t, exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$0" /etc/resolv.conf && exec "$@"`, resolv, virtxBin, "serve", "--backend", "vm"))
		return nil
	})
	p.init(&protocol.InitParams{Network: boolp(true)})

	if got := p.sh("cat /etc/resolv.conf"); got != "nameserver 10.0.2.3\n" {
		t.Errorf("the guest's resolver: %q, want slirp4netns's DNS relay 10.0.2.3", got)
	}
	// A name resolved through the relay by the host's resolver.
	if got := p.sh("getent ahostsv4 probe.virtx.test | head -1"); !strings.HasPrefix(got, fakeAnswerIP.String()+" ") || dnsHits.Load() == 0 {
		t.Errorf("resolving through the DNS relay: %q (%d queries reached the fake host's resolver)", got, dnsHits.Load())
	}
	// Outbound TCP to the remote.
	out := p.sh(fmt.Sprintf(`timeout 20 bash -c 'exec 3<>/dev/tcp/%s/%d; echo hello >&3; head -1 <&3'`, fakeRemoteIP, remotePort))
	if out != "echo hello\n" || remoteHits.Load() != 1 {
		t.Fatalf("outbound to the remote: %q (%d connections)", out, remoteHits.Load())
	}
	// The host's loopback: through the gateway, through the guest's own 127.0.0.1.
	for _, addr := range []string{"10.0.2.2", "127.0.0.1", "10.0.2.100"} {
		r := p.exec("timeout", "5", "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/%d", addr, hostLoPort))
		if r.Code == 0 {
			t.Errorf("the guest connected to %s:%d", addr, hostLoPort)
		}
	}
	// Raw frames: the one to the remote arrives (so the probe proves something), the one
	// to 127.0.0.1 must not.
	if got := p.sh(fmt.Sprintf("python3 -c %s %s %d 40001", shellQuote(rawSYN), fakeRemoteIP, probePort)); got != "sent\n" {
		t.Fatalf("raw SYN to the remote: %q", got)
	}
	if got := p.sh(fmt.Sprintf("python3 -c %s 127.0.0.1 %d 40002", shellQuote(rawSYN), hostLoPort)); got != "sent\n" {
		t.Fatalf("raw SYN to 127.0.0.1: %q", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for probeHits.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if probeHits.Load() == 0 {
		t.Error("the raw SYN to the remote never arrived: the raw probe proves nothing")
	}
	time.Sleep(time.Second)
	if n := hostLoHits.Load(); n != 0 {
		t.Fatalf("the fake host's 127.0.0.1 listener got %d connections from the guest", n)
	}
}

// fakeAnswerIP is the address the fake resolver gives every name.
var fakeAnswerIP = net.ParseIP("198.51.100.7")

// serveFakeDNS answers every UDP query on pc: an A question with one A record for ip,
// any other with no records (NOERROR). It counts the queries.
func serveFakeDNS(pc net.PacketConn, ip net.IP) *atomic.Int64 {
	var n atomic.Int64
	go func() {
		buf := make([]byte, 2048)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:k]
			// The header (12 bytes), then one question: a name of labels, type, class.
			end := 12
			for end < k && q[end] != 0 {
				end += int(q[end]) + 1
			}
			end += 5
			if k < 12 || end > k || q[5] != 1 {
				continue
			}
			n.Add(1)
			resp := append([]byte(nil), q[:end]...)
			resp[2] |= 0x80 // QR: a response
			resp[3] = 0x80  // RA, NOERROR
			resp[8], resp[9], resp[10], resp[11] = 0, 0, 0, 0
			if q[end-4] == 0 && q[end-3] == 1 { // type A
				resp[7] = 1 // one answer: the question's name (a pointer to it), A, IN, 60 s
				resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
				resp = append(resp, ip.To4()...)
			} else {
				resp[7] = 0
			}
			pc.WriteTo(resp, from)
		}
	}()
	return &n
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

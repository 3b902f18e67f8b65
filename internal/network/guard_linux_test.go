package network

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestGuardFilter runs guardFilter in the kernel, on a tap device of the test's own in a
// namespace of its own: each frame is written onto the device with AF_PACKET, as a
// session could, and the test reads from the tap what a helper would get.
func TestGuardFilter(t *testing.T) {
	g := newNetns(t, false)
	var tapFd int
	g.in(t, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return os.NewSyscallError("open /dev/net/tun", err)
		}
		ifr, err := unix.NewIfreq("guard0")
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return os.NewSyscallError("ioctl TUNSETIFF", err)
		}
		tapFd = fd
		l, err := netlink.LinkByName("guard0")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	t.Cleanup(func() { unix.Close(tapFd) })
	if err := tunAttachFilter(tapFd, guardFilter); err != nil {
		t.Fatal(err)
	}

	ap := netip.MustParseAddrPort
	src4, src6 := ap("10.0.2.100:40000"), ap("[fd00::2]:40000")
	cases := []struct {
		name  string
		frame func(marker []byte) []byte
		pass  bool
	}{
		{"v4 127.0.0.1", func(m []byte) []byte { return tcpSynFrame(src4, ap("127.0.0.1:80"), m) }, false},
		{"v4 127.255.255.254", func(m []byte) []byte { return tcpSynFrame(src4, ap("127.255.255.254:80"), m) }, false},
		{"v4 0.0.0.0", func(m []byte) []byte { return tcpSynFrame(src4, ap("0.0.0.0:80"), m) }, false},
		{"v4 0.1.2.3", func(m []byte) []byte { return tcpSynFrame(src4, ap("0.1.2.3:80"), m) }, false},
		{"v4 10.0.2.2", func(m []byte) []byte { return tcpSynFrame(src4, ap("10.0.2.2:80"), m) }, true},
		{"v4 128.0.0.1", func(m []byte) []byte { return tcpSynFrame(src4, ap("128.0.0.1:80"), m) }, true},
		{"v4 126.255.255.255", func(m []byte) []byte { return tcpSynFrame(src4, ap("126.255.255.255:80"), m) }, true},
		{"v4 198.51.100.2", func(m []byte) []byte { return tcpSynFrame(src4, ap("198.51.100.2:80"), m) }, true},
		{"v6 ::1", func(m []byte) []byte { return tcpSynFrame(src6, ap("[::1]:80"), m) }, false},
		{"v6 ::", func(m []byte) []byte { return tcpSynFrame(src6, ap("[::]:80"), m) }, false},
		{"v6 ::ffff:127.0.0.1", func(m []byte) []byte { return tcpSynFrame(src6, ap("[::ffff:127.0.0.1]:80"), m) }, false},
		{"v6 ::ffff:10.0.0.1", func(m []byte) []byte { return tcpSynFrame(src6, ap("[::ffff:10.0.0.1]:80"), m) }, false},
		{"v6 ::2", func(m []byte) []byte { return tcpSynFrame(src6, ap("[::2]:80"), m) }, true},
		{"v6 ::1:0:0:1", func(m []byte) []byte { return tcpSynFrame(src6, ap("[::1:0:0:1]:80"), m) }, true},
		{"v6 fd00::1", func(m []byte) []byte { return tcpSynFrame(src6, ap("[fd00::1]:80"), m) }, true},
		{"v6 2001:db8::1", func(m []byte) []byte { return tcpSynFrame(src6, ap("[2001:db8::1]:80"), m) }, true},
		{"v6 fe80::1", func(m []byte) []byte { return tcpSynFrame(src6, ap("[fe80::1]:80"), m) }, true},
		{"arp", func(m []byte) []byte { return ethFrame(unix.ETH_P_ARP, make([]byte, 28), m) }, true},
		{"vlan-tagged v4 127.0.0.1", func(m []byte) []byte {
			inner := tcpSynFrame(src4, ap("127.0.0.1:80"), m)
			return ethFrame(0x8100, append([]byte{0, 1, 0x08, 0x00}, inner[14:]...), nil)
		}, false},
		{"unknown ethertype", func(m []byte) []byte { return ethFrame(0x88b5, make([]byte, 46), m) }, false},
	}
	for i, c := range cases {
		marker := []byte(fmt.Sprintf("GUARD-%03d", i))
		if err := sendFrame(g.path, "guard0", c.frame(marker)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
	}

	// Read what reached the tap reader; the kernel's own frames (IPv6 neighbour and
	// router discovery) carry no marker.
	got := map[string]bool{}
	deadline := time.Now().Add(500 * time.Millisecond)
	buf := make([]byte, 65536)
	for time.Now().Before(deadline) {
		pfd := []unix.PollFd{{Fd: int32(tapFd), Events: unix.POLLIN}}
		if n, err := unix.Poll(pfd, 50); err != nil && err != unix.EINTR {
			t.Fatal(os.NewSyscallError("poll", err))
		} else if n == 0 {
			continue
		}
		n, err := unix.Read(tapFd, buf)
		if err != nil {
			if err == unix.EAGAIN {
				continue
			}
			t.Fatal(os.NewSyscallError("read tap", err))
		}
		if i := bytes.Index(buf[:n], []byte("GUARD-")); i >= 0 && i+9 <= n {
			got[string(buf[i:i+9])] = true
		}
	}
	for i, c := range cases {
		marker := fmt.Sprintf("GUARD-%03d", i)
		if got[marker] != c.pass {
			t.Errorf("%s: passed=%v, want %v", c.name, got[marker], c.pass)
		}
	}
}

// The filter must be one the kernel takes as it stands (a classic program's jumps only
// go forward and stay inside it).
func TestGuardFilterShape(t *testing.T) {
	for i, ins := range guardFilter {
		if ins.Code&0x07 == unix.BPF_JMP {
			for _, off := range []uint8{ins.Jt, ins.Jf} {
				if i+1+int(off) >= len(guardFilter) {
					t.Errorf("instruction %d jumps out of the program", i)
				}
			}
		}
	}
	last := guardFilter[len(guardFilter)-1]
	if last.Code != unix.BPF_RET|unix.BPF_K {
		t.Error("the program does not end in a return")
	}
}

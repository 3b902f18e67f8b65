package network

// The tap guard. Both helpers turn whatever destination a frame names into a socket of
// their own on the host, and neither refuses a loopback one: a frame for 127.0.0.1:P (or
// 0.0.0.0:P, or [::1]:P) becomes a connection to the host's own loopback service on P.
// The session's kernel never routes such a frame out of its interface, but a process
// with CAP_NET_RAW inside (root in the session, unless the sandbox drops it) can write
// one straight onto the interface with an AF_PACKET socket, past every netfilter and tc
// hook in the namespace. The tap device itself is the one place on that path the session
// cannot touch: Start takes a duplicate of the helper's tap descriptor (pidfd_getfd) and
// attaches a socket filter to the device, which the kernel runs on every frame before the
// helper can read it.

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// guardFilter passes ARP, and IPv4 and IPv6 frames whose destination is not the host's
// loopback as a helper would read it; it drops everything else, including VLAN-tagged and
// other frames a helper has no business parsing.
//
// Dropped IPv4 destinations: 127.0.0.0/8 (loopback) and 0.0.0.0/8 (connect(2) to 0.0.0.0
// reaches the local host). Dropped IPv6 destinations: ::1, :: and ::ffff:0:0/96 (an
// IPv4-mapped destination would let a helper's IPv6 socket reach 127.0.0.1).
//
// Offsets are from the start of the Ethernet header: the ethertype at 12, the IPv4
// destination at 14+16, the IPv6 destination at 14+24.
var guardFilter = []unix.SockFilter{
	/* 0 */ {Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 12},
	/* 1 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.ETH_P_IP, Jt: 2 /* 4 */},
	/* 2 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.ETH_P_IPV6, Jt: 5 /* 8 */},
	/* 3 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: unix.ETH_P_ARP, Jt: 15 /* 19 pass */, Jf: 14 /* 18 drop */},
	// IPv4: the destination's first octet.
	/* 4 */ {Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 30},
	/* 5 */ {Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: 0xff000000},
	/* 6 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0x7f000000, Jt: 11 /* 18 drop */},
	/* 7 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0x00000000, Jt: 10 /* 18 drop */, Jf: 11 /* 19 pass */},
	// IPv6: the destination's four words.
	/* 8 */ {Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 38},
	/* 9 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0, Jf: 9 /* 19 pass */},
	/* 10 */ {Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 42},
	/* 11 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0, Jf: 7 /* 19 pass */},
	/* 12 */ {Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 46},
	/* 13 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0x0000ffff, Jt: 4 /* 18 drop */},
	/* 14 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0, Jf: 4 /* 19 pass */},
	/* 15 */ {Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 50},
	/* 16 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 0, Jt: 1 /* 18 drop */},
	/* 17 */ {Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: 1, Jt: 0 /* 18 drop */, Jf: 1 /* 19 pass */},
	/* 18 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0}, // drop
	/* 19 */ {Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff}, // pass the whole frame
}

// guardTap attaches guardFilter to the tap device named ifname that process pid holds.
func guardTap(pid int, ifname string) error {
	fds, err := tapFds(pid, ifname)
	if err != nil {
		return err
	}
	if len(fds) == 0 {
		return fmt.Errorf("guard tap: process %d holds no tap device %s", pid, ifname)
	}
	pidfd, err := pidfdOpen(pid)
	if err != nil {
		return fmt.Errorf("guard tap: %w", err)
	}
	defer closeFd(pidfd)
	// The filter belongs to the device: attaching it through one descriptor covers every
	// queue, so the first one that works is enough.
	tfd, err := pidfdGetfd(pidfd, fds[0])
	if err != nil {
		return fmt.Errorf("guard tap: %w", err)
	}
	defer closeFd(tfd)
	if err := tunAttachFilter(tfd, guardFilter); err != nil {
		return fmt.Errorf("guard tap %s: %w", ifname, err)
	}
	return nil
}

// tapFds lists the descriptors of process pid that are tun/tap files for ifname (their
// fdinfo says "iff:\tNAME").
func tapFds(pid int, ifname string) ([]int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/fdinfo"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("guard tap: %w", err)
	}
	var fds []int
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if isTapFor(filepath.Join(dir, e.Name()), ifname) {
			fds = append(fds, fd)
		}
	}
	return fds, nil
}

func isTapFor(fdinfo, ifname string) bool {
	f, err := os.Open(fdinfo)
	if err != nil {
		return false // closed meanwhile
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "iff:"); ok && strings.TrimSpace(name) == ifname {
			return true
		}
	}
	return false
}

package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/network"
)

// The network of a network:true session (see the package doc, "Network on"): QEMU runs
// in a network namespace of its own, where its tap (qemuTap) and slirp4netns's tap
// (network.Interface, guarded against loopback destinations) are the two ports of a
// bridge; the bridge holds nsAddress, from which DialPort reaches the guest.
const (
	qemuTap    = "tap0"
	nsBridge   = "br0"
	nsAddress  = "10.0.2.100/24" // slirp4netns's own address for its namespace
	guestIP    = "10.0.2.15"
	netMTU     = 1500
	guestMAC   = "52:54:00:12:34:56"
	tapTimeout = 5 * time.Second
)

// networkAvailable says whether network:true sessions can be made here.
func networkAvailable() error {
	if _, err := exec.LookPath("slirp4netns"); err == nil {
		return nil
	}
	// Where Debian installs it, as internal/network looks (a bare PATH still finds it).
	for _, dir := range []string{"/usr/bin", "/usr/local/bin", "/bin"} {
		if fi, err := os.Stat(filepath.Join(dir, "slirp4netns")); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return nil
		}
	}
	return fmt.Errorf("%w: network true: the vm backend gives a guest outbound network through slirp4netns, which is not installed: run `apt-get install slirp4netns`, or init with network false", backend.ErrUnsupportedNetwork)
}

// startNetwork connects the network namespace of QEMU (pid) to the outside: slirp4netns
// with its tap guard (internal/network), then the bridge between its tap and QEMU's.
func startNetwork(ctx context.Context, pid int) (*network.UserNet, error) {
	u, err := network.Start(ctx, pid, network.Options{Tool: network.ToolSlirp4netns, MTU: netMTU})
	if err != nil {
		return nil, err
	}
	if err := bridge(pid); err != nil {
		u.Close()
		return nil, fmt.Errorf("the guest's network: %w", err)
	}
	return u, nil
}

// bridge makes br0 in pid's network namespace with slirp4netns's tap and QEMU's as its
// ports, and moves the namespace's address from slirp4netns's tap onto it.
func bridge(pid int) error {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	var tap netlink.Link
	deadline := time.Now().Add(tapTimeout)
	for {
		if tap, err = h.LinkByName(qemuTap); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("QEMU's %s: %w", qemuTap, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	slirp, err := h.LinkByName(network.Interface)
	if err != nil {
		return fmt.Errorf("slirp4netns's %s: %w", network.Interface, err)
	}
	addr, err := netlink.ParseAddr(nsAddress)
	if err != nil {
		return err
	}
	if err := h.AddrDel(slirp, addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("%s: drop %s: %w", network.Interface, nsAddress, err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: nsBridge, MTU: netMTU}}
	if err := h.LinkAdd(br); err != nil {
		return fmt.Errorf("add %s: %w", nsBridge, err)
	}
	for _, l := range []netlink.Link{slirp, tap} {
		if err := h.LinkSetMTU(l, netMTU); err != nil {
			return fmt.Errorf("%s mtu: %w", l.Attrs().Name, err)
		}
		if err := h.LinkSetMaster(l, br); err != nil {
			return fmt.Errorf("%s into %s: %w", l.Attrs().Name, nsBridge, err)
		}
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("%s up: %w", l.Attrs().Name, err)
		}
	}
	if err := h.AddrAdd(br, addr); err != nil {
		return fmt.Errorf("%s address: %w", nsBridge, err)
	}
	if err := h.LinkSetUp(br); err != nil {
		return fmt.Errorf("%s up: %w", nsBridge, err)
	}
	return nil
}

// dialGuest connects to the guest's port from inside QEMU's network namespace.
func dialGuest(ctx context.Context, pid int, port uint16) (net.Conn, error) {
	return network.DialInNetns(ctx, "/proc/"+strconv.Itoa(pid)+"/ns/net", "tcp", net.JoinHostPort(guestIP, strconv.Itoa(int(port))))
}

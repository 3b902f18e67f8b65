// Package network gives a sandbox's network namespace what the session's "network" member
// asks for, without changing anything on the host.
//
// # The two settings
//
// A sandbox always gets a network namespace of its own. With network:false that namespace
// is left as the kernel makes it, with only the loopback interface, which SetupLoopback
// brings up from inside (PID 1 calls it right after it starts): the session can talk to
// itself on 127.0.0.1 and to nothing else. With network:true the server also calls Start,
// which connects the namespace to the outside through a user-space network stack: a helper
// process on the host side owns a tap device (Interface, "eth0") inside the namespace,
// reads the frames the session sends, and replays each TCP connection, UDP flow and ping
// as ordinary sockets of its own on the host. The session therefore reaches what a process
// of the server reaches — and, by the protocol's rule, not the host's own loopback
// services.
//
// Nothing on the host changes: no bridge, no veth, no route, no iptables or nft rule. The
// only host-side object is the helper process, one per session. It dies with the server
// (a parent-death signal, plus slirp4netns's exit pipe) and is killed by Close; its tap
// device goes with it.
//
// # pasta or slirp4netns
//
// Both are user-space stacks packaged by Debian. Options.Tool "" takes pasta when it is
// installed, else slirp4netns:
//
//   - pasta (Debian package "passt") translates frames to host sockets without a TCP stack
//     of its own (it mirrors the peers' windows and acknowledgements instead of buffering),
//     copies the host's addressing into the namespace (same address, gateway, MTU) and
//     carries IPv6 when the host has it. It is started with no port forwarding in either
//     direction (-t/-u/-T/-U none: its default would forward every port the host listens
//     on into the namespace, which is exactly the host-loopback leak the protocol forbids)
//     and with --no-map-gw, so the gateway address is the real gateway rather than an
//     alias for the host's 127.0.0.1. As root it keeps uid 0 (--runas 0:0): the namespace
//     belongs to the host's user namespace, which "nobody" could not enter. It still drops
//     every capability but CAP_SYS_ADMIN and CAP_NET_BIND_SERVICE, enters mount, IPC and
//     UTS namespaces of its own and installs a seccomp filter.
//   - slirp4netns (Debian package "slirp4netns") runs libslirp, a complete TCP/IP stack in
//     user space, on a fixed private network (the session is 10.0.2.100/24, the gateway
//     10.0.2.2, the resolver 10.0.2.3), IPv4 only. It is started with
//     --disable-host-loopback (10.0.2.2 would otherwise be the host's 127.0.0.1) and with
//     its own sandbox and seccomp filter.
//
// slirp4netns is tried first, then pasta. pasta has the better design (no second TCP stack,
// IPv6, host-like addressing), but the build Debian 12 ships (a 2023-03 snapshot) does not
// show it on this kind of machine: here
// it started in ~9 ms against slirp4netns's ~4 ms, moved bulk data at a median of ~20 MB/s
// against ~110 MB/s, and reset one 64 MiB transfer in ten where slirp4netns reset none
// (BenchmarkOutbound, TestStartLatency). The order is one variable, preference; revisit it
// with a newer passt.
//
// # The tap guard
//
// Neither tool refuses a loopback destination: a frame for 127.0.0.1:P, 0.0.0.0:P or
// [::1]:P becomes a connection to the host's own service on P. The session's kernel never
// routes such a frame out of its interface, but a process with CAP_NET_RAW inside can
// write one straight onto the interface with an AF_PACKET socket, past every netfilter and
// tc hook of the namespace. Start therefore attaches a socket filter to the tap device
// itself (TUNATTACHFILTER, through a duplicate of the helper's descriptor taken with
// pidfd_getfd): the kernel runs it on every frame before the helper reads it, and the
// session has no handle on it. It drops IPv4 frames for 127.0.0.0/8 and 0.0.0.0/8, IPv6
// frames for ::1, :: and ::ffff:0:0/96, and every frame that is not IPv4, IPv6 or ARP.
// Dropping CAP_NET_RAW and CAP_NET_ADMIN in the sandbox remains worth doing too.
//
// # DNS
//
// The session's /etc/resolv.conf should name UserNet.DNS(). Both tools relay queries sent
// there (UDP and TCP, port 53 only) to the first resolver in the host's /etc/resolv.conf,
// including one that listens on the host's loopback (systemd-resolved, dnsmasq): DNS is
// the one loopback service a session reaches. With pasta the relay address is 169.254.1.53
// (link-local, so it shadows nothing routable); with slirp4netns it is 10.0.2.3. (pasta's
// -D option, which would name the resolver explicitly, is broken in the Debian 12 build:
// it relays to 0.0.0.0; so the relay follows the host's resolv.conf.)
//
// # Ports in
//
// The protocol's ports are not the helper's business: the server holds 127.0.0.1:H itself
// and, for each connection, DialInNetns makes a socket inside the session's namespace and
// connects it to 127.0.0.1:G there, which reaches a service bound to 0.0.0.0 as well as one
// bound to 127.0.0.1. A socket keeps the namespace it was created in, so the connection
// works from any thread afterwards.
//
// # Rootless
//
// When the sandbox has a user namespace of its own, the helper joins it (pasta --userns,
// slirp4netns --userns-path) to make its tap; Start itself only reads /proc/PID/net and
// needs no privilege over the namespace. Two limits stay with the host: the helper must be
// able to open /dev/net/tun (mode 0666 on distributions, 0600 in some containers), and an
// unprivileged server cannot setns into the sandbox's network namespace, so DialInNetns is
// for a root server; a rootless one needs the socket made inside and passed out.
//
// Elsewhere than Linux every function returns an error matching ErrUnsupported.
package network

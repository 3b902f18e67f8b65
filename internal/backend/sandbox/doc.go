// Package sandbox is the backend whose sessions run in Linux namespaces: a boundary that
// works wherever Linux does (no hardware virtualisation), starts in milliseconds, and that a
// command cannot leave. The session rules are the server's (internal/server); this package
// makes the boundary, reaches the executor inside it, and tears it down.
//
// # Processes
//
// Boot starts this same binary (/proc/self/exe) as `virtx __sandbox-init` (RunInit) with a
// mount, PID, UTS, IPC, cgroup and network namespace of its own — and, when the server is
// not root, a user namespace that maps root inside to the server's user (one uid, one
// gid: rootless needs nothing but user namespaces). That process is PID 1 of its PID
// namespace and is the session's executor (internal/executor, as a child subreaper, so it
// reaps what is orphaned to it). It has a session of its own (setsid: no terminal outside
// is reachable) and a parent-death signal (SIGKILL), and when PID 1 dies the kernel kills
// everything else in its PID namespace: a server killed in any way takes its sandbox with
// it. Every sandbox is forked from one OS thread that never exits, since the parent-death
// signal follows the thread that forked.
//
// Two socketpairs join server and init: fd 3 carries first the boot (a JSON frame: the
// overlays, trees, environment; then an init snapshot's bytes; the session's upper
// filesystem travels with it as a descriptor) and init's answer (with the new upper
// filesystem's descriptor when it made one), then the relay (internal/relay: relay.Serve
// inside with the executor, relay.Client as the Machine's Exec, Read, Write, Snapshot).
// fd 4 is for ports (see Network). With WithPrespawn (what `virtx serve` uses: one server,
// one session) the first init is started, and the host image checked, in the background
// as the backend is made, so their cost overlaps with the server's own start.
//
// Once the root filesystem is in place, init confines itself before it serves: the
// effective, permitted and bounding sets become Docker's default capability set (no
// CAP_SYS_ADMIN, SYS_MODULE, SYS_PTRACE, SYS_RAWIO, NET_ADMIN, SYS_TIME…), no_new_privs is
// set, and PID 1 is made non-dumpable, so a command — root inside — can neither mount,
// load modules, trace, change the host's clock or name, nor read PID 1's memory or
// descriptors; and PID 1 itself, which serves the client's read and write, holds no more
// than a command does (a write to /proc/1/mem gains nothing). Capabilities belong to
// threads: where the Go runtime owns every thread (a CGO_ENABLED=0 build) one
// AllThreadsSyscall reaches them all; in a cgo-linked binary init confines one locked
// thread and executes itself again (`__sandbox-init serve`), which costs a second process
// start (about 3.5 ms here). PID 1 ignores the signals a command may send it. Commands run
// as root (uid 0 inside) with PATH, HOME=/root and HOSTNAME set, nothing of the server's
// environment, and start in /root.
//
// # Root filesystem
//
// The root is overlayfs: read-only lowers and, per session, an upper directory that alone
// is the session's change. The default image — the only one until the image store (issue
// 4) — is the host image: the host's /usr and /opt (and /bin, /sbin, /lib* where they are
// directories; on a merged-/usr host they are the same symlinks into /usr), a curated
// /etc, and a skeleton of / (empty /tmp, /root, /run, /var/tmp, /home, mount points). The
// skeleton and the curated /etc are copied once into the cache directory
// (CACHE/sandbox/host-KEY), where KEY hashes what they are made from — the names, sizes,
// modes, owners and times of the curated /etc files and of every directory and regular
// file below the curated directories, and how /bin, /lib* stand — so a boot costs a few
// dozen stat calls and no copying, and a change on the host (a package upgrade, an edited
// resolv.conf) gives a new image. Images no process holds (a shared flock) are removed
// when a new one is built. The curated /etc is passwd, group, resolv.conf (its content, if
// a link), nsswitch.conf, hosts (written: localhost and the sandbox's name), hostname,
// ld.so.conf(.d), ld.so.cache, alternatives, ssl (less ssl/private), ca-certificates,
// os-release, localtime, timezone, profile(.d), bash.bashrc, environment, shells, skel,
// login.defs and the like (etcCurated), and of those only what everyone may read: never
// shadow, gshadow, sudoers, ssh host keys, machine-id. /root and /home of the host, /var,
// /srv, /mnt and the cache directory are not in the image at all.
//
// overlayfs does not see mounts below a lower directory, so the image is one overlay per
// host directory (/ from the skeleton, /usr, /opt, /etc), each with its upper at
// upper/TARGET of the session's upper filesystem: the uppers nest into one tree, and
// upper/ is the session's change, whole. The overlays are mounted with
// redirect_dir=nofollow, metacopy=off, index=off and userxattr (overlay's xattrs in the
// user. namespace, in both modes: rootless needs it, and init, confined, cannot read
// trusted. xattrs when it writes a snapshot). Lowers are a list (overlay.Lowers), so an
// image's layers are one overlay at / with several lowers.
//
// Then a fresh /proc of the PID namespace (as root, with /proc/sys, bus, fs, irq
// read-only and kcore, keys, sysrq-trigger, timer_list… hidden, as Docker does; rootless,
// the user namespace already denies them), a read-only sysfs of the sandbox's network
// namespace (/sys/firmware hidden), and a minimal /dev: a small nodev tmpfs with null,
// zero, full, random, urandom and tty bound from the host, a devpts instance of its own
// (ptmx), shm, and the fd, stdin, stdout, stderr links. Nothing is mounted anywhere but in
// the sandbox's own mount namespace, made private first: the host's mount table never
// changes, and a killed server leaves no mount behind. init pivots into the new root, and
// the host's tree is gone from the namespace.
//
// # The session's writes
//
// The upper filesystem is a tmpfs that is mounted nowhere: init makes it (fsopen,
// fsconfig size, fsmount: a detached mount) and hands its descriptor to the server, which
// holds it; each later boot gets it with its boot and attaches a copy (open_tree
// OPEN_TREE_CLONE), so the session's files outlive a stop — stop tears the boundary down
// and frees its processes' memory — and vanish with the server however it ends (the last
// descriptor closes), with a new init (a new session), or with Close. The tmpfs is sized
// by disk_gib, default DefaultDiskGiB (10 GiB, at most half the host's memory); a disk_gib
// over half the host's memory is UNSUPPORTED_MACHINE (a disk-backed upper is not built). A
// tmpfs is a ceiling, not an allocation, but what a session writes there is memory:
// charged to the memory cgroup of the process that writes it, so it counts against
// memory_mib once limits are enforced. An init snapshot is applied (executor.ApplyLayer,
// user. xattrs) to a new upper before anything is mounted over it, and counts against
// disk_gib; a snapshot is executor.WriteLayer of upper/, written by init inside the
// sandbox, so no path in it is ever followed on the host.
//
// # Trees
//
// A file:// tree is its host directory bound (with the mounts below it) at its guest path,
// in the order init gave them, so a tree at /work/out lands inside one at /work. Mount
// points are made as needed, resolved inside the new root (openat2 RESOLVE_IN_ROOT), so a
// symlink in the image or in an earlier tree cannot place a tree elsewhere; a tree's own
// symlinks resolve inside the sandbox, never to the host. Trees are nosuid and nodev, and
// an ro tree is a read-only mount (set before it is attached), so a command gets EROFS
// and the write method IO_FAILED. A host directory that is not there is MOUNT_FAILED at
// boot; a scheme other than file:// is UNSUPPORTED_MOUNT at init; a tree at or under
// /proc, /sys or /dev is INVALID_PARAMS.
//
// # Network
//
// Each sandbox has a network namespace of its own with loopback only, up. A network:true
// session is given its way out by startNetwork (the seam for internal/network: pasta or
// slirp4netns); until that is wired, it has loopback only too. A port is dialed from
// inside: init connects to 127.0.0.1 (or ::1) in its namespace and hands the connected
// socket to the server over fd 4, because a server without privileges cannot enter a
// network namespace its user namespace owns (setns needs CAP_SYS_ADMIN in the caller's
// own user namespace too); one way serves root and rootless alike.
//
// # Machine shape
//
// vcpus, memory_mib, gpu true and gpu_memory_mib are UNSUPPORTED_MACHINE until the cgroup
// integration: a session is never given a machine of a shape that is not enforced.
// disk_gib is the upper's size (above). gpu false is what a sandbox is.
//
// # Rootless
//
// As an ordinary user the same boundary is made in a user namespace. What differs: files
// of the host image that belong to host users other than the server's (all of /usr and
// /opt) show as nobody:nogroup, and writing under them fails (EPERM: overlayfs cannot copy
// a file up to the owner it had, since no namespace of the user maps host root); /,
// /etc, /root, /tmp, /var and the trees are writable as usual. The cache directory must be
// writable by the user (VIRTX_HOME).
//
// # What is hand-rolled
//
// The boot handshake is four bytes of length and a JSON document each way (encoding/json;
// it is private to a server and the init it started, not the console protocol), and the
// port dial is two bytes of port number each way answered with a byte and a descriptor.
// Everything else is x/sys/unix through internal/linux, vishvananda/netlink for lo, and
// the executor and relay packages.
package sandbox

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
// start (about 3.5 ms here). The bounding set is a thread's own too, and a child starts
// with its forking thread's: every command is started from one thread (the executor's
// StartOn), locked, whose bounding set init confines as it starts — beside the root
// filesystem's making, not after it — and before the process-wide capset (that thread's
// last step writes its sets back as it read them, which the capset would make a refused
// raise). PID 1 ignores the signals a command may send it (handlers installed as it
// starts). Commands run as root (uid 0 inside) with PATH, HOME=/root and HOSTNAME set,
// nothing of the server's environment, and start in /root.
//
// An idle session costs little memory: after linux.IdleTrimAfter (2 s) without a request,
// init and the server hand back their mappings of the binary's code and read-only data
// (linux.IdleTrimmer: madvise, the pages stay in the page cache, shared), from ~10 MiB
// resident each to ~3.5 MiB; the next request maps what it touches again.
//
// # Root filesystem
//
// The root is overlayfs: read-only lowers and, per session, an upper directory that alone
// is the session's change. The default image (init without image) is the host image: the host's /usr and /opt (and /bin, /sbin, /lib* where they are
// directories; on a merged-/usr host they are the same symlinks into /usr), a curated
// /etc, and a skeleton of / (empty /tmp, /root, /run, /var/tmp, /home, mount points). The
// skeleton and the curated /etc are copied once into the cache directory
// (CACHE/sandbox/host-KEY), where KEY hashes what they are made from — the names, sizes,
// modes, owners and times of the curated /etc files and of every directory and regular
// file below the curated directories, and how /bin, /lib* stand — so a boot costs a few
// dozen stat calls and no copying, and a change on the host (a package upgrade, an edited
// resolv.conf) gives a new image. Images no process holds (a shared flock) and none has used
// for an hour are removed when a new one is built (two virtx builds sharing a cache keep
// their own). The curated /etc is passwd, group, resolv.conf (its content, if
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
// # Images
//
// An init's image (a ref, a digest or a recipe) is resolved through the image store
// (internal/store, in the cache dir) at init, by Admit: a ref the store lacks is pulled
// (registry mirrors: VIRTX_REGISTRY_MIRRORS or <cache>/mirrors.conf), a recipe is built or
// found in the build cache, and an unknown ref or digest is UNKNOWN_IMAGE naming it. The
// image's leases on its layers are held from that init until another init replaces the
// session, or the backend closes: layers a running session stands on are never collected.
// The session's root is then one overlay at / (not the host image's per-directory ones),
// the image config's Env is every command's environment (PATH, HOME and HOSTNAME added
// when it sets none, as docker does), and its WorkingDir is init's cwd ("/" when it sets
// none), made at boot if the layers lack it.
//
// The store's layers mark opaque directories with trusted.overlay.opaque (and whiteouts
// as 0/0 devices), while the session's overlay keeps userxattr, so that a confined init
// can read its upper's markers when it writes a snapshot or a RUN step's layer. So init
// stacks the layers first in a read-only overlay of their own, in the trusted namespace
// (fsconfig lowerdir+, one layer per call: no option-length limit on Linux 6.8 and
// later; older kernels get one lowerdir= of names relative to the layers' directory, so
// about 60 layers), a detached mount that is the session overlay's one lower. An image of
// one layer needs no stack. Images need a root server: the store's layers cannot be
// written or stacked without privileges, and a server that is not root refuses an image
// at init with UNSUPPORTED_IMAGE (-32011) saying so, and RUN steps the same way; list,
// remove, and builds without RUN work rootless.
//
// A cgo-linked init confines itself by executing itself again, after the pivot, and an
// image's root has no loader or libc for this binary (busybox has none, alpine has musl).
// So an init on an image opens, before the pivot, the host's program interpreter, its own
// executable and the directories of the libraries it has mapped, and executes the
// interpreter by descriptor with those directories (as /proc/self/fd/N) as its only
// library path; the serving stage closes them first thing. Nothing of the host is mounted
// in the image.
//
// The Backend is the server's backend.ImageStore (build_image, list_images,
// remove_image) and the store's StepRunner (RunStep), which `virtx image build` uses
// too: each RUN is `sh -c` in a sandbox of its own on the image so far (a new upper; the
// session's is not touched), with the accumulated ENV and WORKDIR (made when missing),
// with the network a network:true session has where this host has a user-space stack
// (loopback only where it has none), and no cgroup limits. Its output reaches the build's
// output once the command has ended (stdout, then stderr; not streamed as it runs). A
// non-zero exit fails the build with that output. The step's layer is its upper as
// executor.WriteLayer writes it, less the mount points init made where the image had
// none (/proc, /sys, /dev, /etc/resolv.conf).
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
// memory_mib (see Machine shape). An init snapshot is applied (executor.ApplyLayer,
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
// Each sandbox has a network namespace of its own with loopback only, up. network false
// is that and nothing more (init checks, before it runs anything, that lo is all its
// namespace holds). network true — the protocol's default — connects the namespace to
// the outside through a user-space stack, one helper per session (internal/network:
// slirp4netns as root, pasta rootless, since slirp4netns confining itself cannot work
// from outside the session's user namespace): an interface eth0 with a default route,
// and nothing changed on the host (no bridge, veth, route or netfilter rule). The helper
// starts beside init's boot (it needs only init's namespaces); the boot mounts the
// session's own /etc/resolv.conf, a file on a tmpfs of its own bound over the image's, so
// neither the image nor the session's writes (nor a snapshot) hold it; and once the
// helper is up, Boot writes into it the helper's resolver (u.DNS(): slirp4netns 10.0.2.3)
// before it returns. The first command therefore finds the network up and its resolver
// named. The helper dies with the server and is stopped at shutdown; its tap device goes
// with it. With WithPrespawn the helper for the init spawned ahead is started as soon as
// the first init says network true (Admit), not before: stopping one a network false
// session does not want costs the kernel milliseconds of tap teardown. The host's
// loopback services stay out of reach: slirp4netns runs with
// --disable-host-loopback, pasta with --no-map-gw and no port forwarding, and the tap
// guard internal/network attaches drops frames for 127.0.0.0/8 and ::1 before the helper
// sees them. That guard is why commands keep CAP_NET_RAW (Docker's default set: ping
// works): a raw frame written straight onto eth0 is filtered like any other.
//
// A port is dialed from inside: init connects to 127.0.0.1 (or ::1) in its namespace
// and hands the connected socket to the server over fd 4, because a server without
// privileges cannot enter a network namespace its user namespace owns (setns needs
// CAP_SYS_ADMIN in the caller's own user namespace too); one way serves root and
// rootless alike.
//
// # Machine shape
//
// A session's machine is a cgroup (internal/linux/cgroup, v1 or v2), made for each boot
// before its init is spawned (or ahead, with the init WithPrespawn starts, for the default
// machine), and init is born inside it (cgroup.Group.StartProcess: the thread that forks
// init steps into the group's v1 hierarchies for the fork, and clone3 CLONE_INTO_CGROUP
// places init in the v2 one) — so init, and everything a command starts, however it
// daemonises, never runs outside it — and destroyed (everything in it killed) when the
// sandbox shuts down. Moving a process into a cgroup instead waits for an RCU grace period
// (5–9 ms on this project's CI machine), and is not done: when a session asks for another
// machine than the default one, the init spawned ahead (born in a group made for the
// default machine, and which has started nothing yet) keeps its group, whose limits are
// rewritten. Only should that fail is init moved to a new group: the move goes on while
// init builds its root filesystem, and Boot waits for it before it returns — and before
// the boot when an init snapshot is to be written, so that its pages are charged to the
// session:
//
//   - memory_mib is the group's memory limit, swap included where the kernel accounts it.
//     The session's upper filesystem is a tmpfs: what a session writes there is memory
//     charged to this group, so writes count against memory_mib as well as disk_gib
//     (ask for memory_mib ≥ what the session keeps in memory plus what it writes). Past
//     the limit the kernel's OOM killer kills one process of the session, the one with
//     the most memory (a memory bomb: exec answers 137); the session goes on. Files
//     belong to no process, so when it is writes that fill memory_mib the process killed
//     may be init itself (about 10 MiB resident, most of it the binary): that exec fails
//     (BOOT_FAILED, the machine went away) and the server boots a new machine, with the
//     session's files, on the next call. Init is not given oom_score_adj -1000: every
//     command would inherit it (the executor starts them, and has no hook to reset it
//     between fork and exec), and a memory bomb nobody may kill hangs in its page fault
//     rather than dying.
//   - vcpus is a CPU-time quota of that many CPUs and, where the cpuset controller is
//     there, a cpuset of that many of the server's CPUs (spread over sessions), so nproc
//     inside answers vcpus. More vcpus than the server may run on is UNSUPPORTED_MACHINE:
//     never a quietly smaller machine. So is more memory than the host has.
//   - every session has a pids limit of DefaultPids (4096 tasks, threads included): a
//     fork bomb stops there. The executor is a few dozen threads of it, made ahead
//     (initThreads) so that PID 1 never needs a new thread when the commands have taken
//     them all (the Go runtime aborts when it cannot make one).
//   - Left out, vcpus is DefaultVCPUs (2, or the server's CPUs if fewer) and memory_mib
//     DefaultMemoryMiB (2048, or the host's memory if less): the default machine is a
//     limit like any other, enforced or refused.
//
// Where the limits cannot be enforced — rootless on a cgroup v1 host (this project's CI
// machine), rootless without a delegated v2 cgroup, a read-only cgroupfs — init is
// UNSUPPORTED_MACHINE, with the cgroup package's fix (run as root, or under `systemd-run
// --user --scope -p Delegate=yes`) — also a session that asks for nothing, since it
// would get the default machine. A server started with VIRTX_SANDBOX_NO_LIMITS=1
// (NoLimitsEnv) runs sessions that ask for nothing without any cgroup: a choice its
// operator makes, never a silent one; vcpus or memory_mib are refused all the same.
//
// When a command's exec ends without a result (timeout_ms), the executor has killed its
// process tree; what it daemonised — a new session whose parent exited, re-parented to
// init — is not in that tree, so the server then kills every process of the session's
// group that was not there when the command started (commands of a session never run
// concurrently, so those are the command's), except init. What earlier commands left
// running stays.
//
// A server killed with SIGKILL cannot remove its groups: it starts a reaper, a small
// shell in a session of its own that waits for the server to go (EOF on a pipe only the
// server holds) and then kills what is left in the server's groups and removes them —
// started as the backend is made, or (WithPrespawn) once the init spawned ahead has
// been, rather than before its group (a process start that need not delay init's), and
// every boot waits for it before it returns, so nothing a session runs is ever without
// one; and a new backend removes groups of dead servers (cgroup.ReapStale) at the same
// moment.
//
// gpu true hands the host's NVIDIA devices (/dev/nvidia0…, nvidiactl, nvidia-uvm,
// nvidia-modeset, nvidia-caps) to the session, bound into its /dev; the driver's
// user-space libraries and nvidia-smi are the host's /usr, which the host image is made
// of. With no NVIDIA device it is UNSUPPORTED_MACHINE. gpu_memory_mib is refused
// (UNSUPPORTED_MACHINE): the devices are the session's whole, and nothing on the host
// caps one process's GPU memory. disk_gib is the upper's size (above).
//
// # Rootless
//
// As an ordinary user the same boundary is made in a user namespace. What differs: files
// of the host image that belong to host users other than the server's (all of /usr and
// /opt) show as nobody:nogroup, and writing under them fails (EPERM: overlayfs cannot copy
// a file up to the owner it had, since no namespace of the user maps host root); /,
// /etc, /root, /tmp, /var and the trees are writable as usual. The cache directory must be
// writable by the user (VIRTX_HOME). network true needs pasta (Debian: passt) and a
// /dev/net/tun the user may open (Debian's is 0666; a container's may be root's only:
// UNSUPPORTED_NETWORK names the fix). Limits need a delegated v2 cgroup (Machine shape).
//
// # What is hand-rolled
//
// The boot handshake is four bytes of length and a JSON document each way (encoding/json;
// it is private to a server and the init it started, not the console protocol), and the
// port dial is two bytes of port number each way answered with a byte and a descriptor.
// Everything else is x/sys/unix through internal/linux, vishvananda/netlink for lo, and
// the executor and relay packages.
package sandbox

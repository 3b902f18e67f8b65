// Package vm is the backend whose sessions are disposable QEMU microVMs: a kernel of
// the session's own between the commands and the host, with the same executor inside
// (the virtx binary itself, as the guest's /init: internal/guest).
//
// # A boot
//
// Boot starts two processes per session and talks to the guest over one stream:
//
//   - virtiofsd (QEMU 7.2's, /usr/lib/qemu/virtiofsd) serves the guest a tree built for
//     this boot: base/ is the host image, trees/N the session's trees, config.json what
//     the guest needs to know (internal/guest.Config), snapshot.tar an init snapshot.
//     The tree is a tmpfs with bind mounts made in a mount namespace of virtiofsd's own
//     (see spawner): the host's namespace never sees a mount, so a killed server leaves
//     none. Read-only trees and the image are read-only binds there (mount_setattr,
//     recursive), so nothing in the guest — not even its root remounting the tree or
//     mounting the share again — can write them.
//   - QEMU: `-M microvm` with ACPI, no firmware (the kernel's ELF is booted by PVH),
//     `-nodefaults -no-user-config -display none -no-reboot`, guest memory as a shared
//     memfd (vhost-user needs it), `-global virtio-mmio.force-legacy=false` (virtiofs
//     needs modern virtio), the kernel command line with `tsc_early_khz=<host kHz>
//     tsc=reliable no_timer_check` (without them, measured here, 2 boots in 5 hang
//     under TCG) and `panic=-1` (a dead guest ends QEMU).
//   - The control channel is a virtio-serial port named "virtx.0" whose host end is a
//     unix socket we listen on before QEMU starts (QEMU connects as it starts, so there
//     is no polling for a socket). A boot is up when a request sent down it is
//     answered; relay.Client then carries exec/read/write/snapshot. BootTimeout bounds
//     a boot; QEMU that exits early turns into BOOT_FAILED with the tail of its log, of
//     virtiofsd's and of the guest console.
//
// # What a session is given
//
//   - Machine shape: vcpus → -smp (default 2, at most the host's CPU count),
//     memory_mib → -m (default 2048, at least 128, at most the host's RAM), disk_gib →
//     the size of the session disk (default 16, sparse). A shape outside those bounds is
//     UNSUPPORTED_MACHINE at init, never a smaller machine; so is gpu:true (no device
//     is passed through).
//   - The session disk is a sparse file made with O_TMPFILE in the cache's run dir — it
//     has no name, so nothing can leak it — formatted ext4 by the host's mkfs.ext4 (from
//     e2fsprogs, always on Debian) and handed to QEMU as /dev/fd/3. It holds the
//     overlay's upper: the session's writes. A stop keeps the file open (the next boot
//     sees the writes, as upstream); a new init drops it, and so does the server's exit.
//   - The host image, read-only: the host's /usr, /bin, /sbin, /lib*, /opt and a
//     curated /etc (hostImageEtc: users, groups, hosts, resolver and library config,
//     certificates, os-release, localtime, profile — never shadow files, ssh keys,
//     /root, /home or virtx's cache). It is shared by virtiofs rather than copied into
//     an erofs image: measured here, mkfs.erofs takes ~2 s and ~1 GB per GB of tree,
//     and the host image is 6.4 GB (/usr and /opt) that changes with every package
//     installed, so an erofs of it would cost ~15 s and 6 GB whenever its key changed;
//     the share costs ~20 ms per boot.
//   - An OCI image (init's image): Admit resolves it through the image store
//     (internal/store: a ref the store lacks is pulled, a recipe without RUN steps
//     built; RUN steps need a StepRunner the vm backend does not have yet, so such a
//     recipe is UNSUPPORTED_IMAGE) and holds its lease until a later init replaces the
//     session; init answers the image's WORKDIR as the cwd (the guest makes it when the
//     layers lack it) and the image's Env is every command's (PATH, HOME and HOSTNAME
//     added when it sets none, as docker does). The layers — the store's unpacked
//     directories, whiteouts as 0/0 character devices and opaque directories marked
//     trusted.overlay.opaque=y — are bound read-only into a second tmpfs (0 the top …
//     N-1) served by a second virtiofsd (tag virtx-img) with `-o xattr` and
//     `modcaps=+sys_admin`, without which the guest's getxattr of trusted.* reads
//     nothing (the kernel hides trusted.* from a process without CAP_SYS_ADMIN) and
//     opaque directories would leak their lowers. That daemon serves a tree that is
//     read-only end to end, so the attributes it passes are only ever read; the main
//     share keeps xattrs off, so a guest cannot set trusted.* or security.* attributes
//     on a read-write tree. The guest stacks the layers as the lowers of its one root
//     overlay, under base/, which on an image holds only the mount points (proc, sys,
//     dev, run) and an etc/ with hosts, hostname and, with a network, resolv.conf (each
//     made with the attributes of the image's own, so the merged directories look as
//     the image made them).
//     Why virtiofs and not an erofs per layer: mkfs.erofs is quick (0.39 s for the
//     54 MB of /usr/lib/python3.11 here), but microvm has 24 virtio-mmio slots, four
//     already taken (share, console port, disk, NIC), so an image of more than ~19
//     layers would not fit one device per layer, every layer would be stored twice,
//     and the first boot on an image would pay the build; the share costs nothing up
//     front, takes any number of layers and is what the host image already uses.
//     Measured: a cold session on the 3-layer test image is as fast as one on the
//     host image (TestVMImage, BenchmarkVMColdSessionImage).
//   - Network off: no NIC at all (only lo). Network on: outbound through slirp4netns,
//     with internal/network's guard, in a network namespace of QEMU's own. QEMU is
//     started in a new network namespace with a tap (tap0) as the guest's virtio-net
//     backend; network.Start gives that namespace slirp4netns's tap (eth0, the
//     fixed 10.0.2.0/24 network: gateway 10.0.2.2, DNS relay 10.0.2.3) with
//     --disable-host-loopback and the socket filter on the tap that drops every frame
//     for 127.0.0.0/8, 0.0.0.0/8, ::1 and the like before slirp4netns reads it; the two
//     taps are the ports of a bridge (br0, 10.0.2.100), so the guest's frames reach
//     slirp4netns as they are, and the guest keeps its static 10.0.2.15/24 with
//     10.0.2.3 in /etc/resolv.conf. The alternatives measured or read first: QEMU 7.2's
//     own slirp maps 10.0.2.2 to the host's loopback with no switch to turn that off
//     alone (restrict=on, used before, stops all outbound traffic); passt over
//     `-netdev stream` has --no-map-gw, but neither it nor libslirp refuses a loopback
//     destination, and the guest is root: a frame for 127.0.0.1 written straight onto
//     its NIC (AF_PACKET) would become a connection to the host's own service. The
//     guard on slirp4netns's tap is where that frame is stopped, and TestVMNetworkOutbound
//     writes one. Nothing on the host changes: the namespace, both taps and the bridge
//     exist only while QEMU lives; slirp4netns dies with the server (parent-death
//     signal and its exit pipe) and is killed at shutdown.
//   - Ports: the server holds 127.0.0.1:H from init to quit and calls DialPort(G) per
//     connection, which connects from inside QEMU's network namespace (from the
//     bridge's 10.0.2.100) to 10.0.2.15:G. A guest service must listen on the guest's
//     address (0.0.0.0 or 10.0.2.15), not only on its loopback; a session without a
//     network has no ports.
//   - Snapshot: the guest's upper as an OCI layer tar (executor.WriteLayer, inside the
//     guest); init.snapshot is applied into a fresh upper (executor.ApplyLayer) before
//     anything runs.
//   - Inside the guest, PID 1 and everything it starts share a pids cgroup (one process
//     per MiB of memory, at least 512), so a fork bomb stops there; the OOM killer ends
//     a memory hog (never PID 1). A guest that does not answer ExecGrace after an
//     exec's own timeout is taken as hung: QEMU is killed and the call is BOOT_FAILED
//     as backend.ErrMachineGone, so the server drops the machine and the next call
//     boots a new one (a guest that dies on its own ends the same way: relay.Client
//     answers ErrMachineGone).
//
// # Cold start
//
// Measured under TCG on this 2-core host (BenchmarkVMColdSession: spawn a server, init,
// first exec answered; medians of 10): 2.13 s before the changes below, 1.91 s after.
// Where a boot's time goes now: QEMU's own start ~70 ms; the Debian cloud kernel to
// /init ~1.0 s of real time (its printk clock runs slow until the TSC is marked stable
// — compare "sched_clock: Marking stable"); the Go runtime and package init()s of this
// binary ~120 ms (GODEBUG=inittrace=1 on the kernel command line: 75 ms of init()s,
// the largest klauspost/compress's snapref 14 ms, go-digest's regexps 12 ms,
// stripansi 7 ms, all linked in for the image store and the CLI); then modules, the
// share, the disk, the root and the network ~0.3 s. What was cut:
//
//   - lpj= on the command line: the secondary vCPU no longer calibrates its delay loop
//     (~200 ms under TCG, and the calibration fails there anyway).
//   - Module signatures are stripped when the initramfs is built (Kernel.
//     StripSignatures, for the provisioned Debian kernel only): no SHA-512 and RSA
//     verification per module per boot.
//   - /init loads modules in the background and mounts the share and the disk as soon
//     as their drivers are in, and brings the network up while the root is put
//     together; the NIC's modules load only when there is a NIC (virtx.net).
//   - mitigations=off and lsm=landlock,yama,bpf (AppArmor, TOMOYO have no policy here).
//   - The initramfs is found by a stat-keyed memo of the executable's hash instead of
//     hashing ~15 MB per cold start.
//
// Measured and left: -cpu Nehalem or qemu64 boot ~150 ms faster than max under TCG
// (4 samples each: ~1.8 s against ~1.95 s for `virtx run -- true`; max,la57=off
// changes nothing), but they lack AVX/AVX2, and images built for x86-64-v3 need them,
// so max stays the default (VIRTX_VM_CPU picks another); stripping the guest binary's
// DWARF (16 → 11 MB initramfs) changes nothing measurable; nor do init_on_alloc=0 or
// rcupdate.rcu_expedited=1.
//
// The ≤ 1.5 s goal is not met under TCG: the kernel's own initcalls (ACPI, inet,
// inet6, kcompactd, …, ~0.5 s of the ~1 s, none of which a command line can drop
// safely) and this binary's init()s would need a kernel built for the guest or a
// separate guest binary; restoring a booted guest from a memory snapshot (-incoming,
// ~0.11 s measured) is the way under that, left for the snapshot issue.
//
// # Acceleration
//
// KVM is used only when the CPU shows vmx or svm, /dev/kvm answers KVM_CREATE_VM, and no
// earlier KVM boot of this cache failed; a KVM boot that misses BootTimeout is recorded
// (<cache>/vm/kvm-broken) and the boot is retried, and later ones made, under TCG. On a
// PVM-only KVM host such as this one the CPU shows neither flag, so guests run under TCG
// from the start. VIRTX_VM_ACCEL=tcg|kvm forces the choice, VIRTX_VM_CPU the -cpu model.
//
// # Provisioning
//
// Everything lives in the cache dir (console.CacheDir): vm/kernel2/<version>/ holds the
// PVH vmlinux and the guest's modules, vm/guest/ a static virtx when this one is not,
// vm/initramfs/ the initramfs per guest binary and kernel, vm/run/ the run dirs.
// `virtx setup vm` provisions it all, and so does the first boot when anything is
// missing: the kernel is Debian's cloud kernel (apt-get download of
// linux-image-cloud-amd64's versioned dependency, dpkg-deb -x into a temp dir), whose
// bzImage payload is LZ4 in the kernel's legacy framing (decompressed with
// github.com/pierrec/lz4's block decoder) holding the ELF vmlinux with the PVH entry
// note; its modules come with their dependencies read from each module's .modinfo
// (the package ships no modules.dep). $VIRTX_KERNEL overrides the kernel. The guest's
// /init is this executable when it is static, else a CGO_ENABLED=0 build of
// virtx.dev/virtx/cmd/virtx (development and tests), cached per executable hash.
// The initramfs is written by our own newc cpio writer (cpioWriter: the format is 110
// bytes of hex header per entry, and three entry kinds are all we write), with no
// busybox: the image supplies userland.
//
// # Nothing leaks
//
// QEMU and virtiofsd are started from one locked OS thread with SIGKILL as their
// parent-death signal, so they die with the server even when it is SIGKILLed; the run
// dir records their pids with start times, and the next boot of any server reaps the
// run dirs of dead servers (killing only processes whose start time still matches).
// Shutdown closes the channel (the guest kills everything, syncs and powers off), waits
// ShutdownGrace, then kills QEMU by PID; virtiofsd is killed and the run dir removed.
package vm

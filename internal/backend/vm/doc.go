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
//     recipe is UNSUPPORTED_IMAGE), makes its erofs disk (below) and holds both — the
//     lease on its layers, the disk open — until a later init replaces the session;
//     init answers the image's WORKDIR as the cwd (the guest makes it when the image
//     lacks it) and the image's Env is every command's (PATH, HOME and HOSTNAME added
//     when it sets none, as docker does). The guest's root overlay has the disk's
//     erofs as its one lower under base/, which on an image holds only the mount points
//     (proc, sys, dev, run) and an etc/ with hosts, hostname and, with a network,
//     resolv.conf (each made with the attributes of the image's own, read from the
//     layers, so the merged directories look as the image made them).
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
// # An image's erofs disk
//
// One erofs per image, the layers flattened, made by Debian's mkfs.erofs (erofs-utils;
// missing, an image is BOOT_FAILED naming `apt-get install erofs-utils`):
//
//   - Flattening: the store's unpacked layers (whiteouts as 0/0 character devices,
//     opaque directories marked trusted.overlay.opaque=y) are stacked as a read-only
//     overlayfs in a mount namespace of mkfs.erofs's own (the spawner's private
//     namespace, as the share's), so the host kernel applies whiteouts and opaque
//     directories exactly as a session's root would and hides its own trusted.overlay.*
//     attributes; mkfs.erofs --preserve-mtime reads the merged tree and keeps modes,
//     owners, mtimes, the other xattrs (security.capability included), device nodes,
//     fifos, symlinks and hard links (one inode: mkfs.erofs knows them by the lower's
//     device and inode). Uncompressed: the guest reads it under TCG, where decompressing
//     would cost its vCPUs at every read. A layer an image has twice is stacked once
//     (overlayfs refuses a directory twice; the upper copy already has it all).
//   - Cache: the store's derived files (store.Derived), at
//     <cache>/images/derived/<manifest hex>/vm-<format>.erofs, keyed by the image's
//     digest: made in the store's tmp/ and published by rename, under the gc lock
//     (shared) and a lock per file, so two servers asking at once make it once (the
//     second waits and opens the first's); the store's collector deletes it with the
//     image (`virtx image rm`, or any Remove, through GC), and a new format number
//     deletes the old file at its next use. A session holds its image's erofs open
//     from Admit on, so a removal under it only unlinks the name: QEMU still reads the
//     file, the next boot of that session too, and the space comes back when the
//     session is replaced. An image the index no longer names gets a file that is
//     never published (unlinked at once).
//   - The guest: QEMU gets the open file as /dev/fd/4, `-drive
//     file=/dev/fd/4,format=raw,if=none,readonly=on` and `-device
//     virtio-blk-device,serial=virtx-image`: read-only down to the file QEMU opens, and
//     the guest kernel refuses writes to a read-only virtio disk even after
//     `blockdev --setrw` (TestVMImage tries that, a dd over it and a read-write mount,
//     and checks the file's hash). The guest tells its disks apart by
//     /sys/block/vdX/serial — the image's says virtx-image, the session disk has none —
//     not by the order the driver finds them in, mounts the image's erofs read-only at
//     /mnt/image, and loads the erofs module (and its libcrc32c) only when an image's
//     disk is there.
//   - Why one erofs per image, not per layer and not a share of the layers (the way
//     before: a second virtiofsd with xattrs passed through and CAP_SYS_ADMIN kept for
//     trusted.overlay.*): one device whatever the layer count (microvm has 24
//     virtio-mmio slots, four taken), one lower in the guest's overlay instead of N
//     (every lookup that misses walks them all, under TCG), no second virtiofsd per
//     boot, and no host directory of the image's reachable from the guest at all. It
//     costs the image's bytes once more per image (layers shared between images are not
//     shared between their erofs files) and a build at the first use of an image on this
//     cache: measured here, 0.5 s for a 206 MB Debian minbase tree (6,768 entries, a
//     200 MB erofs; page cache warm).
//   - Why mkfs.erofs and not an erofs writer in Go: there is none to depend on, and
//     writing one means the whole on-disk format — superblock, compact and extended
//     inodes, directory blocks with their name-offset tables and sorted entries,
//     inline tail data, shared and inline xattrs with their prefix table, hard links by
//     nid, device numbers — thousands of lines whose bugs would be corrupt roots that
//     the guest kernel only partly checks. mkfs.erofs is the erofs maintainers' own
//     writer, packaged by Debian 12 (1.5, what the flags above are checked against), and
//     fsck.erofs checks its output. What a Go writer could add — reading the layer tars
//     without root and without a mount — gains nothing here: images need root anyway
//     (the layers' whiteouts and trusted.* marks), the layers are unpacked already,
//     and the overlay flattens them with the kernel's own semantics. erofs-utils 1.5
//     has no --tar (1.7 does), hence the overlay mount.
//   - Measured (BenchmarkVMColdSessionImage: a new server, init, one exec; medians of 5,
//     alternated with sessions on the host image; three runs before and after, on
//     this 2-core host with little else running): a cold session on the cached erofs
//     of the 3-layer test image takes 2137–2200 ms (the host image, same runs:
//     2028–2189 ms); on the layers' virtiofs share it took 2147–2224 ms (host
//     2093–2174 ms) — no difference five samples can show. In the guest the erofs
//     module loads while the session disk is mounted (0.05–0.3 s of guest time under
//     TCG, on vCPUs the rest of the boot wants too); a kernel with erofs built in has
//     none of that. The build at an image's first use: ~5 ms for the unit tests'
//     image, 0.5 s for the 206 MB Debian minbase (above).
//
// # Cold start
//
// Measured under TCG on this 2-core host (BenchmarkVMColdSession: spawn a server, init,
// first exec answered; medians of 10): 2.13 s at first, 1.91 s with the command-line
// and /init changes below on Debian's cloud kernel, 1.38 s on the kernel built for the
// guest (goal 1.5 s). Where a boot's time goes now, in wall time (a poller on the
// console log): ~0.1 s from `virtx run` to QEMU's start (server start, the session disk,
// the share and virtiofsd); ~0.15 s QEMU's own start until the kernel's first line;
// ~0.55 s the kernel to /init (the guest's printk clock reads ~0.5 s: it runs slow
// until the TSC is marked stable); ~0.2 s the Go runtime and this binary's package
// init()s under TCG (GODEBUG=inittrace=1 on the kernel command line: ~80 ms of
// init()s, the largest klauspost/compress's snapref 14 ms, stripansi 6 ms and
// go-digest 4 ms, all linked in for the image store and the CLI); ~0.1 s the share,
// the disk, the root and the network; then the first exec (~45 ms: a fork and exec in
// the guest under TCG). What was cut:
//
//   - The kernel built for the guest (BuildKernel, `virtx setup vm --build-kernel`;
//     guest-kernel.config says what is in it): every driver built in, so /init loads
//     no modules; nothing probed that a microvm lacks; struct pages initialised after
//     SMP (DEFERRED_STRUCT_PAGE_INIT: ~60 ms of a 2 GiB guest); loop devices on demand.
//     Its initcalls take ~0.28 s under TCG against ~0.52 s for the cloud kernel's, and a
//     cold session 1.38 s against 2.3 s in the same hour. The cloud kernel stays the
//     fallback (fetched by every `virtx setup vm`, booted by TestVMKernels).
//   - lpj= on the command line: the secondary vCPU no longer calibrates its delay loop
//     (~200 ms under TCG, and the calibration fails there anyway).
//   - Module signatures are stripped when the initramfs is built (Kernel.
//     StripSignatures, for the provisioned Debian kernel only): no SHA-512 and RSA
//     verification per module per boot.
//   - /init loads modules (if any) in the background and mounts the share and the disk
//     as soon as their drivers are in, and brings the network up while the root is put
//     together; the NIC's modules load only when there is a NIC (virtx.net).
//   - The session disk has no journal (~80 ms of jbd2 and journal checks at the mount
//     under TCG) and is copied from a template formatted once per size (newSessionDisk:
//     ~2 ms against 25–70 ms of mkfs.ext4 per boot).
//   - /init runs before the command tree is built (internal/cli's entry points).
//   - mitigations=off and lsm=landlock,yama,bpf (AppArmor, TOMOYO have no policy here).
//   - The initramfs is found by a stat-keyed memo of the executable's hash instead of
//     hashing ~15 MB per cold start.
//
// Measured and left: -cpu Nehalem or qemu64 boot ~150 ms faster than max under TCG
// (4 samples each: ~1.8 s against ~1.95 s for `virtx run -- true` on the cloud kernel;
// max,la57=off changes nothing), but they lack AVX/AVX2, and images built for
// x86-64-v3 need them, so max stays the default (VIRTX_VM_CPU picks another); turning
// AVX off for the guest's Go runtime alone (GODEBUG=cpu.avx=off) changes nothing;
// stripping the guest binary's DWARF (16 → 11 MB initramfs) changes nothing
// measurable; nor do init_on_alloc=0 or rcupdate.rcu_expedited=1. Under the Go start
// is a smaller guest binary than this one (the issue asks for the same binary), and
// under the kernel's ~0.5 s restoring a booted guest from a memory snapshot
// (-incoming, ~0.11 s measured), left for the snapshot issue.
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
// Everything lives in the cache dir (console.CacheDir): vm/kernel3/<version>/ holds the
// PVH vmlinux and the guest's modules, vm/guest/ a static virtx when this one is not,
// vm/initramfs/ the initramfs per guest binary and kernel, vm/run/ the run dirs.
// `virtx setup vm` provisions it all, and so does the first boot when anything is
// missing: the kernel is Debian's cloud kernel (apt-get download of
// linux-image-cloud-amd64's versioned dependency, dpkg-deb -x into a temp dir), whose
// bzImage payload is LZ4 in the kernel's legacy framing (decompressed with
// github.com/pierrec/lz4's block decoder) holding the ELF vmlinux with the PVH entry
// note; its modules come with their dependencies read from each module's .modinfo
// (the package ships no modules.dep). `virtx setup vm --build-kernel` also builds the
// guest's own kernel into vm/kernel-built/ (BuildKernel): Debian's linux-source-X.Y
// tarball (apt-get installs it, build-essential, flex, bison, libelf-dev and bc when
// missing and the caller is root), `make allnoconfig` with guest-kernel.config as
// KCONFIG_ALLCONFIG, a check that every option of the fragment ended up as written,
// `make vmlinux` (6–7 minutes on 2 loaded cores, once per source version and
// configuration: the directory is named by the package version and a hash of the
// fragment), the PVH note checked. Boots prefer it to the fetched kernel; the fetched
// one stays provisioned as the fallback. $VIRTX_KERNEL overrides both. The guest's
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

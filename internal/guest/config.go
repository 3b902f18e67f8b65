// Package guest is what the virtx binary does as /init of a VM guest (the vm backend's
// initramfs): it turns a bare kernel into a session and then serves the one executor.
//
// # Boot, in order
//
//  1. Mount /proc, /sys and /dev (devtmpfs) in the initramfs.
//  2. Load the kernel modules the initramfs carries (/modules/order.txt, dependencies
//     first) with finit_module: virtio_mmio and the virtio drivers, fuse and virtiofs,
//     overlay; the NIC's only with a NIC (virtx.net), erofs only with an image's disk
//     (as soon as the virtio disks show one, else when the config says there is an
//     image). A module the kernel already has built in answers EEXIST, and one the
//     initramfs lacks is taken as built in.
//  3. Mount the host's share (virtiofs, tag "virtx") at /mnt/host. The host prepared it:
//     base/ is the read-only image (the host image: the host's system dirs and a
//     curated /etc), trees/N are the session's trees (read-only ones already read-only
//     on the host side), config.json is this file's Config, snapshot.tar the init
//     snapshot when there is one. A session on an OCI image also has the image's disk:
//     a read-only virtio disk whose serial is "virtx-image" (/sys/block/vdX/serial),
//     an erofs of the image's layers already flattened by the host, mounted read-only at
//     /mnt/image; base/ is then only the mount points and the session's /etc files,
//     stacked over it.
//  4. Mount the session disk (the virtio disk without that serial, ext4 made by the
//     host) at /mnt/disk; it holds the overlay's upper and work dirs and survives a
//     stop. An init snapshot is applied into the upper once (executor.ApplyLayer),
//     before anything runs.
//  5. Mount the root: overlay of base/ (over the image's erofs, if any) and the upper
//     (metacopy, redirect_dir and index off, so the upper is whole and
//     executor.WriteLayer can hand it out as a layer), then /proc, /sys, /dev,
//     /dev/pts, /dev/shm and /run in it, and each tree at its guest path, in the order
//     init listed them (read-only binds stay read-only: a command gets EROFS), and the
//     image's working directory when the layers lack it. cgroup2 is mounted and PID 1
//     moves into a cgroup with Config.PidsMax as pids.max, so everything it starts
//     shares that bound: a fork bomb ends there. A few idle runtime threads are started first, so PID 1 does not need
//     a new thread (a pid) while a bomb holds them all.
//  6. Network: lo always; eth0 with the static 10.0.2.15/24 and a default route via
//     10.0.2.2 only when the session has a network (the host bridges the NIC to
//     slirp4netns; otherwise it gives the VM no NIC at all).
//  7. Switch root (move the new root onto /, chroot), after deleting the initramfs's
//     files so their memory is freed.
//  8. Serve: relay.Serve of an executor (PID 1, subreaper) on the virtio-serial port
//     named "virtx.0", found under /sys/class/virtio-ports. A read returns 0 while the
//     host side is not connected; until the first byte arrives that is retried, after it
//     an end of stream means the host went away: every process is killed, the disk is
//     synced and the VM powers off.
//
// A failure before serving is answered on the port, to every request, as BOOT_FAILED (or
// MOUNT_FAILED for a tree), so the host learns why; a failure before the port can be
// opened is written to the console (the host keeps its tail) and the VM powers off.
//
// Nothing here needs a shell or busybox: the image supplies userland, this binary only
// mounts and serves.
package guest

// Config is what the host tells the guest about the session, as /mnt/host/config.json.
type Config struct {
	// Port is the name of the virtio-serial port the relay is served on.
	Port string `json:"port"`
	// Trees are the session's trees, in init's order.
	Trees []Tree `json:"trees"`
	// Network brings eth0 up with Address (CIDR) and a default route via Gateway.
	Network bool   `json:"network"`
	Address string `json:"address,omitempty"`
	Gateway string `json:"gateway,omitempty"`
	// Disk says the session disk is /dev/vda (ext4); otherwise the upper is a tmpfs.
	// The guest goes by the kernel command line's virtx.disk (and virtx.net for
	// Network's NIC), which the host sets to match: the disk is mounted, and the NIC's
	// modules loaded, before this file can be read.
	Disk bool `json:"disk"`
	// Snapshot says /mnt/host/snapshot.tar is a layer to apply into a fresh upper.
	Snapshot bool `json:"snapshot"`
	// Env is the environment of every command.
	Env []string `json:"env"`
	// PidsMax bounds the processes of the session (PID 1 included) with a pids cgroup,
	// so a fork bomb ends at it instead of taking the guest; 0: no bound.
	PidsMax int `json:"pids_max,omitempty"`
	// Hostname is the guest's host name.
	Hostname string `json:"hostname"`
	// Image says the session is on an OCI image: the virtio disk whose serial is
	// ImageDiskSerial is its erofs (the layers flattened), stacked under base/ (the
	// mount points and /etc files the session needs) as the root overlay's lower.
	// False: the root is the host image, base/ alone.
	Image bool `json:"image,omitempty"`
	// Workdir is made in the root when missing (an image's WORKDIR, as docker does).
	Workdir string `json:"workdir,omitempty"`
}

// Tree is one of the session's trees: /mnt/host/trees/<Index> seen at Guest.
type Tree struct {
	Index    int    `json:"index"`
	Guest    string `json:"guest"`
	ReadOnly bool   `json:"ro"`
}

// Share layout, as the host prepares it and the guest reads it.
const (
	ShareTag        = "virtx"
	ShareBase       = "base"
	ShareTrees      = "trees"
	ShareConfig     = "config.json"
	ShareSnapshot   = "snapshot.tar"
	DefaultPort     = "virtx.0"
	GuestAddress    = "10.0.2.15/24"
	GuestGateway    = "10.0.2.2"
	GuestNameserve  = "10.0.2.3"
	ImageDiskSerial = "virtx-image" // an image's disk (a virtio-blk serial is at most 20 bytes)
)

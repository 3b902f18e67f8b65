package sandbox

import (
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/linux"
)

// The init side of a session's network and devices: what setup does inside the new root
// before pivoting into it.

// mountResolvConf puts the session's own /etc/resolv.conf in place: a file on a small
// tmpfs of its own (mounted nowhere else), bound over the image's /etc/resolv.conf, so
// the image and the session's upper stay as they are (a snapshot does not carry it).
func mountResolvConf(root int, content string) error {
	fs, err := linux.OpenFS("tmpfs")
	if err != nil {
		return err
	}
	defer fs.Close()
	for _, kv := range [][2]string{{"size", "16k"}, {"mode", "0755"}} {
		if err := fs.SetString(kv[0], kv[1]); err != nil {
			return err
		}
	}
	if err := fs.Create(); err != nil {
		return err
	}
	mnt, err := fs.Mount(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(mnt)
	f, err := unix.Openat(mnt, "resolv.conf", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	_, err = unix.Write(f, []byte(content))
	unix.Close(f)
	if err != nil {
		return fmt.Errorf("resolv.conf: %w", err)
	}
	etc, err := linux.MkdirAllInRoot(root, "/etc", 0o755)
	if err != nil {
		return err
	}
	defer unix.Close(etc)
	// The mount point: the image's file, or a new empty one.
	// (O_PATH: opening the image's file to write would copy it up into the session's upper.)
	t, err := unix.Openat(etc, "resolv.conf", unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		t, err = unix.Openat(etc, "resolv.conf", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	}
	if err != nil {
		return fmt.Errorf("/etc/resolv.conf in the image: %w", err)
	}
	unix.Close(t)
	clone, err := linux.CloneTree(mnt, "resolv.conf", false)
	if err != nil {
		return err
	}
	defer unix.Close(clone)
	return linux.MoveMount(clone, etc, "resolv.conf")
}

// resolvConf is a resolv.conf naming servers.
func resolvConf(servers []string) string {
	var b strings.Builder
	b.WriteString("# virtx: the session's user-space network relays these to the host's resolver\n")
	for _, s := range servers {
		b.WriteString("nameserver " + s + "\n")
	}
	return b.String()
}

// bindDevices binds host device nodes (gpu:true) into the sandbox's /dev, at their own
// names (/dev/nvidia-caps/x too).
func bindDevices(root int, devs []string) error {
	for _, d := range devs {
		rel, ok := strings.CutPrefix(d, "/dev/")
		if !ok || strings.Contains(rel, "..") {
			return fmt.Errorf("device %s: not under /dev", d)
		}
		dir := "/dev"
		if i := strings.LastIndexByte(rel, '/'); i >= 0 {
			dir = "/dev/" + rel[:i]
		}
		dfd, err := linux.MkdirAllInRoot(root, dir, 0o755)
		if err != nil {
			return err
		}
		name := rel[strings.LastIndexByte(rel, '/')+1:]
		fd, err := unix.Openat(dfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o666)
		unix.Close(dfd)
		if err != nil {
			return fmt.Errorf("%s: %w", d, err)
		}
		err = linux.Mount(d, linux.FdPath(fd), "", unix.MS_BIND, "")
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// checkLoopbackOnly fails unless lo is the namespace's only interface (network false).
func checkLoopbackOnly() error {
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("netlink: listing interfaces: %w", err)
	}
	for _, l := range links {
		if a := l.Attrs(); a.Index != 1 {
			return fmt.Errorf("network false, and the sandbox's network namespace has %s besides lo", a.Name)
		}
	}
	return nil
}

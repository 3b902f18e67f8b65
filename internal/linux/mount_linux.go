package linux

import (
	"strings"

	"golang.org/x/sys/unix"
)

// MakeRPrivate makes the mount at path and every mount below it private, so nothing
// mounted or unmounted in this mount namespace from now on propagates to another (the
// host's), and nothing from there propagates here.
func MakeRPrivate(path string) error {
	return wrap("make rprivate", path, unix.Mount("", path, "", unix.MS_REC|unix.MS_PRIVATE, ""))
}

// Mount is mount(2).
func Mount(source, target, fstype string, flags uintptr, data string) error {
	op := "mount"
	if fstype != "" {
		op += " " + fstype
	}
	if flags&unix.MS_BIND != 0 {
		op += " --bind " + source
	}
	return wrap(op, target, unix.Mount(source, target, fstype, flags, data))
}

// Unmount is umount2(2).
func Unmount(target string, flags int) error {
	return wrap("umount", target, unix.Unmount(target, flags))
}

// PivotRoot is pivot_root(2): newRoot becomes the root of this mount namespace and the old
// root is mounted at putOld. pivot_root(".", ".") followed by Unmount(".", MNT_DETACH) is
// the form that needs no directory for the old root.
func PivotRoot(newRoot, putOld string) error {
	return wrap("pivot_root", newRoot, unix.PivotRoot(newRoot, putOld))
}

// FS is a filesystem being configured (fsopen(2)): set its parameters, Create it, then
// Mount it as a detached mount.
type FS struct {
	fd   int
	name string
}

// OpenFS starts configuring a filesystem of type fsType ("tmpfs", "overlay", "proc").
func OpenFS(fsType string) (*FS, error) {
	fd, err := unix.Fsopen(fsType, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, wrap("fsopen "+fsType, "", err)
	}
	return &FS{fd: fd, name: fsType}, nil
}

// SetString sets a parameter with a string value (FSCONFIG_SET_STRING).
func (f *FS) SetString(key, value string) error {
	return f.fail("fsconfig "+f.name+" "+key+"="+value, unix.FsconfigSetString(f.fd, key, value))
}

// SetFlag sets a parameter that takes no value (FSCONFIG_SET_FLAG).
func (f *FS) SetFlag(key string) error {
	return f.fail("fsconfig "+f.name+" "+key, unix.FsconfigSetFlag(f.fd, key))
}

// SetFd sets a parameter to an open file (FSCONFIG_SET_FD): overlayfs takes its layers
// this way ("lowerdir+", "upperdir", "workdir"), by directory descriptor rather than by a
// path string that would have to be resolved, escaped and kept short.
func (f *FS) SetFd(key string, fd int) error {
	return f.fail("fsconfig "+f.name+" "+key, unix.FsconfigSetFd(f.fd, key, fd))
}

// Create makes the filesystem's superblock (FSCONFIG_CMD_CREATE).
func (f *FS) Create() error {
	return f.fail("fsconfig "+f.name+" create", unix.FsconfigCreate(f.fd))
}

// Mount makes a detached mount of the created filesystem with the MOUNT_ATTR_* flags in
// attrs and returns its descriptor (close-on-exec). The mount exists while a descriptor
// refers to it or it is attached somewhere.
func (f *FS) Mount(attrs int) (int, error) {
	fd, err := unix.Fsmount(f.fd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, f.fail("fsmount "+f.name, err)
	}
	return fd, nil
}

// Close releases the configuration (not the mount Mount made).
func (f *FS) Close() error {
	if f.fd < 0 {
		return nil
	}
	err := unix.Close(f.fd)
	f.fd = -1
	return wrap("close fs context", f.name, err)
}

// fail wraps err, adding what the kernel logged about it in the filesystem context.
func (f *FS) fail(op string, err error) error {
	if err == nil {
		return nil
	}
	if msg := f.log(); msg != "" {
		op += " (" + msg + ")"
	}
	return wrap(op, "", err)
}

// log drains the context's message log ("e overlayfs: …" lines).
func (f *FS) log() string {
	var msgs []string
	buf := make([]byte, 1024)
	for range 16 {
		n, err := unix.Read(f.fd, buf)
		if err != nil || n <= 0 {
			break
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	return strings.Join(msgs, "; ")
}

// CloneTree makes a detached copy of the mount at path (a bind mount that is not attached
// anywhere yet: open_tree(OPEN_TREE_CLONE)), with the mounts below it when recursive. The
// descriptor is close-on-exec; the copy goes away with the last descriptor unless it was
// attached with MoveMount.
func CloneTree(dirfd int, path string, recursive bool) (int, error) {
	flags := uint(unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	if path == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	fd, err := unix.OpenTree(dirfd, path, flags)
	if err != nil {
		return -1, wrap("open_tree clone", path, err)
	}
	return fd, nil
}

// MoveMount attaches the detached mount fd (from FS.Mount or CloneTree) at path, resolved
// against dirfd (unix.AT_FDCWD: the cwd).
func MoveMount(fd int, dirfd int, path string) error {
	return wrap("move_mount", path, unix.MoveMount(fd, "", dirfd, path, unix.MOVE_MOUNT_F_EMPTY_PATH))
}

// SetMountAttr changes the MOUNT_ATTR_* flags of the mount fd refers to (and of the mounts
// below it when recursive): set are turned on, clear off. what names it in errors.
func SetMountAttr(fd int, what string, set, clear uint64, recursive bool) error {
	flags := uint(unix.AT_EMPTY_PATH)
	if recursive {
		flags |= unix.AT_RECURSIVE
	}
	return wrap("mount_setattr", what, unix.MountSetattr(fd, "", flags, &unix.MountAttr{Attr_set: set, Attr_clr: clear}))
}

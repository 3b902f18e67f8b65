//go:build !linux

package linux

// MakeRPrivate fails: unsupported here.
func MakeRPrivate(path string) error { return wrap("make rprivate", path, ErrUnsupported) }

// Mount fails: unsupported here.
func Mount(source, target, fstype string, flags uintptr, data string) error {
	return wrap("mount", target, ErrUnsupported)
}

// Unmount fails: unsupported here.
func Unmount(target string, flags int) error { return wrap("umount", target, ErrUnsupported) }

// PivotRoot fails: unsupported here.
func PivotRoot(newRoot, putOld string) error { return wrap("pivot_root", newRoot, ErrUnsupported) }

// FS is a filesystem being configured; it cannot be made here.
type FS struct{}

// OpenFS fails: unsupported here.
func OpenFS(fsType string) (*FS, error) { return nil, wrap("fsopen "+fsType, "", ErrUnsupported) }

// SetString fails: unsupported here.
func (f *FS) SetString(key, value string) error { return wrap("fsconfig", key, ErrUnsupported) }

// SetFlag fails: unsupported here.
func (f *FS) SetFlag(key string) error { return wrap("fsconfig", key, ErrUnsupported) }

// SetFd fails: unsupported here.
func (f *FS) SetFd(key string, fd int) error { return wrap("fsconfig", key, ErrUnsupported) }

// Create fails: unsupported here.
func (f *FS) Create() error { return wrap("fsconfig create", "", ErrUnsupported) }

// Mount fails: unsupported here.
func (f *FS) Mount(attrs int) (int, error) { return -1, wrap("fsmount", "", ErrUnsupported) }

// Close does nothing.
func (f *FS) Close() error { return nil }

// CloneTree fails: unsupported here.
func CloneTree(dirfd int, path string, recursive bool) (int, error) {
	return -1, wrap("open_tree clone", path, ErrUnsupported)
}

// MoveMount fails: unsupported here.
func MoveMount(fd int, dirfd int, path string) error { return wrap("move_mount", path, ErrUnsupported) }

// SetMountAttr fails: unsupported here.
func SetMountAttr(fd int, what string, set, clear uint64, recursive bool) error {
	return wrap("mount_setattr", what, ErrUnsupported)
}

//go:build !linux

package linux

import (
	"fmt"
)

// FdPath is /proc/self/fd/N, which exists on Linux only.
func FdPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// OpenInRoot fails: unsupported here.
func OpenInRoot(root int, path string, flags int) (int, error) {
	return -1, wrap("openat2 in root", path, ErrUnsupported)
}

// MkdirAllInRoot fails: unsupported here.
func MkdirAllInRoot(root int, path string, mode uint32) (int, error) {
	return -1, wrap("mkdir in root", path, ErrUnsupported)
}

// Setns fails: unsupported here.
func Setns(fd int, nstype int) error { return wrap("setns", "", ErrUnsupported) }

// SetDumpable fails: unsupported here.
func SetDumpable(on bool) error { return wrap("prctl PR_SET_DUMPABLE", "", ErrUnsupported) }

// ErrThreadsUnsupported is matched by LimitProcessCaps where it cannot reach every thread.
var ErrThreadsUnsupported = ErrUnsupported

// LimitProcessCaps fails: unsupported here.
func LimitProcessCaps(keep []int) error { return wrap("limit capabilities", "", ErrUnsupported) }

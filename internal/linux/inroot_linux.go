package linux

import (
	"fmt"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FdPath is the name under which a process reaches its open file descriptor fd
// (/proc/self/fd/N). Handing a mount or an overlay option that name, rather than a path
// resolved again, makes it act on exactly the file the descriptor was opened on.
func FdPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// OpenInRoot opens path as if root (a directory descriptor) were "/": every ".." and
// every symlink, absolute or not, is resolved without leaving root (openat2 with
// RESOLVE_IN_ROOT), and magic links (/proc/PID/fd/…) are refused. flags are open(2)
// flags; O_CLOEXEC is always added.
func OpenInRoot(root int, path string, flags int) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS}
	for {
		fd, err := unix.Openat2(root, path, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue // a rename raced the lookup
		}
		if err != nil {
			return -1, wrap("openat2 in root", path, err)
		}
		return fd, nil
	}
}

// MkdirAllInRoot makes the directory path and any missing parents below root, resolving
// as OpenInRoot does, and returns an O_PATH descriptor of it. Directories it makes get
// mode (less the umask).
func MkdirAllInRoot(root int, path string, mode uint32) (int, error) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	dir, err := OpenInRoot(root, "/", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, err
	}
	done := ""
	for _, p := range parts {
		if p == "" || p == "." {
			continue
		}
		done += "/" + p
		// Resolving the prefix in root each time (not openat on the parent) keeps a
		// symlink among the parts inside root too.
		next, err := OpenInRoot(root, done, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil && errorIs(err, unix.ENOENT) {
			if merr := unix.Mkdirat(dir, p, mode); merr != nil && merr != unix.EEXIST {
				unix.Close(dir)
				return -1, wrap("mkdir in root", done, merr)
			}
			next, err = OpenInRoot(root, done, unix.O_PATH|unix.O_DIRECTORY)
		}
		unix.Close(dir)
		if err != nil {
			return -1, err
		}
		dir = next
	}
	return dir, nil
}

func errorIs(err error, errno unix.Errno) bool {
	e, ok := err.(*Error)
	return ok && e.Err == errno
}

// Setns moves the calling thread into the namespace fd refers to; nstype (CLONE_NEW…)
// says which kind it must be, 0 any.
func Setns(fd int, nstype int) error {
	return wrap("setns", fmt.Sprintf("fd %d", fd), unix.Setns(fd, nstype))
}

// SetDumpable sets whether this process may be dumped and, with it, whether processes
// of the same user without CAP_SYS_PTRACE may open its /proc/PID/{mem,fd,environ,…}.
func SetDumpable(on bool) error {
	v := uintptr(0)
	if on {
		v = 1
	}
	return wrap("prctl PR_SET_DUMPABLE", "", unix.Prctl(unix.PR_SET_DUMPABLE, v, 0, 0, 0))
}

// ErrThreadsUnsupported is matched by LimitProcessCaps where the calls cannot reach
// every thread: a program linked with cgo, where the Go runtime does not own them all.
var ErrThreadsUnsupported = unix.ENOTSUP

// LimitProcessCaps confines every thread of this process, now and the ones made later,
// to keep (capability numbers): the effective and permitted sets become keep, the
// inheritable set is emptied, and no_new_privs is set, so no thread holds more than keep
// and no program executed gains more. The bounding set is a thread's own and is left
// alone (LimitThreadCaps on the thread that starts programs). It needs the Go runtime to
// own every thread (syscall.AllThreadsSyscall): in a program linked with cgo it changes
// nothing and returns an error matching ErrThreadsUnsupported; then LimitThreadCaps and
// SetNoNewPrivs on a locked thread followed by an execve do the same for the program
// executed.
func LimitProcessCaps(keep []int) error {
	all := func(op string, trap, a1, a2, a3 uintptr) error {
		if _, _, e := syscall.AllThreadsSyscall(trap, a1, a2, a3); e != 0 {
			if e == syscall.ENOTSUP {
				return wrap(op+" on every thread", "", ErrThreadsUnsupported)
			}
			return wrap(op+" on every thread", "", unix.Errno(e))
		}
		return nil
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for _, c := range keep {
		data[c/32].Effective |= 1 << (uint(c) % 32)
		data[c/32].Permitted |= 1 << (uint(c) % 32)
	}
	if err := all("capset", unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return err
	}
	return all("prctl PR_SET_NO_NEW_PRIVS", unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0)
}

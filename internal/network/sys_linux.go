package network

// The system calls this package makes, each wrapped once: the error says which call
// failed on what, and still matches its errno (errors.Is(err, unix.EPERM)).

import (
	"os"
	"runtime"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// threadNetns is the network namespace of the calling thread (not of the process: a
// thread that setns'd elsewhere has its own).
const threadNetns = "/proc/thread-self/ns/net"

// openNs opens a namespace file (/proc/PID/ns/net and the like) close-on-exec.
func openNs(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open namespace", Path: path, Err: err}
	}
	return fd, nil
}

// setns moves the calling thread into the namespace fd refers to; path is for the message.
func setns(fd int, nstype int, path string) error {
	if err := unix.Setns(fd, nstype); err != nil {
		return &os.PathError{Op: "setns", Path: path, Err: err}
	}
	return nil
}

// nsID identifies a namespace: two files name the same namespace when both match.
type nsID struct{ dev, ino uint64 }

// nsOf identifies the namespace behind a namespace file.
func nsOf(path string) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nsID{}, &os.PathError{Op: "stat namespace", Path: path, Err: err}
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// nsOfFile identifies the namespace behind an open namespace file.
func nsOfFile(f *os.File) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nsID{}, &os.PathError{Op: "fstat namespace", Path: f.Name(), Err: err}
	}
	return nsID{dev: st.Dev, ino: st.Ino}, nil
}

// closeFd closes a descriptor this package opened; the result is only logged.
func closeFd(fd int) error {
	if err := unix.Close(fd); err != nil {
		return os.NewSyscallError("close", err)
	}
	return nil
}

// pipe makes a close-on-exec pipe as two files. With pollRead the read end is
// non-blocking, so that Go's poller serves it and Close interrupts a pending Read.
func pipe(pollRead bool) (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	if pollRead {
		if err := unix.SetNonblock(p[0], true); err != nil {
			unix.Close(p[0])
			unix.Close(p[1])
			return nil, nil, os.NewSyscallError("fcntl O_NONBLOCK", err)
		}
	}
	return os.NewFile(uintptr(p[0]), "pipe-r"), os.NewFile(uintptr(p[1]), "pipe-w"), nil
}

// pidfdOpen returns a pidfd for pid.
func pidfdOpen(pid int) (int, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return -1, os.NewSyscallError("pidfd_open "+strconv.Itoa(pid), err)
	}
	return fd, nil
}

// pidfdGetfd duplicates descriptor targetfd of the process behind pidfd into ours.
func pidfdGetfd(pidfd, targetfd int) (int, error) {
	fd, err := unix.PidfdGetfd(pidfd, targetfd, 0)
	if err != nil {
		return -1, os.NewSyscallError("pidfd_getfd "+strconv.Itoa(targetfd), err)
	}
	return fd, nil
}

// tunAttachFilter attaches a classic BPF program to every queue of the tun/tap device
// fd belongs to: frames the kernel hands the device's reader pass it first.
func tunAttachFilter(fd int, prog []unix.SockFilter) error {
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(unix.TUNATTACHFILTER), uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return os.NewSyscallError("ioctl TUNATTACHFILTER", errno)
	}
	return nil
}

// Package linux wraps the Linux system calls virtx's boundaries are built from: the new
// mount API (fsopen, fsconfig, fsmount, open_tree, move_mount, mount_setattr), pivot_root,
// the capability bounding set, no_new_privs, the host name, passing file descriptors
// over a Unix socket, and handing back an idle process's pages of its own binary
// (madvise: IdleTrimmer, which `virtx serve` and a sandbox's init run).
//
// Each call is wrapped once, here, so that every error says which operation failed and on
// what ("fsconfig overlay lowerdir+: invalid argument") while still matching its errno:
// errors.Is(err, unix.EPERM) holds for an *Error whose errno is EPERM. Where the kernel
// explains a refusal in the filesystem context's log (an overlay option it did not take),
// the explanation is added to the message.
//
// # Detached mounts
//
// The new mount API makes a mount without attaching it anywhere: fsmount and
// open_tree(OPEN_TREE_CLONE) return a file descriptor for a mount that is in no mount
// namespace's tree. It lives exactly as long as a descriptor refers to it, so a mount held
// that way cannot be left behind by a process that dies, however it dies. move_mount
// attaches one where it is wanted, typically inside a mount namespace of a sandbox's own.
//
// Subpackages hold what is larger than a wrapper (cgroup). Elsewhere than Linux every
// function returns an error saying the platform is unsupported.
package linux

import "runtime"

// Error is a failed system call: what was attempted, what it acted on, and why.
type Error struct {
	Op   string // the call and its subject: "fsconfig overlay upperdir", "move_mount"
	Path string // the path it acted on, if any
	Err  error  // the errno (a unix.Errno), or another cause
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Op + ": " + e.Err.Error()
	}
	return e.Op + " " + e.Path + ": " + e.Err.Error()
}

// Unwrap returns the errno, so errors.Is(err, unix.EXXX) works.
func (e *Error) Unwrap() error { return e.Err }

func wrap(op, path string, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Op: op, Path: path, Err: err}
}

// errUnsupported is the cause of every error elsewhere than Linux.
type unsupportedError struct{}

func (unsupportedError) Error() string { return "unsupported on " + runtime.GOOS }

// ErrUnsupported is matched by every error this package returns elsewhere than Linux.
var ErrUnsupported error = unsupportedError{}

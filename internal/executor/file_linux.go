//go:build linux

package executor

import (
	"context"
	"io/fs"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// errnoError is an errno that also matches another error: ENOTDIR matching
// fs.ErrNotExist, EROFS matching ErrReadOnly.
type errnoError struct {
	errno unix.Errno
	also  error
}

func (e *errnoError) Error() string   { return e.errno.Error() }
func (e *errnoError) Unwrap() []error { return []error{e.errno, e.also} }

// pathErr wraps an error of op on p. ENOTDIR (a file where a directory was
// expected above p) is made to match fs.ErrNotExist as ENOENT already does,
// and EROFS to match ErrReadOnly; every errno stays matchable.
func pathErr(op, p string, err error) error {
	switch err {
	case unix.ENOTDIR:
		err = &errnoError{errno: unix.ENOTDIR, also: fs.ErrNotExist}
	case unix.EROFS:
		err = &errnoError{errno: unix.EROFS, also: ErrReadOnly}
	}
	return &fs.PathError{Op: op, Path: p, Err: err}
}

// Read returns up to length bytes of the file at p from offset (length < 0:
// as much as there is), never more than the read limit, and the file's
// size. An offset at or past the end gives empty data and no error.
// Errors: a missing file (or a non-directory above it) matches
// fs.ErrNotExist, a directory matches unix.EISDIR, a relative path or
// negative offset ErrInvalidArgument; others keep their errno.
func (e *Executor) Read(ctx context.Context, p string, offset int64, length int64) ([]byte, int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if !path.IsAbs(p) {
		return nil, 0, invalidArg("read: path %q is not absolute", p)
	}
	if offset < 0 {
		return nil, 0, invalidArg("read %s: negative offset %d", p, offset)
	}
	// O_NONBLOCK so that a FIFO does not hang the open; it changes nothing
	// for regular files.
	fd, err := openRetry(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, pathErr("read", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, 0, pathErr("read", p, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil, 0, pathErr("read", p, unix.EISDIR)
	}
	size := st.Size
	if offset >= size || length == 0 {
		return []byte{}, size, nil
	}
	n := size - offset
	if length > 0 && length < n {
		n = length
	}
	n = min(n, int64(e.readLimit))
	buf := make([]byte, n)
	got := 0
	for got < len(buf) {
		m, err := unix.Pread(fd, buf[got:], offset+int64(got))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, 0, pathErr("read", p, err)
		}
		if m == 0 {
			break // the file shrank since fstat
		}
		got += m
	}
	return buf[:got], size, nil
}

// Write puts data in the file at p and returns the file's size afterwards.
// Without hasOffset it replaces the file (created 0644 if missing, else
// truncated); with it, it writes at offset and leaves the rest, creating
// the file if missing and extending it with zeros if offset is past the
// end (also when data is empty). The directory above p must exist.
// Errors: under a read-only tree (by its real path) ErrReadOnly, a missing
// directory above fs.ErrNotExist, a directory at p unix.EISDIR, a relative
// path or negative offset ErrInvalidArgument; others keep their errno.
func (e *Executor) Write(ctx context.Context, p string, data []byte, offset int64, hasOffset bool) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if !path.IsAbs(p) {
		return 0, invalidArg("write: path %q is not absolute", p)
	}
	if hasOffset && offset < 0 {
		return 0, invalidArg("write %s: negative offset %d", p, offset)
	}
	real, err := realTarget(path.Clean(p))
	if err != nil {
		return 0, pathErr("write", p, err)
	}
	if root := e.readOnlyRoot(real); root != "" {
		return 0, &fs.PathError{Op: "write", Path: p, Err: &wrapError{
			msg:  "read-only tree " + root,
			errs: []error{ErrReadOnly, unix.EROFS},
		}}
	}
	flags := unix.O_WRONLY | unix.O_CREAT | unix.O_CLOEXEC | unix.O_NOCTTY
	if !hasOffset {
		flags |= unix.O_TRUNC
	}
	fd, err := openRetry(real, flags, 0o644)
	if err != nil {
		return 0, pathErr("write", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, pathErr("write", p, err)
	}
	if !hasOffset {
		for b := data; len(b) > 0; {
			n, err := unix.Write(fd, b)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return 0, pathErr("write", p, err)
			}
			b = b[n:]
		}
	} else {
		for b, off := data, offset; len(b) > 0; {
			n, err := unix.Pwrite(fd, b, off)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return 0, pathErr("write", p, err)
			}
			b, off = b[n:], off+int64(n)
		}
		if len(data) == 0 && offset > st.Size && st.Mode&unix.S_IFMT == unix.S_IFREG {
			if err := unix.Ftruncate(fd, offset); err != nil {
				return 0, pathErr("write", p, err)
			}
		}
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, pathErr("write", p, err)
	}
	return st.Size, nil
}

func openRetry(p string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Open(p, flags, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// realTarget returns the path p really names: its directory with symlinks
// resolved and, if p itself is a symlink (dangling or not), what it points
// to, resolved the same way. The file itself need not exist; the directory
// above it must.
func realTarget(p string) (string, error) {
	for hops := 0; hops < 40; hops++ {
		dir, base := path.Split(p)
		rdir, err := filepath.EvalSymlinks(dir)
		if err != nil {
			if pe, ok := err.(*fs.PathError); ok {
				return "", pe.Err
			}
			return "", err
		}
		full := path.Join(rdir, base)
		var st unix.Stat_t
		if err := unix.Lstat(full, &st); err != nil {
			if err == unix.ENOENT {
				return full, nil
			}
			return "", err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			return full, nil
		}
		target, err := readlink(full)
		if err != nil {
			return "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(rdir, target)
		}
		p = path.Clean(target)
	}
	return "", unix.ELOOP
}

func readlink(p string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlink(p, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// readOnlyRoot returns the read-only tree that the real path real lies
// under, or "". Each root is compared by its real path too, so a tree
// reached through a symlink is still recognised.
func (e *Executor) readOnlyRoot(real string) string {
	for _, root := range e.roRoots {
		if under(real, root) {
			return root
		}
		if rr, err := filepath.EvalSymlinks(root); err == nil && under(real, rr) {
			return root
		}
	}
	return ""
}

// under reports whether p is root or lies below it (both clean, absolute).
func under(p, root string) bool {
	return root == "/" || p == root || strings.HasPrefix(p, root+"/")
}

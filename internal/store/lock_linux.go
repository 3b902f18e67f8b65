//go:build linux

package store

import (
	"context"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// lockMode is how a lock file is held.
type lockMode int

const (
	shared    lockMode = unix.LOCK_SH
	exclusive lockMode = unix.LOCK_EX
)

// fileLock is a held flock(2) on a lock file. The kernel drops it when the process dies,
// which is what makes a SIGKILLed holder harmless.
type fileLock struct{ f *os.File }

// lockPath takes the flock on path (created if missing) in mode, waiting until ctx is
// done. flock cannot be interrupted, so the wait polls with LOCK_NB.
func lockPath(ctx context.Context, path string, mode lockMode) (*fileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	delay := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), int(mode)|unix.LOCK_NB)
		if err == nil {
			return &fileLock{f: f}, nil
		}
		if err != unix.EWOULDBLOCK && err != unix.EINTR {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, 50*time.Millisecond)
	}
}

// tryLockPath takes the flock on path in mode if nobody holds a conflicting one; ok is
// false (and the error nil) when somebody does.
func tryLockPath(path string, mode lockMode) (l *fileLock, ok bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), int(mode)|unix.LOCK_NB); err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("lock %s: %w", path, err)
	}
	return &fileLock{f: f}, true, nil
}

// downgrade turns an exclusive lock into a shared one. Not atomic (flock drops, then
// takes); callers hold the store's gc lock meanwhile, so no collector can slip in.
func (l *fileLock) downgrade() error {
	if err := unix.Flock(int(l.f.Fd()), unix.LOCK_SH); err != nil {
		return fmt.Errorf("lock %s: %w", l.f.Name(), err)
	}
	return nil
}

// unlock releases the lock.
func (l *fileLock) unlock() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}

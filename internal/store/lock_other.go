//go:build !linux

package store

import (
	"context"
	"fmt"
	"runtime"
)

type lockMode int

const (
	shared lockMode = iota
	exclusive
)

type fileLock struct{}

var errUnsupported = fmt.Errorf("store: unsupported on %s", runtime.GOOS)

func lockPath(ctx context.Context, path string, mode lockMode) (*fileLock, error) {
	return nil, errUnsupported
}

func tryLockPath(path string, mode lockMode) (*fileLock, bool, error) {
	return nil, false, errUnsupported
}

func (l *fileLock) downgrade() error { return errUnsupported }

func (l *fileLock) unlock() {}

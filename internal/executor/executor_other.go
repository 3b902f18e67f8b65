//go:build !linux

package executor

import (
	"context"
	"fmt"
	"io"
	"runtime"
)

// platform holds nothing where the executor is unsupported.
type platform struct{}

// errUnsupported is what everything answers on a GOOS other than Linux.
var errUnsupported = fmt.Errorf("executor: unsupported on %s", runtime.GOOS)

// New fails: the executor runs only on Linux.
func New(cfg Config) (*Executor, error) {
	if _, err := newExecutor(cfg); err != nil {
		return nil, err
	}
	return nil, errUnsupported
}

// Exec fails: the executor runs only on Linux.
func (e *Executor) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	return ExecResult{}, errUnsupported
}

// Read fails: the executor runs only on Linux.
func (e *Executor) Read(ctx context.Context, path string, offset int64, length int64) ([]byte, int64, error) {
	return nil, 0, errUnsupported
}

// Write fails: the executor runs only on Linux.
func (e *Executor) Write(ctx context.Context, path string, data []byte, offset int64, hasOffset bool) (int64, error) {
	return 0, errUnsupported
}

// KillAll does nothing: the executor runs only on Linux, so it has started
// nothing.
func (e *Executor) KillAll() {}

// WriteLayer fails: the executor runs only on Linux.
func WriteLayer(w io.Writer, upperDir string) error { return errUnsupported }

// ApplyLayer fails: the executor runs only on Linux.
func ApplyLayer(r io.Reader, upperDir string) error { return errUnsupported }

// ApplyLayerXattrPrefix fails: the executor runs only on Linux.
func ApplyLayerXattrPrefix(r io.Reader, upperDir, prefix string) error { return errUnsupported }

//go:build !linux

package sandbox

import (
	"context"
	"fmt"
	"io"

	"virtx.dev/virtx/internal/backend"
)

// RunStep fails: unsupported here.
func (b *Backend) RunStep(ctx context.Context, lowers []string, env []string, workdir string, shellCmd string, output io.Writer) (io.ReadCloser, error) {
	return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, errUnsupported)
}

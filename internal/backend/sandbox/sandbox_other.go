//go:build !linux

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"runtime"

	"virtx.dev/virtx/internal/backend"
)

var errUnsupported = errors.New("the sandbox backend is unsupported on " + runtime.GOOS + ": it is made of Linux namespaces")

// Available fails: there are no Linux namespaces here.
func Available() error { return errUnsupported }

func diskBytes(spec *backend.Spec) (int64, error) {
	return 0, fmt.Errorf("%w: %v", backend.ErrUnsupportedMachine, errUnsupported)
}

// Boot fails: unsupported here.
func (b *Backend) Boot(ctx context.Context, spec *backend.Spec) (backend.Machine, error) {
	return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, errUnsupported)
}

// RunInit fails: unsupported here.
func RunInit(args []string) error { return errUnsupported }

type hostImage struct{}

func (h *hostImage) close() {}

type platform struct{}

func (b *Backend) prespawn()      {}
func (b *Backend) closePlatform() {}

type machineShape struct{}

func shape(spec *backend.Spec) (machineShape, error) {
	return machineShape{}, fmt.Errorf("%w: %v", backend.ErrUnsupportedMachine, errUnsupported)
}
func reapStaleGroups() {}

func (b *Backend) hintNetwork(bool) {}

//go:build !linux

package vm

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"

	"virtx.dev/virtx/internal/backend"
)

// Backend is the vm backend; it needs Linux (QEMU microvm, virtiofsd, mount namespaces).
type Backend struct {
	log   *slog.Logger
	fetch bool
}

// New makes a backend that refuses every boot on this GOOS.
func New(cacheDir string, opts ...Option) *Backend {
	b := &Backend{}
	for _, o := range opts {
		o(b)
	}
	return b
}

func (b *Backend) Name() string { return "vm" }

func (b *Backend) Admit(ctx context.Context, spec *backend.Spec) (string, error) {
	return "", fmt.Errorf("%w: the vm backend is unsupported on %s", backend.ErrUnsupportedMachine, runtime.GOOS)
}

func (b *Backend) Boot(ctx context.Context, spec *backend.Spec) (backend.Machine, error) {
	return nil, fmt.Errorf("%w: the vm backend is unsupported on %s", backend.ErrBootFailed, runtime.GOOS)
}

// KVMUsable is false off Linux.
func KVMUsable(cache string) error { return fmt.Errorf("unsupported on %s", runtime.GOOS) }

// FindQEMU is unsupported off Linux.
func FindQEMU() (string, string, error) {
	return "", "", fmt.Errorf("the vm backend is unsupported on %s", runtime.GOOS)
}

// Setup is unsupported off Linux.
func Setup(ctx context.Context, cache string, w io.Writer, opts SetupOptions) error {
	return fmt.Errorf("the vm backend is unsupported on %s", runtime.GOOS)
}

// KernelStatus: the vm backend is unsupported off Linux.
func KernelStatus(cache string) (string, bool, string) {
	return "the vm backend is unsupported on " + runtime.GOOS, false, ""
}

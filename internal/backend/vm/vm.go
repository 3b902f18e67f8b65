package vm

import (
	"log/slog"
	"time"
)

// Machine shape defaults, as upstream's: what a session gets when init does not say.
const (
	DefaultVCPUs     = 2
	DefaultMemoryMiB = 2048
	DefaultDiskGiB   = 16 // sparse: only what the session writes takes room
	MinMemoryMiB     = 128
)

var (
	// BootTimeout bounds a boot, from starting QEMU to the guest's executor answering.
	BootTimeout = 60 * time.Second
	// ShutdownGrace is how long a guest has to power off before QEMU is killed.
	ShutdownGrace = 5 * time.Second
	// ExecGrace is how long past an exec's own timeout the guest has to answer before
	// it is taken as hung and killed.
	ExecGrace = 30 * time.Second
)

// Option configures the vm backend.
type Option func(*Backend)

// WithLogger logs to l (stderr only: stdout is the protocol's).
func WithLogger(l *slog.Logger) Option { return func(b *Backend) { b.log = l } }

// WithoutFetch makes a missing kernel a BOOT_FAILED naming `virtx setup vm` instead of
// fetching it on first use.
func WithoutFetch() Option { return func(b *Backend) { b.fetch = false } }

// SetupOptions are what `virtx setup vm` is asked for beyond the defaults.
type SetupOptions struct {
	// BuildKernel builds the guest kernel from Debian's kernel source with the
	// configuration made for the guest (minutes, once), which boots several times
	// faster under TCG than the fetched cloud kernel; later boots prefer it.
	BuildKernel bool
}

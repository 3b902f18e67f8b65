// Package backend is what a boundary supplies to the console server: where commands run.
//
// The server (internal/server) holds every session rule — init and its validation,
// boot-on-demand, start/stop/quit, the session's cwd, ports held from init to quit, error
// codes. A Backend answers only the questions that differ between boundaries:
//
//   - Admit: can this backend make the session init describes, and where does it stand?
//     A refusal wraps one of the Err* kinds below; the server turns kinds into protocol
//     codes in one place.
//   - Boot: bring the boundary up (mount the trees, start the executor inside) and hand
//     back a Machine.
//   - Machine: relay exec/read/write to the executor inside, snapshot the session's writes,
//     dial a port inside, and tear everything down on Shutdown.
//
// Paths reaching a Machine are absolute guest paths; nothing rewrites them.
package backend

import (
	"context"
	"errors"
	"net"

	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

// Refusal and failure kinds. A backend wraps one of these (fmt.Errorf("%w: …", …)) with a
// message that names the fix; the server maps each kind to its protocol code.
var (
	ErrInvalidSpec        = errors.New("invalid session")     // -32602
	ErrUnsupportedMount   = errors.New("unsupported mount")   // -32008
	ErrUnsupportedNetwork = errors.New("unsupported network") // -32010
	ErrUnsupportedImage   = errors.New("unsupported image")   // -32011
	ErrUnknownImage       = errors.New("unknown image")       // -32012
	ErrUnsupportedMachine = errors.New("unsupported machine") // -32013
	ErrBootFailed         = errors.New("boot failed")         // -32002
	ErrMountFailed        = errors.New("mount failed")        // -32009
	ErrMethodNotAvailable = errors.New("not available")       // -32601: a method this backend cannot serve
	ErrSnapshotTooLarge   = errors.New("snapshot too large")  // -32007
	ErrSessionStopped     = errors.New("session stopped")     // -32002: the machine was stopped under a call
	// ErrMachineGone is a booted machine that died on its own (its executor went away):
	// the call is answered BOOT_FAILED and the server drops the machine, so the next call
	// that needs one boots a new one.
	ErrMachineGone = errors.New("machine gone") // -32002
	// ErrBuildFailed is a recipe step that failed (a RUN that exited non-zero): the recipe
	// is what has to change, so it is answered INVALID_PARAMS with the step's output.
	ErrBuildFailed = errors.New("build failed") // -32602
)

// Spec is a session as init described it, validated by the server.
type Spec struct {
	Image        *protocol.ImageSource
	Snapshot     []byte // nil: none
	Network      bool
	Ports        []protocol.Port
	VCPUs        uint64 // 0: the backend's default
	MemoryMiB    uint64 // 0: the backend's default
	GPU          *bool  // nil: not said
	GPUMemoryMiB uint64 // 0: not said
	DiskGiB      uint64 // 0: the backend's default
	Mounts       []protocol.Mount
}

// Backend makes sessions of one kind of boundary.
type Backend interface {
	// Name is the backend's name as `virtx serve --backend` spells it.
	Name() string
	// Admit decides at init whether this backend can make spec, without booting anything,
	// and returns the directory the session starts in.
	Admit(ctx context.Context, spec *Spec) (cwd string, err error)
	// Boot brings a session up. Failures wrap ErrBootFailed or ErrMountFailed.
	Boot(ctx context.Context, spec *Spec) (Machine, error)
}

// Machine is one booted session.
type Machine interface {
	Exec(ctx context.Context, req executor.ExecRequest) (executor.ExecResult, error)
	Read(ctx context.Context, path string, offset, length int64) (data []byte, size int64, err error)
	Write(ctx context.Context, path string, data []byte, offset int64, hasOffset bool) (size int64, err error)
	// Snapshot returns the session's writes as an OCI layer tar, or an error wrapping
	// ErrMethodNotAvailable on a backend without a layer of its own.
	Snapshot(ctx context.Context) ([]byte, error)
	// DialPort connects to a TCP port inside the session.
	DialPort(ctx context.Context, port uint16) (net.Conn, error)
	// Shutdown releases everything the boot took; calls in flight fail or end.
	Shutdown(ctx context.Context) error
}

// ImageStore is what a backend with images offers the image methods. A backend that is
// not one answers build_image with UNSUPPORTED_IMAGE and lists nothing.
type ImageStore interface {
	BuildImage(ctx context.Context, recipe *protocol.Recipe, ref string) (protocol.BuildImageResult, error)
	ListImages(ctx context.Context) ([]protocol.ImageEntry, error)
	RemoveImage(ctx context.Context, image *protocol.ImageSource) error
}

// Package host is the backend whose commands run on this machine, as the server's own
// children: no isolation, nothing mounted, no image. It exists for tests and for hosts
// with nothing better, and it is honest about what it cannot give:
//
//   - a file:// tree is accepted only where its guest path is its host path (it mounts
//     nothing, so a tree can only be seen where it already is); any other scheme, or a tree
//     elsewhere, is UNSUPPORTED_MOUNT;
//   - network false is UNSUPPORTED_NETWORK (it cannot take the network away), and with
//     network on, commands reach this machine's loopback like any local process;
//   - an image or an init snapshot is UNSUPPORTED_IMAGE (there is no base to swap);
//   - vcpus, memory_mib, disk_gib and gpu_memory_mib are UNSUPPORTED_MACHINE (it enforces
//     no limits, and a machine of that shape is not what it would give); gpu true is given
//     only where the host has a GPU device, and gpu false only where it has none;
//   - `ro` is enforced for the writes the write method performs, not for commands;
//   - snapshot is METHOD_NOT_FOUND (-32601, "not available"): there is no layer of the
//     session's writes to hand back, since they went straight to the host.
//
// A port "H:G" listens on 127.0.0.1:H and forwards to 127.0.0.1:G.
package host

import (
	"context"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"strconv"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

// Backend runs sessions on this machine.
type Backend struct {
	subreaper bool
}

// Option configures the host backend.
type Option func(*Backend)

// WithSubreaper makes the serving process a child subreaper, so daemonised grandchildren
// of commands come back to it to be killed and reaped. For `virtx serve`, not for tests
// that share their process.
func WithSubreaper() Option { return func(b *Backend) { b.subreaper = true } }

// New makes the host backend.
func New(opts ...Option) *Backend {
	b := &Backend{}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Name is "host".
func (b *Backend) Name() string { return "host" }

// Admit refuses what this backend cannot give, and answers the server's own working
// directory as where the session stands.
func (b *Backend) Admit(ctx context.Context, spec *backend.Spec) (string, error) {
	if spec.Image != nil {
		return "", fmt.Errorf("%w: image %s: the host backend runs commands on this machine's own filesystem and has no base to swap; use --backend sandbox or vm", backend.ErrUnsupportedImage, spec.Image)
	}
	if spec.Snapshot != nil {
		return "", fmt.Errorf("%w: snapshot: the host backend has no base for a layer to go over; use --backend sandbox or vm", backend.ErrUnsupportedImage)
	}
	if !spec.Network {
		return "", fmt.Errorf("%w: network false: the host backend's commands run on this host and it cannot take the network away from them; use --backend sandbox or vm", backend.ErrUnsupportedNetwork)
	}
	for _, p := range spec.Ports {
		if p.Host == p.Guest {
			return "", fmt.Errorf("%w: port %s: on the host backend the session's port %d is this machine's, so forwarding it to itself would take the port its own service needs; pick another host port", backend.ErrUnsupportedNetwork, p, p.Guest)
		}
	}
	for _, lim := range []struct {
		name string
		v    uint64
	}{{"vcpus", spec.VCPUs}, {"memory_mib", spec.MemoryMiB}, {"disk_gib", spec.DiskGiB}, {"gpu_memory_mib", spec.GPUMemoryMiB}} {
		if lim.v != 0 {
			return "", fmt.Errorf("%w: %s %d: the host backend enforces no limits, so it cannot give a machine of that shape; use --backend sandbox or vm", backend.ErrUnsupportedMachine, lim.name, lim.v)
		}
	}
	if spec.GPU != nil {
		has := hasGPU()
		if *spec.GPU && !has {
			return "", fmt.Errorf("%w: gpu true: this host has no GPU device (/dev/nvidia*, /dev/dri/renderD*)", backend.ErrUnsupportedMachine)
		}
		if !*spec.GPU && has {
			return "", fmt.Errorf("%w: gpu false: the host backend cannot hide this host's GPU from commands; use --backend sandbox or vm", backend.ErrUnsupportedMachine)
		}
	}
	for i, m := range spec.Mounts {
		if _, err := hostPath(i, m); err != nil {
			return "", err
		}
	}
	return workingDir(), nil
}

// hostPath is the directory a file:// tree names, which must be the guest path itself.
func hostPath(i int, m protocol.Mount) (string, error) {
	p, err := backend.FileTree("host", i, m)
	if err != nil {
		return "", err
	}
	if p != path.Clean(m.GuestPath) {
		return "", fmt.Errorf("%w: mount %d (%s → %s): the host backend mounts nothing, so a tree can only be seen at its own path (%s); use --backend sandbox or vm to place it elsewhere", backend.ErrUnsupportedMount, i+1, m.URL, m.GuestPath, p)
	}
	return p, nil
}

// workingDir is the server's cwd in the spelling its parent used ($PWD) when that names
// the same directory.
func workingDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "/"
	}
	if pwd := os.Getenv("PWD"); filepath.IsAbs(pwd) {
		a, err1 := os.Stat(pwd)
		b, err2 := os.Stat(wd)
		if err1 == nil && err2 == nil && os.SameFile(a, b) {
			return pwd
		}
	}
	return wd
}

func hasGPU() bool {
	for _, pattern := range []string{"/dev/nvidia[0-9]*", "/dev/dri/renderD*"} {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return true
		}
	}
	return false
}

// Boot checks that every tree is there and starts an executor for the session.
func (b *Backend) Boot(ctx context.Context, spec *backend.Spec) (backend.Machine, error) {
	var ro []string
	for i, m := range spec.Mounts {
		if _, err := hostPath(i, m); err != nil {
			return nil, fmt.Errorf("%w: %v", backend.ErrMountFailed, err)
		}
		if _, err := backend.TreeDir("host", i, m); err != nil {
			return nil, err
		}
		if m.ReadOnly {
			ro = append(ro, m.GuestPath)
		}
	}
	ex, err := executor.New(executor.Config{Env: os.Environ(), ReadOnly: ro, Subreaper: b.subreaper})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", backend.ErrBootFailed, err)
	}
	return &machine{Executor: ex}, nil
}

// machine is a booted host session: the executor, in this process.
type machine struct {
	*executor.Executor
}

func (m *machine) Snapshot(ctx context.Context) ([]byte, error) {
	return nil, fmt.Errorf("%w: snapshot: the host backend's writes went straight to this machine's filesystem, so there is no layer of them to hand back; use --backend sandbox or vm", backend.ErrMethodNotAvailable)
}

func (m *machine) DialPort(ctx context.Context, port uint16) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
}

func (m *machine) Shutdown(ctx context.Context) error {
	m.KillAll()
	return nil
}

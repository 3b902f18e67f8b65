package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"sync"
	"time"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

// session is the state a server keeps between calls: the spec, where the session stands,
// the ports it holds, and the machine when one is booted (Up) or nil (Idle).
type session struct {
	backend backend.Backend
	log     *slog.Logger

	mu      sync.Mutex
	spec    *backend.Spec
	cwd     string
	machine backend.Machine
	upCh    chan struct{} // closed when a machine is booted, replaced when it goes away
	ports   *portSet
}

func newSession(b backend.Backend, log *slog.Logger) *session {
	return &session{backend: b, log: log, upCh: make(chan struct{}), ports: newPortSet(log)}
}

// init validates p, asks the backend whether it can make it, and only then replaces the
// session: a refused init leaves the previous one as it was.
func (s *session) init(ctx context.Context, p *protocol.InitParams) (protocol.Payload, error) {
	spec, err := specFromInit(p)
	if err != nil {
		return nil, err
	}
	claim, err := s.ports.claim(spec.Ports)
	if err != nil {
		return nil, err
	}
	cwd, err := s.backend.Admit(ctx, spec)
	if err != nil {
		claim.abandon()
		return nil, err
	}
	s.shutdown(ctx)
	s.mu.Lock()
	s.spec, s.cwd = spec, cwd
	s.mu.Unlock()
	claim.commit(s.dial)
	return &protocol.InitResult{Cwd: cwd}, nil
}

// specFromInit applies the rules every backend shares; what a backend can make is Admit's.
func specFromInit(p *protocol.InitParams) (*backend.Spec, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", backend.ErrInvalidSpec, fmt.Sprintf(format, args...))
	}
	spec := &backend.Spec{
		Image: p.Image,
		// A copy: the params alias the request's frame, which is recycled once init is
		// answered, and the snapshot is kept for every later boot.
		Snapshot: cloneBytes(p.Snapshot),
		Network:  p.Network == nil || *p.Network,
		Ports:    p.Ports,
		GPU:      p.GPU,
		Mounts:   p.Mounts,
	}
	for _, m := range []struct {
		name string
		v    *uint64
		dst  *uint64
	}{
		{"vcpus", p.VCPUs, &spec.VCPUs},
		{"memory_mib", p.MemoryMiB, &spec.MemoryMiB},
		{"gpu_memory_mib", p.GPUMemoryMiB, &spec.GPUMemoryMiB},
		{"disk_gib", p.DiskGiB, &spec.DiskGiB},
	} {
		if m.v == nil {
			continue
		}
		if *m.v == 0 {
			return nil, bad("%s 0 is a machine nothing runs on; leave it out for the server's default", m.name)
		}
		*m.dst = *m.v
	}
	if p.GPUMemoryMiB != nil && (p.GPU == nil || !*p.GPU) {
		return nil, bad("gpu_memory_mib describes an accelerator, and gpu is not true")
	}
	if !spec.Network && len(spec.Ports) > 0 {
		return nil, bad("ports %v on a session with network false: there is no network for them to reach", spec.Ports)
	}
	seenPort := map[uint16]bool{}
	for _, pt := range spec.Ports {
		if seenPort[pt.Host] {
			return nil, bad("host port %d given twice", pt.Host)
		}
		seenPort[pt.Host] = true
	}
	seen := map[string]int{}
	for i, m := range spec.Mounts {
		g := path.Clean(m.GuestPath)
		if g == "/" {
			return nil, bad("mount %d (%s): a tree cannot be mounted at /", i+1, m)
		}
		if j, dup := seen[g]; dup {
			return nil, bad("mounts %d and %d both ask for %s", j, i+1, g)
		}
		seen[g] = i + 1
	}
	return spec, nil
}

// currentSpec is the spec of the last init or, before any, the default session ({}), as
// init would admit it: a call that needs a machine before any init gets the session an
// empty init would have made — or that init's refusal. Called with mu held.
func (s *session) currentSpec(ctx context.Context) (*backend.Spec, error) {
	if s.spec != nil {
		return s.spec, nil
	}
	spec := &backend.Spec{Network: true}
	cwd, err := s.backend.Admit(ctx, spec)
	if err != nil {
		return nil, err
	}
	s.spec, s.cwd = spec, cwd
	return spec, nil
}

// up returns the booted machine, booting one first if the session is Idle.
func (s *session) up(ctx context.Context) (backend.Machine, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.machine != nil {
		return s.machine, nil
	}
	spec, err := s.currentSpec(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	m, err := s.backend.Boot(ctx, spec)
	if err != nil {
		return nil, err
	}
	s.log.Debug("booted", "backend", s.backend.Name(), "took", time.Since(start))
	s.machine = m
	close(s.upCh)
	return m, nil
}

// dial connects a port's connection into the session, waiting for a boot when Idle.
func (s *session) dial(ctx context.Context, guest uint16) (net.Conn, error) {
	for {
		s.mu.Lock()
		m, ch := s.machine, s.upCh
		s.mu.Unlock()
		if m != nil {
			return m.DialPort(ctx, guest)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// gone checks a machine call's error: a machine that died on its own is dropped (Up →
// Idle), so the call is answered BOOT_FAILED and the next one boots a new machine.
func (s *session) gone(ctx context.Context, m backend.Machine, err error) error {
	if err != nil && errors.Is(err, backend.ErrMachineGone) {
		s.mu.Lock()
		mine := s.machine == m
		s.mu.Unlock()
		if mine {
			s.log.Warn("the machine died; the next call boots a new one", "err", err)
			s.shutdown(ctx)
		}
	}
	return err
}

// shutdown takes the machine down (Up → Idle); the spec, cwd and ports stay.
func (s *session) shutdown(ctx context.Context) {
	s.mu.Lock()
	m := s.machine
	if m != nil {
		s.machine = nil
		s.upCh = make(chan struct{})
	}
	s.mu.Unlock()
	if m != nil {
		if err := m.Shutdown(ctx); err != nil {
			s.log.Warn("shutting the machine down", "err", err)
		}
	}
}

// stop is the stop notification: release what booting took.
func (s *session) stop(ctx context.Context) { s.shutdown(ctx) }

// close ends the session: the machine and the ports.
func (s *session) close(ctx context.Context) {
	s.shutdown(ctx)
	s.ports.closeAll()
}

func (s *session) getCwd() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.currentSpec(context.Background()) // a refusal is answered by the call that boots
	return s.cwd
}

func (s *session) exec(ctx context.Context, p *protocol.ExecParams) (protocol.Payload, error) {
	m, err := s.up(ctx)
	if err != nil {
		return nil, err
	}
	req := executor.ExecRequest{Cmd: p.Cmd, Cwd: s.getCwd()}
	if p.TimeoutMS != nil {
		req.Timeout = time.Duration(*p.TimeoutMS) * time.Millisecond
	}
	res, err := m.Exec(ctx, req)
	if err != nil {
		return nil, s.gone(ctx, m, err)
	}
	if res.Cwd != "" && res.Cwd != req.Cwd {
		s.mu.Lock()
		s.cwd = res.Cwd
		s.mu.Unlock()
	}
	return &protocol.ExecResult{Code: res.Code, Stdout: res.Stdout, Stderr: res.Stderr, Truncated: res.Truncated}, nil
}

// resolve joins a relative path onto where the session stands, keeping its spelling.
func (s *session) resolve(p string) string {
	if path.IsAbs(p) {
		return p
	}
	return path.Join(s.getCwd(), p)
}

func (s *session) read(ctx context.Context, p *protocol.ReadParams) (protocol.Payload, error) {
	m, err := s.up(ctx)
	if err != nil {
		return nil, err
	}
	offset, length := int64(0), int64(-1)
	if p.Offset != nil {
		offset = clampInt64(*p.Offset)
	}
	if p.Len != nil {
		length = clampInt64(*p.Len)
	}
	data, size, err := m.Read(ctx, s.resolve(p.Path), offset, length)
	if err != nil {
		return nil, s.gone(ctx, m, err)
	}
	return &protocol.ReadResult{Data: data, Size: uint64(size)}, nil
}

func (s *session) write(ctx context.Context, p *protocol.WriteParams) (protocol.Payload, error) {
	m, err := s.up(ctx)
	if err != nil {
		return nil, err
	}
	var offset int64
	if p.Offset != nil {
		offset = clampInt64(*p.Offset)
	}
	size, err := m.Write(ctx, s.resolve(p.Path), p.Data, offset, p.Offset != nil)
	if err != nil {
		return nil, s.gone(ctx, m, err)
	}
	return &protocol.WriteResult{Size: uint64(size)}, nil
}

// snapshotOverhead is room in the frame for the envelope around the blob.
const snapshotOverhead = 1 << 10

func (s *session) snapshot(ctx context.Context) (protocol.Payload, error) {
	m, err := s.up(ctx)
	if err != nil {
		return nil, err
	}
	blob, err := m.Snapshot(ctx)
	if err != nil {
		return nil, s.gone(ctx, m, err)
	}
	if len(blob) > protocol.MaxPayload-snapshotOverhead {
		return nil, fmt.Errorf("%w: the session has written %d bytes of layer, more than one 64 MiB frame holds; a snapshot is not shortened", backend.ErrSnapshotTooLarge, len(blob))
	}
	return &protocol.SnapshotResult{Blob: blob}, nil
}

func clampInt64(v uint64) int64 {
	if v > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(v)
}

// cloneBytes copies b, keeping nil apart from empty.
func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

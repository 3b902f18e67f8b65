// Package relay carries a session's calls between the server and the executor inside a
// boundary (the PID 1 of a namespace sandbox, the /init of a VM guest) over one stream: a
// socketpair, a virtio-serial port.
//
// It speaks the Headless Console Protocol itself — the same frames, the same methods, the
// same error codes — plus one extension member on exec, `cwd`, both ways: the server says
// where the session stands, and the executor answers where a `cd` left it. So the session's
// cwd stays the server's (it survives a stop that throws the executor away), while `cd` is
// interpreted by the one executor. Paths are relayed untouched: the guest's are the only
// paths. Errors inside are mapped by fault.ToProtocol there and pass through untouched here.
//
// One call is outstanding at a time, as on the client channel; the server serialises.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/internal/fault"
	"virtx.dev/virtx/protocol"
)

// SnapshotFunc produces the session's writes as an OCI layer tar (nil: not available).
type SnapshotFunc func(ctx context.Context) ([]byte, error)

// Serve answers exec, read, write and snapshot from the stream with ex until the stream
// ends (nil) or breaks.
func Serve(ctx context.Context, rw io.ReadWriter, ex *executor.Executor, snapshot SnapshotFunc) error {
	fr := protocol.NewFrameReader(rw)
	for {
		frame, err := fr.ReadFrame()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		msg, err := protocol.Decode(frame)
		if err != nil {
			var pe *protocol.Error
			errors.As(err, &pe)
			if werr := protocol.WriteFrame(rw, protocol.AppendError(nil, pe.ID, pe.HasID, pe)); werr != nil {
				return werr
			}
			continue
		}
		if msg.Kind != protocol.KindRequest {
			continue
		}
		res, err := serveOne(ctx, msg, ex, snapshot)
		var out []byte
		if err != nil {
			out = protocol.AppendError(nil, msg.ID, true, fault.ToProtocol(err))
			if err := protocol.WriteFrame(rw, out); err != nil {
				return err
			}
			continue
		}
		out = protocol.AppendResult(protocol.NewFrameBuffer(protocol.SizeHint(res)), msg.ID, msg.Method, res)
		if err := protocol.WriteFramed(rw, out); err != nil {
			return err
		}
	}
}

func serveOne(ctx context.Context, msg *protocol.Message, ex *executor.Executor, snapshot SnapshotFunc) (protocol.Payload, error) {
	switch p := msg.Params.(type) {
	case *protocol.ExecParams:
		req := executor.ExecRequest{Cmd: p.Cmd, Cwd: p.Cwd}
		if p.TimeoutMS != nil {
			req.Timeout = time.Duration(*p.TimeoutMS) * time.Millisecond
		}
		r, err := ex.Exec(ctx, req)
		if err != nil {
			return nil, err
		}
		return &protocol.ExecResult{Code: r.Code, Stdout: r.Stdout, Stderr: r.Stderr, Truncated: r.Truncated, Cwd: r.Cwd}, nil
	case *protocol.ReadParams:
		offset, length := int64(0), int64(-1)
		if p.Offset != nil {
			offset = int64(min(*p.Offset, 1<<63-1))
		}
		if p.Len != nil {
			length = int64(min(*p.Len, 1<<63-1))
		}
		data, size, err := ex.Read(ctx, p.Path, offset, length)
		if err != nil {
			return nil, err
		}
		return &protocol.ReadResult{Data: data, Size: uint64(size)}, nil
	case *protocol.WriteParams:
		var offset int64
		if p.Offset != nil {
			offset = int64(min(*p.Offset, 1<<63-1))
		}
		size, err := ex.Write(ctx, p.Path, p.Data, offset, p.Offset != nil)
		if err != nil {
			return nil, err
		}
		return &protocol.WriteResult{Size: uint64(size)}, nil
	}
	if msg.Method == protocol.MethodSnapshot {
		if snapshot == nil {
			return nil, fmt.Errorf("%w: this executor has no layer to snapshot", backend.ErrMethodNotAvailable)
		}
		blob, err := snapshot(ctx)
		if err != nil {
			return nil, err
		}
		return &protocol.SnapshotResult{Blob: blob}, nil
	}
	return nil, protocol.Errorf(protocol.CodeMethodNotFound, "%s is not relayed to an executor", msg.Method)
}

// Client relays a Machine's calls to an executor over a stream. Its Exec, Read, Write
// and Snapshot are the backend.Machine methods of the same names.
type Client struct {
	rwc    io.ReadWriteCloser
	mu     sync.Mutex
	fr     *protocol.FrameReader
	nextID int64
	closed atomic.Bool
}

// NewClient relays over rwc, which Close closes.
func NewClient(rwc io.ReadWriteCloser) *Client {
	return &Client{rwc: rwc, fr: protocol.NewFrameReader(rwc)}
}

// Close marks the machine as going away and closes the stream: a call in flight ends
// (an exec as killed, 137; anything else with ErrSessionStopped).
func (c *Client) Close() error {
	c.closed.Store(true)
	return c.rwc.Close()
}

// call sends one request and waits for its answer; ctx cancellation closes the stream
// (the executor's side then ends the session's boundary), since the protocol cannot
// cancel one call.
func (c *Client) call(ctx context.Context, method string, params protocol.Payload) (any, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, fmt.Errorf("%w: the machine was shut down", backend.ErrSessionStopped)
	}
	id := c.nextID
	c.nextID++
	stop := context.AfterFunc(ctx, func() { c.rwc.Close() })
	defer stop()
	frame := protocol.AppendRequest(protocol.NewFrameBuffer(protocol.SizeHint(params)), id, method, params)
	if err := protocol.WriteFramed(c.rwc, frame); err != nil {
		return nil, c.broken(ctx, err)
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return nil, c.broken(ctx, err)
		}
		msg, err := protocol.Decode(f)
		if err != nil {
			return nil, fmt.Errorf("%w: relay: %v", backend.ErrMachineGone, err)
		}
		if msg.Kind != protocol.KindResponse || msg.ID != id {
			continue // not ours: a stale answer
		}
		if msg.Err != nil {
			return nil, msg.Err
		}
		return msg.Result, nil
	}
}

func (c *Client) broken(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if c.closed.Load() {
		return fmt.Errorf("%w: the machine was shut down during the call", backend.ErrSessionStopped)
	}
	return fmt.Errorf("%w: the executor went away: %v", backend.ErrMachineGone, err)
}

// Exec relays a command.
func (c *Client) Exec(ctx context.Context, req executor.ExecRequest) (executor.ExecResult, error) {
	p := &protocol.ExecParams{Cmd: req.Cmd, Cwd: req.Cwd}
	if req.Timeout > 0 {
		ms := uint64(req.Timeout.Milliseconds())
		p.TimeoutMS = &ms
	}
	res, err := c.call(ctx, protocol.MethodExec, p)
	if err != nil {
		if errors.Is(err, backend.ErrSessionStopped) {
			// Stopped under the command: everything in the boundary was killed.
			return executor.ExecResult{Code: 128 + 9, Cwd: req.Cwd}, nil
		}
		return executor.ExecResult{}, err
	}
	r := res.(*protocol.ExecResult)
	cwd := r.Cwd
	if cwd == "" {
		cwd = req.Cwd
	}
	return executor.ExecResult{Code: r.Code, Stdout: r.Stdout, Stderr: r.Stderr, Truncated: r.Truncated, Cwd: cwd}, nil
}

// Read relays a read.
func (c *Client) Read(ctx context.Context, path string, offset, length int64) ([]byte, int64, error) {
	p := &protocol.ReadParams{Path: path}
	if offset > 0 {
		o := uint64(offset)
		p.Offset = &o
	}
	if length >= 0 {
		l := uint64(length)
		p.Len = &l
	}
	res, err := c.call(ctx, protocol.MethodRead, p)
	if err != nil {
		return nil, 0, err
	}
	r := res.(*protocol.ReadResult)
	return r.Data, int64(r.Size), nil
}

// Write relays a write.
func (c *Client) Write(ctx context.Context, path string, data []byte, offset int64, hasOffset bool) (int64, error) {
	p := &protocol.WriteParams{Path: path, Data: data}
	if hasOffset {
		o := uint64(offset)
		p.Offset = &o
	}
	res, err := c.call(ctx, protocol.MethodWrite, p)
	if err != nil {
		return 0, err
	}
	return int64(res.(*protocol.WriteResult).Size), nil
}

// Snapshot asks the executor for the session's writes as a layer tar.
func (c *Client) Snapshot(ctx context.Context) ([]byte, error) {
	res, err := c.call(ctx, protocol.MethodSnapshot, nil)
	if err != nil {
		return nil, err
	}
	return res.(*protocol.SnapshotResult).Blob, nil
}

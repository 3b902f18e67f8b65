package console

import (
	"context"
	"fmt"
	"time"

	"virtx.dev/virtx/protocol"
)

// Exec runs argv in the session, where the session stands, and returns how it ended. A
// command that exits non-zero is a result, not an error: see the result's Code (128 +
// the signal for one a signal killed). Nothing consults a shell; for shell syntax, ask for
// one: []string{"sh", "-c", "…"}.
//
// The server refuses an empty argv (protocol.CodeInvalidParams), a program it cannot
// start (CodeNotExecutable), and a command killed by WithTimeout (CodeTimedOut); each is
// a *RefusedError. Stdout and Stderr are cut short when the command wrote more than the
// server keeps, and Truncated says so.
func (c *Console) Exec(ctx context.Context, argv []string, opts ...ExecOption) (*protocol.ExecResult, error) {
	var ec execConfig
	for _, o := range opts {
		if o != nil {
			o(&ec)
		}
	}
	p := &protocol.ExecParams{Cmd: argv}
	if ec.timeout > 0 {
		ms := uint64((ec.timeout + time.Millisecond - 1) / time.Millisecond)
		p.TimeoutMS = &ms
	}
	hint := 96
	for _, a := range argv {
		hint += len(a) + 8
	}
	m, err := c.call(ctx, protocol.MethodExec, p, hint)
	if err != nil {
		return nil, err
	}
	return resultOf[*protocol.ExecResult](c, m)
}

// Read returns up to length bytes of the file at path, from offset, and the file's size.
// An offset of 0 and a negative length are left out of the request: from the start, and
// as much as there is. The server may return less than asked for when the rest would not
// fit in one frame; Size is the file's size, so comparing it with what arrived says
// whether there is more. Reading past the end is not an error: Data is empty.
//
// A relative path is relative to where the session stands; an absolute one means the
// same thing whatever ran before it.
func (c *Console) Read(ctx context.Context, path string, offset, length int64) (*protocol.ReadResult, error) {
	if offset < 0 {
		return nil, fmt.Errorf("console: read %s: negative offset %d", path, offset)
	}
	p := &protocol.ReadParams{Path: path}
	if offset > 0 {
		off := uint64(offset)
		p.Offset = &off
	}
	if length >= 0 {
		n := uint64(length)
		p.Len = &n
	}
	m, err := c.call(ctx, protocol.MethodRead, p, 96+len(path))
	if err != nil {
		return nil, err
	}
	return resultOf[*protocol.ReadResult](c, m)
}

// ReadFile returns the whole file at path, asking again from further along for as long as
// the answers are shorter than the file, so a file larger than one frame is read in
// pieces. A file that changes meanwhile is read as far as it goes.
func (c *Console) ReadFile(ctx context.Context, path string) ([]byte, error) {
	res, err := c.Read(ctx, path, 0, -1)
	if err != nil {
		return nil, err
	}
	if uint64(len(res.Data)) >= res.Size {
		return res.Data, nil
	}
	buf := make([]byte, 0, clampCap(res.Size))
	buf = append(buf, res.Data...)
	for uint64(len(buf)) < res.Size {
		if len(res.Data) == 0 {
			break // nothing more came: the file shrank under us
		}
		if res, err = c.Read(ctx, path, int64(len(buf)), -1); err != nil {
			return nil, err
		}
		buf = append(buf, res.Data...)
	}
	return buf, nil
}

// clampCap bounds a preallocation taken from a size the server reported.
func clampCap(size uint64) int {
	const most = 1 << 30
	if size > most {
		return most
	}
	return int(size)
}

// Write replaces the file at path with data, creating it if it is missing (the directory
// above it has to exist), and returns the file's size afterwards. data must fit in one
// frame; WriteFile has no such limit.
func (c *Console) Write(ctx context.Context, path string, data []byte) (uint64, error) {
	return c.write(ctx, &protocol.WriteParams{Path: path, Data: data})
}

// WriteAt overwrites the file at path with data from offset, leaving whatever lies past
// it, and extending the file with zeroes when offset is beyond its end. It returns the
// file's size afterwards.
func (c *Console) WriteAt(ctx context.Context, path string, data []byte, offset uint64) (uint64, error) {
	return c.write(ctx, &protocol.WriteParams{Path: path, Data: data, Offset: &offset})
}

func (c *Console) write(ctx context.Context, p *protocol.WriteParams) (uint64, error) {
	m, err := c.call(ctx, protocol.MethodWrite, p, 128+len(p.Path)+len(p.Data))
	if err != nil {
		return 0, err
	}
	res, err := resultOf[*protocol.WriteResult](c, m)
	if err != nil {
		return 0, err
	}
	return res.Size, nil
}

// WriteFile replaces the file at path with data. Data larger than one frame is sent as a
// Write of its beginning followed by WriteAt calls for the rest, so a failure part of the
// way (a *RefusedError, or ctx ending between pieces) can leave the file holding only the
// front of data.
func (c *Console) WriteFile(ctx context.Context, path string, data []byte) error {
	chunk := c.chunk - len(path)
	if chunk < 1 {
		chunk = 1
	}
	first := min(len(data), chunk)
	if _, err := c.Write(ctx, path, data[:first]); err != nil {
		return err
	}
	for off := first; off < len(data); {
		n := min(len(data)-off, chunk)
		if _, err := c.WriteAt(ctx, path, data[off:off+n], uint64(off)); err != nil {
			return err
		}
		off += n
	}
	return nil
}

// Snapshot returns what the session has written since it began, as a layer that
// WithSnapshot starts a later session from. It is one frame or an error: a session that
// has written more than a frame holds is refused.
func (c *Console) Snapshot(ctx context.Context) ([]byte, error) {
	m, err := c.call(ctx, protocol.MethodSnapshot, nil, 64)
	if err != nil {
		return nil, err
	}
	res, err := resultOf[*protocol.SnapshotResult](c, m)
	if err != nil {
		return nil, err
	}
	return res.Blob, nil
}

// Start asks the server to boot the session now, so that the first call that needs it
// does not wait for the boot. It is never answered, and never needed: a call that needs a
// booted session boots one. It waits its turn behind a call in progress.
func (c *Console) Start(ctx context.Context) error {
	return c.notify(ctx, protocol.MethodStart)
}

// Stop asks the server to release what booting the session took (its machine, its
// mounts), for a session going idle. The session keeps its trees, its ports and where it
// stands; the next call that needs it boots it again. It is never answered, and waits its
// turn behind a call in progress.
func (c *Console) Stop(ctx context.Context) error {
	return c.notify(ctx, protocol.MethodStop)
}

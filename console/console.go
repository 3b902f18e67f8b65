package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"slices"
	"sync"
	"time"

	"virtx.dev/virtx/protocol"
)

// closeGrace is how long Close waits for the server to exit after quit before killing it.
const closeGrace = 10 * time.Second

// exitWait is how long a broken channel waits for the server's exit status, to report it.
const exitWait = time.Second

// Console is one session on one console server. It is safe for concurrent use; calls are
// serialised (see the package documentation). Close it when done.
type Console struct {
	r    io.Reader
	w    io.WriteCloser
	proc *process // nil when made by New

	grace time.Duration // Close's wait for the server to exit
	chunk int           // WriteFile's largest piece

	cwd    string
	mounts []string

	sem    chan struct{} // held by the one call in progress
	wlock  chan struct{} // held by whoever is writing a frame
	nextID int64         // the id the next request takes; guarded by sem

	mu      sync.Mutex
	pending *pendingCall // the call waiting for its answer, if any
	closed  bool         // Close (or a failed open) has begun
	err     error        // why the channel ended; set once, with done closed
	done    chan struct{}

	readerDone chan struct{}

	closeOnce sync.Once
	closeErr  error
}

type pendingCall struct {
	id     int64
	method string
	answer chan *protocol.Message // buffered, receives at most one message
}

// Open starts a console server, opens a session on it with init, and returns once the
// server has answered. Every option is checked first, and nothing is started if one is
// refused.
//
// A refused init is a *RefusedError, and leaves no process behind: the server's stdin is
// closed (no quit is sent, as there was no session) and it is waited for, or killed. ctx
// bounds only the opening: cancelling it before init is answered kills the server, and
// has no effect afterwards.
func Open(ctx context.Context, opts ...Option) (*Console, error) {
	cfg, params, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	argv := cfg.server
	if !cfg.serverSet {
		if argv, err = defaultServer(); err != nil {
			return nil, err
		}
	}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return nil, fmt.Errorf("console: server %q: %w", argv[0], err)
	}
	proc, stdin, err := spawn(argv, cfg.serverEnv, cfg.stderr)
	if err != nil {
		return nil, err
	}
	c := newConsole(proc.stdout, stdin, proc)
	if err := c.init(ctx, params); err != nil {
		return nil, err
	}
	return c, nil
}

// New opens a session over streams that already reach a console server: frames are read
// from r and written to w. It sends init and returns once it is answered; a refused init
// is a *RefusedError, and w is closed. Options about the server process (WithServer,
// WithServerEnv, WithStderr) are ignored.
//
// Close sends quit, closes w and waits for r to end; if r does not end within ten seconds
// and is an io.Closer, it is closed. w must allow Close while a Write is blocked, as
// pipes and network connections do.
func New(ctx context.Context, r io.Reader, w io.WriteCloser, opts ...Option) (*Console, error) {
	_, params, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := newConsole(r, w, nil)
	if err := c.init(ctx, params); err != nil {
		return nil, err
	}
	return c, nil
}

func newConsole(r io.Reader, w io.WriteCloser, proc *process) *Console {
	c := &Console{
		r:          r,
		w:          w,
		proc:       proc,
		grace:      closeGrace,
		chunk:      protocol.MaxPayload - 64<<10,
		sem:        make(chan struct{}, 1),
		wlock:      make(chan struct{}, 1),
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
	}
	go c.readLoop()
	return c
}

// init sends init and keeps its answer; on failure it tears the channel down (without
// quit) and returns why.
func (c *Console) init(ctx context.Context, params *protocol.InitParams) error {
	m, err := c.call(ctx, protocol.MethodInit, params, 256+len(params.Snapshot))
	if err != nil {
		grace := c.grace
		if ctx.Err() != nil {
			grace = 0 // the caller has stopped waiting: kill rather than wait
		}
		c.shutdown(false, grace)
		return err
	}
	res, err := resultOf[*protocol.InitResult](c, m)
	if err != nil {
		c.shutdown(false, 0)
		return err
	}
	c.cwd = res.Cwd
	for _, mt := range params.Mounts {
		c.mounts = append(c.mounts, mt.GuestPath)
	}
	return nil
}

// Cwd is where the session stood when it opened: init's answer. It may be empty, when the
// server did not say. Commands move it; run pwd to learn where it is now.
func (c *Console) Cwd() string { return c.cwd }

// Mounts returns the guest paths of the session's trees, in the order they were given.
func (c *Console) Mounts() []string { return slices.Clone(c.mounts) }

// call sends one request and waits for its answer. The answer is a result typed for
// method; an error answer is a *RefusedError.
func (c *Console) call(ctx context.Context, method string, params protocol.Payload, sizeHint int) (*protocol.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.done:
		return nil, c.termErr()
	}
	defer func() { <-c.sem }()
	if err := c.usable(); err != nil {
		return nil, err
	}

	id := c.nextID
	frame := protocol.AppendRequest(protocol.NewFrameBuffer(sizeHint), id, method, params)
	if n := len(frame) - 4; n > protocol.MaxPayload {
		// Refused before it takes an id: nothing was sent.
		return nil, fmt.Errorf("console: %s: the request is %d bytes, more than a frame holds (%d)", method, n, protocol.MaxPayload)
	}
	c.nextID++

	p := &pendingCall{id: id, method: method, answer: make(chan *protocol.Message, 1)}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		c.nextID--
		return nil, c.termErr()
	}
	c.pending = p
	c.mu.Unlock()

	if sent, err := c.send(ctx, frame); err != nil {
		c.abandon(p)
		if !sent {
			c.nextID-- // nothing went out, so the id is still unused
		}
		return nil, err
	}

	select {
	case m := <-p.answer:
		return answer(p, m)
	case <-c.done:
		select { // an answer that arrived just before the end still counts
		case m := <-p.answer:
			return answer(p, m)
		default:
		}
		return nil, c.termErr()
	case <-ctx.Done():
		c.abandon(p)
		return nil, ctx.Err()
	}
}

func answer(p *pendingCall, m *protocol.Message) (*protocol.Message, error) {
	if m.Err != nil {
		return nil, &RefusedError{Code: m.Err.Code, Message: m.Err.Message, Method: p.method}
	}
	return m, nil
}

// resultOf types a result. The reader has already checked that the result's method is the
// call's, and Decode types results by method, so a mismatch is a bug on our side of the
// protocol package; it is reported as a broken channel all the same.
func resultOf[T any](c *Console, m *protocol.Message) (T, error) {
	r, ok := m.Result.(T)
	if !ok {
		var zero T
		err := fmt.Errorf("%w: the answer to %s (id %d) is a %T", ErrBroken, m.Method, m.ID, m.Result)
		c.fail(err)
		return zero, err
	}
	return r, nil
}

// notify sends a notification, in turn with calls.
func (c *Console) notify(ctx context.Context, method string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return c.termErr()
	}
	defer func() { <-c.sem }()
	if err := c.usable(); err != nil {
		return err
	}
	_, err := c.send(ctx, protocol.AppendNotification(protocol.NewFrameBuffer(48), method))
	return err
}

// abandon forgets a call nobody waits for any more, so that its answer is dropped.
func (c *Console) abandon(p *pendingCall) {
	c.mu.Lock()
	if c.pending == p {
		c.pending = nil
	}
	c.mu.Unlock()
}

// send writes one frame. The write itself runs on a goroutine of its own when ctx can be
// cancelled, so that the caller can stop waiting for a server that is not reading; the
// frame is then finished in the background (a frame cut short would corrupt the stream).
// started reports whether the write began, so whether the frame may have gone out.
func (c *Console) send(ctx context.Context, frame []byte) (started bool, err error) {
	select {
	case c.wlock <- struct{}{}:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-c.done:
		return false, c.termErr()
	}
	write := func() error {
		err := protocol.WriteFramed(c.w, frame)
		<-c.wlock
		if err != nil {
			return c.writeFailed(err)
		}
		return nil
	}
	if ctx.Done() == nil {
		return true, write()
	}
	errc := make(chan error, 1)
	go func() { errc <- write() }()
	select {
	case err := <-errc:
		return true, err
	case <-ctx.Done():
		return true, ctx.Err()
	}
}

// writeFailed turns a failed write into the channel's end. A server that died makes both
// the write and the read fail; the read's account (with the exit status) is the better
// one, so it is given a moment to arrive first.
func (c *Console) writeFailed(err error) error {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	select {
	case <-c.done:
	case <-time.After(exitWait):
		c.broken(fmt.Sprintf("writing to the server: %v", err))
	}
	return c.termErr()
}

// readLoop reads every frame the server sends and hands each answer to the call waiting
// for it. It ends with the channel.
func (c *Console) readLoop() {
	defer close(c.readerDone)
	fr := protocol.NewFrameReader(c.r)
	for {
		doc, err := fr.ReadFrame()
		if err != nil {
			c.readFailed(err)
			return
		}
		m, err := protocol.Decode(doc)
		if err != nil {
			c.broken(fmt.Sprintf("the server sent a frame that does not decode: %v", err))
			return
		}
		switch m.Kind {
		case protocol.KindRequest:
			c.broken(fmt.Sprintf("the server sent a request (%s, id %d); a server never asks", m.Method, m.ID))
			return
		case protocol.KindNotification:
			c.broken(fmt.Sprintf("the server sent a notification (%s); a server never asks", m.Method))
			return
		}
		c.mu.Lock()
		p := c.pending
		if p != nil && p.id == m.ID {
			c.pending = nil
		} else {
			p = nil
		}
		c.mu.Unlock()
		if p == nil {
			slog.Debug("console: dropped an answer no call is waiting for", "id", m.ID, "answer", m.String())
			continue
		}
		if m.Err == nil && m.Method != p.method {
			c.broken(fmt.Sprintf("the answer to %s (id %d) is typed as %s's", p.method, p.id, m.Method))
			return
		}
		p.answer <- m
	}
}

// readFailed ends the channel when the server's output ends.
func (c *Console) readFailed(err error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		c.fail(ErrClosed)
		return
	}
	switch {
	case errors.Is(err, io.EOF):
		c.broken("the server closed the channel")
	case errors.Is(err, protocol.ErrTruncated):
		c.broken("the server's output ended inside a frame")
	default:
		c.broken(fmt.Sprintf("reading from the server: %v", err))
	}
}

// broken ends the channel as ErrBroken, saying what happened, what was waiting, and how
// the server ended. The server's stdin is closed, which tells a server that is still
// running to go.
func (c *Console) broken(what string) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	if p := c.pending; p != nil {
		what += fmt.Sprintf(" while %s (id %d) was waiting for its answer", p.method, p.id)
	}
	c.mu.Unlock()
	if c.proc != nil {
		what += "; " + c.proc.describe(exitWait)
	}
	c.fail(fmt.Errorf("%w: %s", ErrBroken, what))
	if c.proc != nil {
		_ = c.w.Close()
	}
}

// fail records why the channel ended, once.
func (c *Console) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

// usable is nil while calls may be made.
func (c *Console) usable() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return c.err
}

// termErr is what a call learns when the channel has ended.
func (c *Console) termErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.err == nil {
		return ErrBroken // not reached: termErr follows done
	}
	return c.err
}

// Close ends the session: it sends quit, closes the server's stdin and waits for the
// server to exit, killing it if it has not within ten seconds. A call still waiting is
// answered if the server answers it before exiting, and fails with ErrClosed otherwise.
//
// Close returns an error when the server had to be killed or exited with a failure after
// quit; a channel that was already broken is closed quietly, its error having been
// reported to the calls that met it. Closing again returns the same as the first time.
func (c *Console) Close() error {
	c.closeOnce.Do(func() { c.closeErr = c.shutdown(true, c.grace) })
	return c.closeErr
}

// shutdown ends the channel, sending quit first when asked to and when the channel still
// works, and waits up to grace for the far end to finish.
func (c *Console) shutdown(quit bool, grace time.Duration) error {
	c.mu.Lock()
	c.closed = true
	wasBroken := c.err != nil
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if quit && !wasBroken {
		// Best effort: a server that is not reading is dealt with below.
		_, _ = c.send(ctx, protocol.AppendNotification(protocol.NewFrameBuffer(48), protocol.MethodQuit))
	}
	_ = c.w.Close()

	var result error
	if c.proc != nil {
		select {
		case <-c.proc.exited:
		case <-ctx.Done():
			c.proc.kill()
			<-c.proc.exited
			if quit && !wasBroken {
				result = fmt.Errorf("console: the server %q did not exit within %v of quit, and was killed", c.proc.argv, grace)
			}
		}
		if result == nil && quit && !wasBroken && c.proc.waitErr != nil && !errors.Is(c.proc.waitErr, exec.ErrWaitDelay) {
			result = fmt.Errorf("console: after quit, the server %s", describeExit(c.proc.waitErr))
			if line := c.proc.tail.lastLine(); line != "" {
				result = fmt.Errorf("%w; its last stderr line: %q", result, line)
			}
		}
		// A child the server left behind may still hold its stdout; stop reading it.
		_ = c.proc.stdout.Close()
		<-c.readerDone
	} else {
		select {
		case <-c.readerDone:
		case <-ctx.Done():
			if rc, ok := c.r.(io.Closer); ok {
				_ = rc.Close()
				<-c.readerDone
			}
		}
	}
	c.fail(ErrClosed)
	return result
}

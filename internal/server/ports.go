package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/protocol"
)

// dialFunc connects to a port inside the session, waiting for a boot if need be.
type dialFunc func(ctx context.Context, guest uint16) (net.Conn, error)

// portSet holds a session's host listeners from init to quit. A port is the session's,
// not a boot's: listeners outlive stop, and a connection that arrives while nothing is
// booted waits for the next boot.
type portSet struct {
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	mu   sync.Mutex
	held map[uint16]*portListener
}

type portListener struct {
	ln    net.Listener
	guest atomic.Uint32
}

func newPortSet(log *slog.Logger) *portSet {
	ctx, cancel := context.WithCancel(context.Background())
	return &portSet{log: log, ctx: ctx, cancel: cancel, held: map[uint16]*portListener{}}
}

// portClaim is the listeners a new init needs, opened but not yet the session's.
type portClaim struct {
	set    *portSet
	want   []protocol.Port
	opened map[uint16]net.Listener
}

// claim opens a listener for every host port not already held, so a port taken on this
// machine is refused at init (-32602) while the client can still pick another.
func (ps *portSet) claim(ports []protocol.Port) (*portClaim, error) {
	c := &portClaim{set: ps, want: ports, opened: map[uint16]net.Listener{}}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, p := range ports {
		if _, ok := ps.held[p.Host]; ok {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(p.Host))))
		if err != nil {
			c.abandonLocked()
			return nil, fmt.Errorf("%w: port %s: host port %d cannot be taken on 127.0.0.1 (%v); pick another", backend.ErrInvalidSpec, p, p.Host, err)
		}
		c.opened[p.Host] = ln
	}
	return c, nil
}

func (c *portClaim) abandon() {
	c.set.mu.Lock()
	defer c.set.mu.Unlock()
	c.abandonLocked()
}

func (c *portClaim) abandonLocked() {
	for _, ln := range c.opened {
		ln.Close()
	}
}

// commit makes the claimed ports the session's: listeners no longer wanted are closed,
// new ones start accepting, and every port forwards to the guest port this init named.
func (c *portClaim) commit(dial dialFunc) {
	ps := c.set
	ps.mu.Lock()
	defer ps.mu.Unlock()
	want := map[uint16]uint16{}
	for _, p := range c.want {
		want[p.Host] = p.Guest
	}
	for host, pl := range ps.held {
		if _, ok := want[host]; !ok {
			pl.ln.Close()
			delete(ps.held, host)
		}
	}
	for host, guest := range want {
		pl, ok := ps.held[host]
		if !ok {
			pl = &portListener{ln: c.opened[host]}
			ps.held[host] = pl
			go ps.accept(pl, dial)
		}
		pl.guest.Store(uint32(guest))
	}
}

func (ps *portSet) accept(pl *portListener, dial dialFunc) {
	for {
		conn, err := pl.ln.Accept()
		if err != nil {
			return // closed
		}
		go ps.forward(conn, uint16(pl.guest.Load()), dial)
	}
}

// forward joins one host connection to the session's port; it is closed when nothing
// listens there.
func (ps *portSet) forward(conn net.Conn, guest uint16, dial dialFunc) {
	defer conn.Close()
	inner, err := dial(ps.ctx, guest)
	if err != nil {
		ps.log.Debug("port: nothing to connect to", "guest", guest, "err", err)
		return
	}
	defer inner.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
		done <- struct{}{}
	}
	go pipe(inner, conn)
	go pipe(conn, inner)
	select {
	case <-done:
		<-done
	case <-ps.ctx.Done():
	}
}

// closeAll releases every listener (quit).
func (ps *portSet) closeAll() {
	ps.cancel()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for host, pl := range ps.held {
		pl.ln.Close()
		delete(ps.held, host)
	}
}

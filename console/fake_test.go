package console

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// fakeServer answers the protocol over a pair of streams, from an in-memory filesystem,
// and records every message it reads. A test scripts it with hooks; the same server runs
// in-process (over io.Pipe) and as the helper process of process_test.go.
type fakeServer struct {
	r io.Reader
	w io.WriteCloser

	cwd     string
	maxRead int // the most data one read answers with; 0 is unlimited

	// initErr, when set, refuses init.
	initErr *protocol.Error
	// hook sees each message first; returning true means it has dealt with it.
	hook func(s *fakeServer, m *protocol.Message) bool
	// afterEOF runs when the client has closed its end, before the server's output is
	// closed.
	afterEOF func(s *fakeServer)

	wmu sync.Mutex

	mu    sync.Mutex
	msgs  []*protocol.Message
	files map[string][]byte
	eof   bool // the client closed its end between frames
	err   error
}

func newFake() *fakeServer {
	return &fakeServer{cwd: "/work", files: map[string][]byte{}}
}

// serve answers until the client closes its end, then closes the server's output.
func (s *fakeServer) serve() {
	fr := protocol.NewFrameReader(s.r)
	for {
		doc, err := fr.ReadFrame()
		if err != nil {
			s.mu.Lock()
			s.eof = err == io.EOF
			if !s.eof {
				s.err = err
			}
			s.mu.Unlock()
			break
		}
		m, err := protocol.Decode(doc)
		if err != nil {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
			break
		}
		s.mu.Lock()
		s.msgs = append(s.msgs, m)
		s.mu.Unlock()
		if s.hook != nil && s.hook(s, m) {
			continue
		}
		s.answer(m)
	}
	if s.afterEOF != nil {
		s.afterEOF(s)
	}
	s.w.Close()
}

func (s *fakeServer) send(frame []byte) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = protocol.WriteFramed(s.w, frame)
}

func (s *fakeServer) reply(id int64, method string, res protocol.Payload) {
	s.send(protocol.AppendResult(protocol.NewFrameBuffer(256), id, method, res))
}

func (s *fakeServer) refuse(id int64, e *protocol.Error) {
	s.send(protocol.AppendError(protocol.NewFrameBuffer(256), id, true, e))
}

// answer is the default behaviour.
func (s *fakeServer) answer(m *protocol.Message) {
	if m.Kind != protocol.KindRequest {
		return // start, stop, quit: nothing to say
	}
	switch p := m.Params.(type) {
	case *protocol.InitParams:
		if s.initErr != nil {
			s.refuse(m.ID, s.initErr)
			return
		}
		s.reply(m.ID, m.Method, &protocol.InitResult{Cwd: s.cwd})
	case *protocol.ExecParams:
		switch p.Cmd[0] {
		case "echo":
			s.reply(m.ID, m.Method, &protocol.ExecResult{Stdout: []byte(strings.Join(p.Cmd[1:], " ") + "\n")})
		case "exit":
			n, _ := strconv.Atoi(p.Cmd[1])
			s.reply(m.ID, m.Method, &protocol.ExecResult{Code: int32(n), Stderr: []byte("bye\n")})
		default:
			s.refuse(m.ID, protocol.Errorf(protocol.CodeNotExecutable, "%s: not found", p.Cmd[0]))
		}
	case *protocol.ReadParams:
		s.mu.Lock()
		data, ok := s.files[p.Path]
		s.mu.Unlock()
		if !ok {
			s.refuse(m.ID, protocol.Errorf(protocol.CodeNotFound, "%s: no such file", p.Path))
			return
		}
		off := uint64(0)
		if p.Offset != nil {
			off = min(*p.Offset, uint64(len(data)))
		}
		end := uint64(len(data))
		if p.Len != nil {
			end = min(end, off+*p.Len)
		}
		if s.maxRead > 0 {
			end = min(end, off+uint64(s.maxRead))
		}
		s.reply(m.ID, m.Method, &protocol.ReadResult{Data: data[off:end], Size: uint64(len(data))})
	case *protocol.WriteParams:
		s.mu.Lock()
		var data []byte
		if p.Offset == nil {
			data = bytes.Clone(p.Data)
		} else {
			data = s.files[p.Path]
			if need := *p.Offset + uint64(len(p.Data)); need > uint64(len(data)) {
				data = append(data, make([]byte, need-uint64(len(data)))...)
			}
			copy(data[*p.Offset:], p.Data)
		}
		s.files[p.Path] = data
		s.mu.Unlock()
		s.reply(m.ID, m.Method, &protocol.WriteResult{Size: uint64(len(data))})
	default:
		switch m.Method {
		case protocol.MethodSnapshot:
			s.reply(m.ID, m.Method, &protocol.SnapshotResult{Blob: []byte("layer")})
		default:
			s.refuse(m.ID, protocol.Errorf(protocol.CodeMethodNotFound, "%s", m.Method))
		}
	}
}

func (s *fakeServer) messages() []*protocol.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*protocol.Message(nil), s.msgs...)
}

// methods spells what was received, e.g. "0:init 1:exec start quit".
func (s *fakeServer) methods() string {
	var parts []string
	for _, m := range s.messages() {
		if m.HasID {
			parts = append(parts, strconv.FormatInt(m.ID, 10)+":"+m.Method)
		} else {
			parts = append(parts, m.Method)
		}
	}
	return strings.Join(parts, " ")
}

func (s *fakeServer) file(path string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.files[path]
}

func (s *fakeServer) sawEOF() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eof
}

// harness connects a Console made by New to a fakeServer over io.Pipe.
type harness struct {
	s          *fakeServer
	served     chan struct{}
	clientR    *io.PipeReader
	clientW    *io.PipeWriter
	serverSide *io.PipeWriter
}

func startFake(t *testing.T, s *fakeServer) *harness {
	t.Helper()
	cr, sw := io.Pipe() // server → client
	sr, cw := io.Pipe() // client → server
	s.r, s.w = sr, sw
	h := &harness{s: s, served: make(chan struct{}), clientR: cr, clientW: cw, serverSide: sw}
	go func() {
		defer close(h.served)
		s.serve()
	}()
	t.Cleanup(func() {
		cw.Close()
		sw.Close()
		cr.Close()
		sr.Close()
		select {
		case <-h.served:
		case <-time.After(5 * time.Second):
			t.Errorf("the fake server did not finish")
		}
	})
	return h
}

// open starts a fake server and opens a Console on it, failing the test on error.
func open(t *testing.T, s *fakeServer, opts ...Option) (*Console, *harness) {
	t.Helper()
	h := startFake(t, s)
	c, err := New(context.Background(), h.clientR, h.clientW, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c, h
}

// waitServed waits for the fake server to finish (the client closed its end).
func (h *harness) waitServed(t *testing.T) {
	t.Helper()
	select {
	case <-h.served:
	case <-time.After(5 * time.Second):
		t.Fatalf("the fake server is still serving")
	}
}

func mustBroken(t *testing.T, err error, want string) {
	t.Helper()
	if !errors.Is(err, ErrBroken) {
		t.Fatalf("err = %v, want ErrBroken", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %q, want it to mention %q", err, want)
	}
}

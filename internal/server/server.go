// Package server is the console server's core: the session rules of the Headless Console
// Protocol, written once for every backend.
//
// A Server reads frames from a client, refuses what the protocol refuses, and keeps one
// session: the spec the last init gave (validated here), where the session stands (its
// cwd, in the spelling the client uses), the ports it holds from init to quit, and whether
// a machine is booted. Any call that needs a machine boots one through the Backend
// (start boots early, stop releases, both unanswered); a boot failure reaches the call that
// needed it. Requests are answered one at a time in arrival order while the reader keeps
// reading, so a stop or quit sent during a long exec is seen at once: stop tears the
// machine down under the exec, quit (or EOF) lets the exec finish and be answered first.
//
// Errors from backends and the executor become protocol codes in exactly one place
// (fault.ToProtocol).
package server

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/fault"
	"virtx.dev/virtx/protocol"
)

// Version is what the version method answers.
var Version = "0.1.0"

// Server serves one client over one channel.
type Server struct {
	backend backend.Backend
	log     *slog.Logger

	wmu sync.Mutex
	w   io.Writer

	sess *session
	// frames recycles large frame buffers: a request's once it is answered, a
	// response's once it is written (so moving a file in 16 MiB pieces allocates nothing
	// after the first).
	frames protocol.Recycler
}

// Option configures a Server.
type Option func(*Server)

// WithLogger sets where the server logs (stderr in `virtx serve`; never the protocol
// channel).
func WithLogger(l *slog.Logger) Option { return func(s *Server) { s.log = l } }

// New makes a server whose sessions are made by b.
func New(b backend.Backend, opts ...Option) *Server {
	s := &Server{backend: b, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(s)
	}
	s.sess = newSession(b, s.log)
	return s
}

// work is one message for the worker, or the end of the session. frame is the buffer the
// message was read into (its byte fields alias it), recycled once the message is handled.
type work struct {
	msg   *protocol.Message
	frame []byte
	quit  bool
}

// Serve speaks the protocol over r and w until quit, EOF, or a broken stream, then
// releases everything the session held. It returns nil for a clean end (quit or EOF
// between frames) and the stream's error otherwise.
func (s *Server) Serve(ctx context.Context, r io.Reader, w io.Writer) error {
	s.w = w
	queue := make(chan work, 16)
	readErr := make(chan error, 1)
	go func() { readErr <- s.readLoop(r, queue) }()

	for item := range queue {
		if item.quit {
			break
		}
		s.handle(ctx, item.msg)
		s.frames.Put(item.frame)
	}
	s.sess.close(context.Background())
	err := <-readErr
	if errors.Is(err, io.EOF) || errors.Is(err, errQuit) {
		return nil
	}
	return err
}

var errQuit = errors.New("quit")

// readLoop reads frames and queues work; stop is carried out here, at once, so that it
// never waits behind a running exec. It always ends by queueing a quit.
func (s *Server) readLoop(r io.Reader, queue chan<- work) (err error) {
	defer func() {
		queue <- work{quit: true}
		close(queue)
	}()
	fr := protocol.NewFrameReader(r)
	fr.Recycle(&s.frames)
	for {
		frame, err := fr.ReadFrame()
		if err != nil {
			if err != io.EOF {
				s.log.Error("reading a frame; ending the session", "err", err)
				s.reply(protocol.AppendError(nil, 0, false, protocol.Errorf(protocol.CodeParseError, "%v", err)))
			}
			return err
		}
		msg, err := protocol.Decode(frame)
		if err != nil {
			var pe *protocol.Error
			errors.As(err, &pe)
			s.log.Warn("refused a message", "err", pe)
			s.reply(protocol.AppendError(nil, pe.ID, pe.HasID, pe))
			continue
		}
		s.log.Debug("received", "msg", msg.String())
		switch msg.Kind {
		case protocol.KindResponse:
			e := protocol.Errorf(protocol.CodeInvalidRequest, "the server asks nothing, so it takes no response (id %d)", msg.ID)
			s.reply(protocol.AppendError(nil, msg.ID, true, e))
		case protocol.KindNotification:
			switch msg.Method {
			case protocol.MethodStop:
				s.sess.stop(context.Background())
			case protocol.MethodQuit:
				return errQuit
			default:
				queue <- work{msg: msg, frame: frame}
			}
		default:
			queue <- work{msg: msg, frame: frame}
		}
	}
}

// reply writes one frame (the buffer from an Append* call); a broken stdout is logged,
// and the next read ends the session.
func (s *Server) reply(doc []byte) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := protocol.WriteFrame(s.w, doc); err != nil {
		s.log.Error("writing a response", "err", err)
	}
}

func (s *Server) answer(msg *protocol.Message, result protocol.Payload, err error) {
	if err != nil {
		pe := fault.ToProtocol(err)
		s.log.Debug("answered with an error", "id", msg.ID, "method", msg.Method, "err", pe)
		s.reply(protocol.AppendError(nil, msg.ID, true, pe))
		return
	}
	buf := s.frames.FrameBuffer(protocol.SizeHint(result))
	buf = protocol.AppendResult(buf, msg.ID, msg.Method, result)
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := protocol.WriteFramed(s.w, buf); err != nil {
		s.log.Error("writing a response", "err", err)
	}
	s.frames.Put(buf)
}

// handle runs one request (or a start) to its answer.
func (s *Server) handle(ctx context.Context, msg *protocol.Message) {
	if msg.Kind == protocol.KindNotification { // start
		if _, err := s.sess.up(ctx); err != nil {
			s.log.Warn("start: boot failed; the next call will try again", "err", err)
		}
		return
	}
	var (
		res protocol.Payload
		err error
	)
	switch p := msg.Params.(type) {
	case *protocol.InitParams:
		res, err = s.sess.init(ctx, p)
	case *protocol.ExecParams:
		res, err = s.sess.exec(ctx, p)
	case *protocol.ReadParams:
		res, err = s.sess.read(ctx, p)
	case *protocol.WriteParams:
		res, err = s.sess.write(ctx, p)
	case *protocol.BuildImageParams:
		res, err = s.buildImage(ctx, p)
	case *protocol.RemoveImageParams:
		err = s.removeImage(ctx, p)
		res = protocol.Empty{}
	default:
		switch msg.Method {
		case protocol.MethodVersion:
			res = &protocol.VersionResult{Version: Version}
		case protocol.MethodListImages:
			res, err = s.listImages(ctx)
		case protocol.MethodSnapshot:
			res, err = s.sess.snapshot(ctx)
		default:
			err = protocol.Errorf(protocol.CodeInternalError, "no handler for %s", msg.Method)
		}
	}
	s.answer(msg, res, err)
}

// Abort ends the session from outside the channel (a signal): the machine is shut down
// and the ports released. Serve is not waited for.
func (s *Server) Abort() { s.sess.close(context.Background()) }

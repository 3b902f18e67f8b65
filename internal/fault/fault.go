// Package fault is the one place an internal error becomes a protocol error code. The
// server uses it for what it answers a client, and the relay inside a boundary for what
// an executor answers the server; an error that already is a *protocol.Error passes
// through untouched, so a code chosen inside a guest reaches the client as it was.
package fault

import (
	"context"
	"errors"
	"io/fs"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

// ToProtocol maps err to the protocol error a peer is answered with.
func ToProtocol(err error) *protocol.Error {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe
	}
	var te *executor.TimeoutError
	code := protocol.CodeInternalError
	switch {
	case errors.As(err, &te):
		return &protocol.Error{Code: protocol.CodeTimedOut, Message: te.Error()}
	case errors.Is(err, executor.ErrNotExecutable):
		code = protocol.CodeNotExecutable
	case errors.Is(err, executor.ErrInvalidArgument), errors.Is(err, backend.ErrInvalidSpec),
		errors.Is(err, backend.ErrBuildFailed):
		code = protocol.CodeInvalidParams
	case errors.Is(err, backend.ErrMountFailed):
		code = protocol.CodeMountFailed
	case errors.Is(err, backend.ErrBootFailed), errors.Is(err, backend.ErrSessionStopped),
		errors.Is(err, backend.ErrMachineGone):
		code = protocol.CodeBootFailed
	case errors.Is(err, backend.ErrUnsupportedMount):
		code = protocol.CodeUnsupportedMount
	case errors.Is(err, backend.ErrUnsupportedNetwork):
		code = protocol.CodeUnsupportedNetwork
	case errors.Is(err, backend.ErrUnsupportedImage):
		code = protocol.CodeUnsupportedImage
	case errors.Is(err, backend.ErrUnknownImage):
		code = protocol.CodeUnknownImage
	case errors.Is(err, backend.ErrUnsupportedMachine):
		code = protocol.CodeUnsupportedMachine
	case errors.Is(err, backend.ErrMethodNotAvailable):
		code = protocol.CodeMethodNotFound
	case errors.Is(err, executor.ErrReadOnly), errors.Is(err, backend.ErrSnapshotTooLarge):
		code = protocol.CodeIOFailed
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, unix.ENOTDIR):
		code = protocol.CodeNotFound
	case errors.Is(err, unix.EISDIR):
		code = protocol.CodeIsADirectory
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		code = protocol.CodeInternalError
	default:
		var errno unix.Errno
		if errors.As(err, &errno) || errors.As(err, new(*fs.PathError)) {
			code = protocol.CodeIOFailed
		}
	}
	return &protocol.Error{Code: code, Message: err.Error()}
}

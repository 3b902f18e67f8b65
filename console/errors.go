package console

import (
	"errors"
	"fmt"

	"virtx.dev/virtx/protocol"
)

var (
	// ErrBroken is a channel that can no longer be used: the server exited or closed its
	// end, a write to it failed, or it broke the protocol. Errors wrapping it say which,
	// with the server's exit status and last stderr line when they are known.
	ErrBroken = errors.New("console: channel broken")

	// ErrClosed is a call made on (or still waiting on) a Console that was closed.
	ErrClosed = errors.New("console: closed")

	// ErrInvalidOption is an option refused before anything was started or sent. Errors
	// wrapping it name the option.
	ErrInvalidOption = errors.New("console: invalid option")
)

// RefusedError is a call the server answered with an error.
//
// It unwraps to the equivalent *protocol.Error, so
//
//	errors.Is(err, &protocol.Error{Code: protocol.CodeTimedOut})
//
// and protocol.CodeOf(err) both see its code, as does
// errors.Is(err, &console.RefusedError{Code: protocol.CodeTimedOut}).
type RefusedError struct {
	Code    protocol.Code
	Message string
	Method  string // the method refused: "init", "exec", "read", …
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("console: %s refused: %s (%d): %s", e.Method, e.Code, int64(e.Code), e.Message)
}

// Unwrap returns the refusal as a *protocol.Error.
func (e *RefusedError) Unwrap() error {
	return &protocol.Error{Code: e.Code, Message: e.Message}
}

// Is reports whether target is a *RefusedError with the same code. (The method is not
// compared: the refusal unwraps to a *protocol.Error, which matches any target carrying
// its code. Use errors.As to look at the method.)
func (e *RefusedError) Is(target error) bool {
	t, ok := target.(*RefusedError)
	return ok && t.Code == e.Code
}

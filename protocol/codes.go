package protocol

import (
	"errors"
	"fmt"
)

// Code is a JSON-RPC error code. The -32000…-32099 range holds the protocol's own.
type Code int64

// The error codes of the Headless Console Protocol. -32003, -32004 and -32014 name nothing.
const (
	CodeTimedOut           Code = -32000 // exec: killed at timeout_ms
	CodeNotExecutable      Code = -32001 // exec: the program was not there, or would not start
	CodeBootFailed         Code = -32002 // the backend could not be brought up
	CodeNotFound           Code = -32005 // read/write: nothing at the path (or above it)
	CodeIsADirectory       Code = -32006 // read/write: the name is a directory
	CodeIOFailed           Code = -32007 // read/write: anything else, including a write under an ro tree
	CodeUnsupportedMount   Code = -32008 // init: a tree this server has no provider for
	CodeMountFailed        Code = -32009 // a tree could not be mounted at boot
	CodeUnsupportedNetwork Code = -32010 // init: a network this server cannot give
	CodeUnsupportedImage   Code = -32011 // init: this backend has no base to swap
	CodeUnknownImage       Code = -32012 // init: no such built image
	CodeUnsupportedMachine Code = -32013 // init: a machine shape this server cannot make
	CodeParseError         Code = -32700
	CodeInvalidRequest     Code = -32600
	CodeMethodNotFound     Code = -32601
	CodeInvalidParams      Code = -32602
	CodeInternalError      Code = -32603
)

var codeNames = map[Code]string{
	CodeTimedOut:           "TIMED_OUT",
	CodeNotExecutable:      "NOT_EXECUTABLE",
	CodeBootFailed:         "BOOT_FAILED",
	CodeNotFound:           "NOT_FOUND",
	CodeIsADirectory:       "IS_A_DIRECTORY",
	CodeIOFailed:           "IO_FAILED",
	CodeUnsupportedMount:   "UNSUPPORTED_MOUNT",
	CodeMountFailed:        "MOUNT_FAILED",
	CodeUnsupportedNetwork: "UNSUPPORTED_NETWORK",
	CodeUnsupportedImage:   "UNSUPPORTED_IMAGE",
	CodeUnknownImage:       "UNKNOWN_IMAGE",
	CodeUnsupportedMachine: "UNSUPPORTED_MACHINE",
	CodeParseError:         "PARSE_ERROR",
	CodeInvalidRequest:     "INVALID_REQUEST",
	CodeMethodNotFound:     "METHOD_NOT_FOUND",
	CodeInvalidParams:      "INVALID_PARAMS",
	CodeInternalError:      "INTERNAL_ERROR",
}

// String names the code as the protocol does ("TIMED_OUT"), or gives the number.
func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("code %d", int64(c))
}

// Error is a JSON-RPC error object: what a server answers instead of a result.
type Error struct {
	Code    Code
	Message string
	// ID is the id of the request refused, when one could be read (only meaningful on
	// errors returned by Decode; an error answered by a server carries its id in the
	// envelope).
	ID    int64
	HasID bool
}

// Errorf makes an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (%d): %s", e.Code, int64(e.Code), e.Message)
}

// Is reports whether target is an *Error with the same code, so that
// errors.Is(err, &protocol.Error{Code: protocol.CodeNotFound}) works.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) {
		return t.Code == e.Code
	}
	return false
}

// CodeOf returns the protocol code err carries, if it is (or wraps) an *Error.
func CodeOf(err error) (Code, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Code, true
	}
	return 0, false
}

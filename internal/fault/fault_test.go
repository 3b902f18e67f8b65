package fault

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

func TestToProtocol(t *testing.T) {
	_, enoent := os.Open("/no/such/file/virtx")
	for _, c := range []struct {
		err  error
		code protocol.Code
	}{
		{&executor.TimeoutError{After: 5 * time.Second}, protocol.CodeTimedOut},
		{fmt.Errorf("x: %w", executor.ErrNotExecutable), protocol.CodeNotExecutable},
		{fmt.Errorf("x: %w", executor.ErrInvalidArgument), protocol.CodeInvalidParams},
		{fmt.Errorf("x: %w", executor.ErrReadOnly), protocol.CodeIOFailed},
		{enoent, protocol.CodeNotFound},
		{&fs.PathError{Op: "open", Path: "/x", Err: unix.ENOTDIR}, protocol.CodeNotFound},
		{&fs.PathError{Op: "open", Path: "/x", Err: unix.EISDIR}, protocol.CodeIsADirectory},
		{&fs.PathError{Op: "write", Path: "/x", Err: unix.ENOSPC}, protocol.CodeIOFailed},
		{&fs.PathError{Op: "write", Path: "/x", Err: unix.EROFS}, protocol.CodeIOFailed},
		{fmt.Errorf("%w: x", backend.ErrInvalidSpec), protocol.CodeInvalidParams},
		{fmt.Errorf("%w: x", backend.ErrUnsupportedMount), protocol.CodeUnsupportedMount},
		{fmt.Errorf("%w: x", backend.ErrUnsupportedNetwork), protocol.CodeUnsupportedNetwork},
		{fmt.Errorf("%w: x", backend.ErrUnsupportedImage), protocol.CodeUnsupportedImage},
		{fmt.Errorf("%w: x", backend.ErrUnknownImage), protocol.CodeUnknownImage},
		{fmt.Errorf("%w: x", backend.ErrUnsupportedMachine), protocol.CodeUnsupportedMachine},
		{fmt.Errorf("%w: x", backend.ErrBootFailed), protocol.CodeBootFailed},
		{fmt.Errorf("%w: x", backend.ErrMountFailed), protocol.CodeMountFailed},
		{fmt.Errorf("%w: x", backend.ErrSessionStopped), protocol.CodeBootFailed},
		{fmt.Errorf("%w: x", backend.ErrMachineGone), protocol.CodeBootFailed},
		{fmt.Errorf("build: step 2/3: %w", fmt.Errorf("%w: RUN exited with status 1", backend.ErrBuildFailed)), protocol.CodeInvalidParams},
		{fmt.Errorf("%w: x", backend.ErrMethodNotAvailable), protocol.CodeMethodNotFound},
		{fmt.Errorf("%w: x", backend.ErrSnapshotTooLarge), protocol.CodeIOFailed},
		{&protocol.Error{Code: protocol.CodeIsADirectory, Message: "relayed"}, protocol.CodeIsADirectory},
		{fmt.Errorf("wrapped: %w", &protocol.Error{Code: protocol.CodeNotFound}), protocol.CodeNotFound},
		{errors.New("something odd"), protocol.CodeInternalError},
	} {
		if got := ToProtocol(c.err); got.Code != c.code {
			t.Errorf("%v → %v, want %v", c.err, got.Code, c.code)
		}
	}
	if m := ToProtocol(&executor.TimeoutError{After: 5 * time.Second}).Message; m != "killed after 5000ms" {
		t.Errorf("timeout message %q", m)
	}
}

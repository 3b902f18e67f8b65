package executor

import (
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// DefaultOutputLimit is the number of bytes kept per stream when
// Config.OutputLimit is 0.
const DefaultOutputLimit = 16 << 20

// DefaultReadLimit is the most data one Read returns when Config.ReadLimit
// is 0: 64 MiB less 64 KiB, so that a result frame carrying it still fits in
// the protocol's 64 MiB frame cap.
const DefaultReadLimit = 64<<20 - 64<<10

// Config is what an Executor is made with. The zero value is usable: no
// environment, nothing read-only, default limits, not a subreaper.
type Config struct {
	// Env is the base environment of every command ("K=V"). PWD is set per
	// Exec to the session cwd (replacing any PWD here), and program lookups
	// use this Env's PATH, not the executor process's own.
	Env []string

	// ReadOnly lists absolute guest paths of read-only trees. A Write whose
	// real target (symlinks resolved) lies under one fails with an error
	// matching ErrReadOnly.
	ReadOnly []string

	// OutputLimit is the number of bytes kept per stream (stdout, stderr);
	// 0 means DefaultOutputLimit. Output beyond it is read and discarded and
	// the result says Truncated; the command is not killed for it.
	OutputLimit int

	// ReadLimit is the most data one Read returns; 0 means DefaultReadLimit.
	ReadLimit int

	// Subreaper makes this process a child subreaper
	// (prctl PR_SET_CHILD_SUBREAPER), so orphaned descendants of commands
	// are re-parented to it and can be killed and reaped. It changes the
	// whole process and cannot be undone: servers set it, tests that share
	// the process must not. See the package documentation.
	Subreaper bool

	// StartOn, when set, is handed each command's start (the fork and exec) to run and
	// return its error: the sandbox's PID 1 runs it on the one thread whose capability
	// bounding set commands are to inherit (a bounding set belongs to a thread, and a
	// child starts with the forking thread's). Nil: a command starts from the goroutine
	// that runs Exec.
	StartOn func(start func() error) error
}

// ExecRequest is one command to run.
type ExecRequest struct {
	// Cmd is the argv; it is not given to a shell. Empty is an error
	// matching ErrInvalidArgument.
	Cmd []string
	// Timeout kills the command's whole process tree when it expires;
	// 0 is no timeout.
	Timeout time.Duration
	// Cwd is the session's current directory in the session's own spelling.
	// It must be absolute.
	Cwd string
}

// ExecResult is how a command ended.
type ExecResult struct {
	Code      int32  // exit status, or 128+signal when a signal killed it
	Stdout    []byte // byte exact, at most OutputLimit bytes
	Stderr    []byte // byte exact, at most OutputLimit bytes
	Truncated bool   // either stream wrote more than OutputLimit bytes
	// Cwd is the session cwd after the command. Only the `cd` the executor
	// interprets changes it; otherwise it is the request's Cwd (cleaned).
	Cwd string
}

var (
	// ErrNotExecutable is matched by Exec errors for a program that is not
	// there or would not start (not found, not executable, exec format
	// error, unusable working directory).
	ErrNotExecutable = errors.New("not executable")
	// ErrReadOnly is matched by Write errors for a target under a read-only
	// tree (Config.ReadOnly, or a filesystem that answers EROFS).
	ErrReadOnly = errors.New("read-only tree")
	// ErrInvalidArgument is matched by errors for requests that are
	// malformed: an empty argv, a relative path, a negative offset.
	ErrInvalidArgument = errors.New("invalid argument")
)

// TimeoutError is returned by Exec when the request's Timeout expired and
// the command's process tree was killed. There is no result with it.
type TimeoutError struct{ After time.Duration }

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("killed after %dms", e.After.Milliseconds())
}

// invalidArg is an error matching ErrInvalidArgument with a message saying
// which argument and why.
func invalidArg(format string, args ...any) error {
	return &wrapError{msg: fmt.Sprintf(format, args...), errs: []error{ErrInvalidArgument}}
}

// wrapError is an error with its own message that matches every error in
// errs (errors.Is / errors.As).
type wrapError struct {
	msg  string
	errs []error
}

func (e *wrapError) Error() string   { return e.msg }
func (e *wrapError) Unwrap() []error { return e.errs }

// execError reports a program that could not be started. It matches
// ErrNotExecutable and the underlying cause (an errno, exec.ErrNotFound).
type execError struct {
	name string
	err  error
}

func (e *execError) Error() string {
	return "exec: " + strconv.Quote(e.name) + ": " + e.err.Error()
}

func (e *execError) Unwrap() []error { return []error{ErrNotExecutable, e.err} }

// Executor runs commands and touches files for one session. Its methods are
// safe for concurrent use. Make one with New.
type Executor struct {
	cfg       Config   // as given to New, with limits defaulted
	env       []string // Config.Env without PWD
	roRoots   []string // Config.ReadOnly, cleaned
	outLimit  int
	readLimit int
	platform  // per-OS state
}

// newExecutor validates cfg and fills in the portable part of an Executor.
func newExecutor(cfg Config) (*Executor, error) {
	if cfg.OutputLimit < 0 {
		return nil, invalidArg("executor: negative OutputLimit %d", cfg.OutputLimit)
	}
	if cfg.ReadLimit < 0 {
		return nil, invalidArg("executor: negative ReadLimit %d", cfg.ReadLimit)
	}
	e := &Executor{cfg: cfg, outLimit: cfg.OutputLimit, readLimit: cfg.ReadLimit}
	if e.outLimit == 0 {
		e.outLimit = DefaultOutputLimit
	}
	if e.readLimit == 0 {
		e.readLimit = DefaultReadLimit
	}
	for _, kv := range cfg.Env {
		if strings.HasPrefix(kv, "PWD=") {
			continue
		}
		e.env = append(e.env, kv)
	}
	for _, ro := range cfg.ReadOnly {
		if !path.IsAbs(ro) {
			return nil, invalidArg("executor: read-only path %q is not absolute", ro)
		}
		e.roRoots = append(e.roRoots, path.Clean(ro))
	}
	e.cfg.Env = append([]string(nil), cfg.Env...)
	e.cfg.ReadOnly = append([]string(nil), cfg.ReadOnly...)
	return e, nil
}

// getenv returns the value of the last key=... entry in env, as os/exec
// would pass it on.
func getenv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// cleanAbs returns p cleaned, or an ErrInvalidArgument error if p is not
// absolute. what names the argument in the message.
func cleanAbs(what, p string) (string, error) {
	if !path.IsAbs(p) {
		return "", invalidArg("%s %q is not an absolute path", what, p)
	}
	return path.Clean(p), nil
}

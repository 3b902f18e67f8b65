//go:build linux

package executor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// drainGrace is how long Exec keeps reading a command's pipes after the
// command itself has exited, for output its background children still hold.
const drainGrace = 200 * time.Millisecond

// platform is the Linux part of an Executor: the processes it has started.
type platform struct {
	mu sync.Mutex
	// running maps the pid of each command os/exec has not reaped yet to its
	// identity. It is also the process group id of that command. Start and
	// the insertion happen under mu, and the reaper checks it under mu, so
	// the reaper never takes the wait status of one of these.
	running map[int]procID
	// groups holds the process groups of finished commands that still had
	// members (background processes), keyed by group id with the identity
	// of the (reaped) leader.
	groups map[int]procID
}

// procID identifies one process across pid reuse: its pid and its start
// time in clock ticks since boot (/proc/PID/stat field 22).
type procID struct {
	pid   int
	start uint64
}

// New makes an Executor. With cfg.Subreaper it makes this process a child
// subreaper, which lasts for the life of the process.
func New(cfg Config) (*Executor, error) {
	e, err := newExecutor(cfg)
	if err != nil {
		return nil, err
	}
	e.running = map[int]procID{}
	e.groups = map[int]procID{}
	if cfg.Subreaper {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("executor: prctl(PR_SET_CHILD_SUBREAPER): %w", err)
		}
	}
	return e, nil
}

// Exec runs req.Cmd in req.Cwd and returns how it ended. `cd` and `pwd`
// (without -P) are answered by the executor itself; everything else is run
// as a program, without a shell. It returns a *TimeoutError if req.Timeout
// expired and ctx.Err() if ctx ended first; in both cases the command's
// process tree has been killed and there is no result.
func (e *Executor) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	if len(req.Cmd) == 0 {
		return ExecResult{}, invalidArg("exec: empty command")
	}
	cwd, err := cleanAbs("exec: cwd", req.Cwd)
	if err != nil {
		return ExecResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return ExecResult{}, err
	}
	switch req.Cmd[0] {
	case "cd":
		return e.cd(req.Cmd[1:], cwd), nil
	case "pwd":
		if len(req.Cmd) == 1 || (len(req.Cmd) == 2 && req.Cmd[1] == "-L") {
			return ExecResult{Stdout: []byte(cwd + "\n"), Stderr: []byte{}, Cwd: cwd}, nil
		}
	}
	return e.run(ctx, req, cwd)
}

// cd is the `cd` builtin: it moves the session's cwd, logically (the
// spelling is joined and cleaned, never canonicalised), like a shell's
// default `cd -L`. Failures are results with code 1 (2 for a bad option),
// as a shell answers them.
func (e *Executor) cd(args []string, cwd string) ExecResult {
	fail := func(code int32, msg string) ExecResult {
		return ExecResult{Code: code, Stdout: []byte{}, Stderr: []byte("cd: " + msg + "\n"), Cwd: cwd}
	}
	physical := false
options:
	for len(args) > 0 && len(args[0]) > 1 && args[0][0] == '-' {
		opt := args[0]
		args = args[1:]
		if opt == "--" {
			break
		}
		for _, c := range opt[1:] {
			switch c {
			case 'L':
				physical = false
			case 'P':
				physical = true
			default:
				return fail(2, opt+": invalid option\ncd: usage: cd [-L|-P] [dir]")
			}
		}
		continue options
	}
	var dir string
	switch len(args) {
	case 0:
		dir, _ = getenv(e.env, "HOME")
		if dir == "" {
			dir = "/"
		}
	case 1:
		dir = args[0]
		if dir == "-" {
			// There is no OLDPWD: the executor keeps no state between calls.
			return fail(1, "OLDPWD not set")
		}
	default:
		return fail(1, "too many arguments")
	}
	if dir == "" { // like bash: `cd ""` stays put
		return ExecResult{Stdout: []byte{}, Stderr: []byte{}, Cwd: cwd}
	}
	target := dir
	if !path.IsAbs(target) {
		target = path.Join(cwd, target)
	}
	target = path.Clean(target)
	if err := checkDir(target); err != nil {
		return fail(1, dir+": "+errnoText(err))
	}
	if physical {
		real, err := filepath.EvalSymlinks(target)
		if err != nil {
			return fail(1, dir+": "+errnoText(err))
		}
		target = real
	}
	return ExecResult{Stdout: []byte{}, Stderr: []byte{}, Cwd: target}
}

// checkDir reports whether p is a directory one can chdir into, as the
// errno chdir(2) would give.
func checkDir(p string) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return unix.ENOTDIR
	}
	return unix.Faccessat(unix.AT_FDCWD, p, unix.X_OK, unix.AT_EACCESS)
}

// errnoText is err's errno message capitalised, as a shell prints it
// ("No such file or directory").
func errnoText(err error) string {
	var errno unix.Errno
	s := err.Error()
	if errors.As(err, &errno) {
		s = errno.Error()
	}
	if s != "" && 'a' <= s[0] && s[0] <= 'z' {
		s = string(s[0]-'a'+'A') + s[1:]
	}
	return s
}

// lookPath finds the program argv[0] names: through the PATH of the
// configured environment when it has no '/', else relative to cwd. The
// path it returns is handed to execve as is (not cleaned), so `..` after a
// symlink means what it means to the kernel and to a shell.
func (e *Executor) lookPath(name, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !path.IsAbs(p) {
			p = cwd + "/" + p
		}
		if err := checkExecutable(p); err != nil {
			return "", &execError{name: name, err: err}
		}
		return p, nil
	}
	pathEnv, _ := getenv(e.env, "PATH")
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "." // POSIX: an empty PATH entry is the current directory
		}
		if !path.IsAbs(dir) {
			dir = cwd + "/" + dir
		}
		p := dir + "/" + name
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", &execError{name: name, err: exec.ErrNotFound}
}

// checkExecutable returns nil if p is a regular file this process may
// execute, else the errno execve(2) would most likely answer.
func checkExecutable(p string) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return unix.EISDIR
	default:
		return unix.EACCES
	}
	if st.Mode&0o111 == 0 {
		return unix.EACCES
	}
	return unix.Faccessat(unix.AT_FDCWD, p, unix.X_OK, unix.AT_EACCESS)
}

// startError classifies an error from exec.Cmd.Start: the errnos execve
// answers for a program that will not start become ErrNotExecutable.
func startError(name string, err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.ENOENT, unix.ENOTDIR, unix.EACCES, unix.EPERM, unix.ENOEXEC,
			unix.EISDIR, unix.ELOOP, unix.ENAMETOOLONG, unix.ETXTBSY, unix.E2BIG,
			unix.ELIBBAD:
			return &execError{name: name, err: errno}
		}
	}
	return fmt.Errorf("exec %q: %w", name, err)
}

// run runs a program and collects its result.
func (e *Executor) run(ctx context.Context, req ExecRequest, cwd string) (ExecResult, error) {
	name := req.Cmd[0]
	prog, err := e.lookPath(name, cwd)
	if err != nil {
		return ExecResult{}, err
	}
	if err := checkDir(cwd); err != nil {
		return ExecResult{}, &execError{name: name, err: &fs.PathError{Op: "chdir", Path: cwd, Err: err}}
	}
	e.reap()

	outR, outW, err := os.Pipe()
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec %q: %w", name, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return ExecResult{}, fmt.Errorf("exec %q: %w", name, err)
	}
	env := make([]string, 0, len(e.env)+1)
	env = append(env, e.env...)
	env = append(env, "PWD="+cwd)
	cmd := &exec.Cmd{
		Path:        prog,
		Args:        req.Cmd,
		Env:         env,
		Dir:         cwd,
		Stdout:      outW,
		Stderr:      errW,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}

	e.mu.Lock()
	if e.cfg.StartOn != nil {
		err = e.cfg.StartOn(cmd.Start)
	} else {
		err = cmd.Start()
	}
	var id procID
	if err == nil {
		// The child is ours and unreaped (os/exec has not waited yet), so
		// its pid cannot have been reused: its start time identifies it.
		id = procID{pid: cmd.Process.Pid}
		if st, serr := readStat(id.pid); serr == nil {
			id.start = st.start
		}
		e.running[id.pid] = id
	}
	e.mu.Unlock()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return ExecResult{}, startError(name, err)
	}

	stdout := newCapture(outR, e.outLimit)
	stderr := newCapture(errR, e.outLimit)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()

	var expired <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		expired = t.C
	}
	var waitErr, stopErr error
	select {
	case waitErr = <-waited:
	case <-expired:
		stopErr = &TimeoutError{After: req.Timeout}
	case <-ctx.Done():
		stopErr = ctx.Err()
	}
	if stopErr != nil {
		select {
		case waitErr = <-waited: // it ended just in time: report that
			stopErr = nil
		default:
		}
	}
	if stopErr != nil {
		e.killTree(&selector{groups: map[int]procID{id.pid: id}})
		<-waited
		e.mu.Lock()
		if e.running[id.pid] == id {
			delete(e.running, id.pid)
		}
		e.mu.Unlock()
		stdout.abort()
		stderr.abort()
		e.reap()
		return ExecResult{}, stopErr
	}
	// From here on, what is left of the command (background processes) is
	// found through its process group.
	e.finished(id)

	deadline := time.Now().Add(drainGrace)
	res := ExecResult{Cwd: cwd}
	var outTrunc, errTrunc bool
	res.Stdout, outTrunc = stdout.finish(deadline)
	res.Stderr, errTrunc = stderr.finish(deadline)
	res.Truncated = outTrunc || errTrunc
	e.reap()

	if cmd.ProcessState == nil {
		return ExecResult{}, fmt.Errorf("exec %q: wait: %w", name, waitErr)
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		return ExecResult{}, fmt.Errorf("exec %q: wait: no wait status", name)
	}
	switch {
	case ws.Exited():
		res.Code = int32(ws.ExitStatus())
	case ws.Signaled():
		res.Code = 128 + int32(ws.Signal())
	default:
		return ExecResult{}, fmt.Errorf("exec %q: unexpected wait status %#x", name, uint32(ws))
	}
	return res, nil
}

// capture collects one output stream of a command, keeping at most limit
// bytes and discarding the rest.
type capture struct {
	f         *os.File
	limit     int
	buf       []byte
	truncated bool
	done      chan struct{} // closed when buf and truncated are final
}

func newCapture(f *os.File, limit int) *capture {
	c := &capture{f: f, limit: limit, done: make(chan struct{})}
	go c.loop()
	return c
}

func (c *capture) loop() {
	var scratch []byte
	for {
		var n int
		var err error
		if len(c.buf) < c.limit {
			if len(c.buf) == cap(c.buf) {
				// Grow by hand so the capacity never exceeds the limit.
				nc := min(max(2*cap(c.buf), 4<<10), c.limit)
				nb := make([]byte, len(c.buf), nc)
				copy(nb, c.buf)
				c.buf = nb
			}
			n, err = c.f.Read(c.buf[len(c.buf):cap(c.buf)])
			c.buf = c.buf[:len(c.buf)+n]
		} else {
			if scratch == nil {
				scratch = make([]byte, 32<<10)
			}
			n, err = c.f.Read(scratch)
			if n > 0 {
				c.truncated = true
			}
		}
		if err == nil {
			continue
		}
		if c.buf == nil {
			c.buf = []byte{}
		}
		close(c.done)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The command has exited and something it left behind still
			// holds the pipe. Keep draining, and discarding, so that it is
			// not killed by SIGPIPE, until it closes its end.
			if scratch == nil {
				scratch = make([]byte, 4<<10)
			}
			if c.f.SetReadDeadline(time.Time{}) == nil {
				for {
					if _, err := c.f.Read(scratch); err != nil {
						break
					}
				}
			}
		}
		c.f.Close()
		return
	}
}

// finish waits until the stream ends or deadline passes and returns what
// was kept.
func (c *capture) finish(deadline time.Time) ([]byte, bool) {
	c.f.SetReadDeadline(deadline)
	<-c.done
	return c.buf, c.truncated
}

// abort stops collecting and closes the pipe.
func (c *capture) abort() {
	c.f.Close()
	<-c.done
}

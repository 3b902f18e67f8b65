package console

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// CacheDir is the directory that holds all of virtx's state on this host, and that can be
// deleted at any time: $VIRTX_HOME when set, else $XDG_CACHE_HOME/virtx when that is set
// and absolute, else ~/.cache/virtx. It is not created.
func CacheDir() (string, error) {
	if d := os.Getenv("VIRTX_HOME"); d != "" {
		return filepath.Abs(d)
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "virtx"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("console: no cache directory: set VIRTX_HOME: %w", err)
	}
	return filepath.Join(home, ".cache", "virtx"), nil
}

// defaultServer is the server command when WithServer is not given.
func defaultServer() ([]string, error) {
	if s := os.Getenv("VIRTX_SERVER"); s != "" {
		argv := strings.Fields(s)
		if len(argv) > 0 {
			return argv, nil
		}
	}
	if p, err := exec.LookPath("virtx"); err == nil {
		return []string{p, "serve"}, nil
	}
	dir, err := CacheDir()
	if err != nil {
		return nil, err
	}
	p := filepath.Join(dir, "bin", "virtx-uvm")
	if _, err := os.Stat(p); err != nil {
		return nil, fmt.Errorf("console: no server: VIRTX_SERVER is not set, virtx is not on PATH, and %s is not there: %w", p, err)
	}
	return []string{p}, nil
}

// process is a server this package started.
type process struct {
	argv   []string
	cmd    *exec.Cmd
	stdout *os.File // our end of the server's stdout
	tail   *tailWriter

	exited  chan struct{} // closed once Wait has returned
	waitErr error         // set before exited is closed
}

// spawn starts the server with its stdin and stdout on pipes of our own (so that Wait,
// which runs as soon as it starts, never races a read) and its stderr through tail.
func spawn(argv, env []string, stderr io.Writer) (p *process, stdin *os.File, err error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("console: start server: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, nil, fmt.Errorf("console: start server: %w", err)
	}
	growPipe(inW)
	growPipe(outR)
	tail := &tailWriter{w: stderr}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, tail
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	// A server that has exited but left a child holding its stderr is not waited for
	// beyond this.
	cmd.WaitDelay = 2 * time.Second
	err = cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, nil, fmt.Errorf("console: start server %q: %w", argv, err)
	}
	p = &process{argv: argv, cmd: cmd, stdout: outR, tail: tail, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, inW, nil
}

// kill ends the server now.
func (p *process) kill() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Kill()
	}
}

// describe says how the server ended (waiting up to d for it to), with its last stderr
// line, for an error message.
func (p *process) describe(d time.Duration) string {
	var s string
	select {
	case <-p.exited:
		if p.waitErr != nil {
			s = "the server " + describeExit(p.waitErr)
		} else {
			s = "the server exited with status 0"
		}
	case <-time.After(d):
		s = "the server is still running"
	}
	if line := p.tail.lastLine(); line != "" {
		s += fmt.Sprintf("; its last stderr line: %q", line)
	}
	return s
}

func describeExit(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return "exited: " + ee.Error() // "exit status 3", "signal: killed"
	}
	return "could not be waited for: " + err.Error()
}

// tailWriter passes the server's stderr through and keeps its last few KiB. A failing
// destination is ignored rather than passed back: the copy would stop and the server
// would block writing to a full pipe.
type tailWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

const tailSize = 4 << 10

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.w != nil {
		_, _ = t.w.Write(p)
	}
	if len(p) >= tailSize {
		t.buf = append(t.buf[:0], p[len(p)-tailSize:]...)
	} else {
		if over := len(t.buf) + len(p) - tailSize; over > 0 {
			t.buf = append(t.buf[:0], t.buf[over:]...)
		}
		t.buf = append(t.buf, p...)
	}
	return len(p), nil
}

// lastLine is the last non-empty line written, trimmed and at most 512 bytes.
func (t *tailWriter) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := bytes.TrimRight(t.buf, " \t\r\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	b = bytes.TrimSpace(b)
	if len(b) > 512 {
		b = b[len(b)-512:]
	}
	return string(b)
}

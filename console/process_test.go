package console

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// helperEnv switches the test binary into a fake console server over its own stdio; its
// value says how the server behaves.
const helperEnv = "VIRTX_CONSOLE_TEST_SERVER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperServer(mode))
	}
	os.Exit(m.Run())
}

// helperServer is the fake server as a process, speaking on stdin and stdout and
// chatting on stderr.
func helperServer(mode string) int {
	fmt.Fprintf(os.Stderr, "helper: serving (%s)\n", mode)
	s := newFake()
	s.r, s.w = os.Stdin, os.Stdout
	s.files["/work/hello"] = []byte("hello from the helper\n")
	sawQuit := false
	s.hook = func(s *fakeServer, m *protocol.Message) bool {
		if m.Method == protocol.MethodQuit {
			sawQuit = true
		}
		switch {
		case mode == "die-on-exec" && m.Method == protocol.MethodExec:
			fmt.Fprintln(os.Stderr, "helper: panic: the backend went away")
			os.Exit(3)
		case mode == "ignore-quit" && m.Method == protocol.MethodQuit:
			time.Sleep(time.Hour)
		case m.Method == protocol.MethodExec && m.Params.(*protocol.ExecParams).Cmd[0] == "env":
			name := m.Params.(*protocol.ExecParams).Cmd[1]
			s.reply(m.ID, m.Method, &protocol.ExecResult{Stdout: []byte(os.Getenv(name))})
			return true
		}
		return false
	}
	if mode == "refuse-init" {
		s.initErr = protocol.Errorf(protocol.CodeUnsupportedMachine, "no GPU here")
	}
	s.serve()
	fmt.Fprintf(os.Stderr, "helper: stdin closed, quit=%t\n", sawQuit)
	if mode == "fail-after-quit" {
		return 5
	}
	return 0
}

// helper is the option set that runs the test binary as the server.
func helper(t *testing.T, mode string, stderr *syncBuffer) []Option {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return []Option{
		WithServer(exe, "-test.run=^$"),
		// GORACE: a -race helper otherwise sleeps a second on its way out.
		WithServerEnv([]string{helperEnv + "=" + mode, "VIRTX_TEST_MARK=marked", "GORACE=atexit_sleep_ms=0"}),
		WithStderr(stderr),
	}
}

func TestOpenRunsTheServer(t *testing.T) {
	stderr := &syncBuffer{}
	ctx := context.Background()
	c, err := Open(ctx, append(helper(t, "ok", stderr), WithReadOnlyMount(".", "/work"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Cwd() != "/work" || len(c.Mounts()) != 1 {
		t.Errorf("cwd %q, mounts %q", c.Cwd(), c.Mounts())
	}
	res, err := c.Exec(ctx, []string{"env", "VIRTX_TEST_MARK"})
	if err != nil || string(res.Stdout) != "marked" {
		t.Fatalf("server env: %q, %v", res.Stdout, err)
	}
	got, err := c.ReadFile(ctx, "/work/hello")
	if err != nil || string(got) != "hello from the helper\n" {
		t.Fatalf("readfile: %q, %v", got, err)
	}
	if err := c.WriteFile(ctx, "/work/new", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if !c.proc.cmd.ProcessState.Exited() {
		t.Errorf("the server was not waited for")
	}
	if out := stderr.String(); !strings.Contains(out, "helper: serving (ok)") || !strings.Contains(out, "quit=true") {
		t.Errorf("stderr passed through:\n%s", out)
	}
	if _, err := c.Exec(ctx, []string{"echo"}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

func TestOpenRefusedInitLeavesNoProcess(t *testing.T) {
	stderr := &syncBuffer{}
	start := time.Now()
	c, err := Open(context.Background(), append(helper(t, "refuse-init", stderr), WithGPU(true))...)
	if c != nil {
		t.Fatal("Open returned a console")
	}
	if code, ok := protocol.CodeOf(err); !ok || code != protocol.CodeUnsupportedMachine {
		t.Fatalf("err = %v", err)
	}
	var re *RefusedError
	if !errors.As(err, &re) || re.Method != "init" {
		t.Fatalf("err = %#v", err)
	}
	// Open waited for the server, which saw its stdin close with no quit.
	if out := stderr.String(); !strings.Contains(out, "helper: stdin closed, quit=false") {
		t.Errorf("stderr:\n%s", out)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Open took %v", d)
	}
}

func TestServerDyingIsBroken(t *testing.T) {
	stderr := &syncBuffer{}
	c, err := Open(context.Background(), helper(t, "die-on-exec", stderr)...)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(context.Background(), []string{"echo"})
	mustBroken(t, err, "the server closed the channel while exec (id 1) was waiting for its answer")
	for _, want := range []string{"exit status 3", `"helper: panic: the backend went away"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %q, want it to mention %s", err, want)
		}
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close of a broken console: %v", err)
	}
}

func TestCloseKillsAServerThatStays(t *testing.T) {
	c, err := Open(context.Background(), helper(t, "ignore-quit", &syncBuffer{})...)
	if err != nil {
		t.Fatal(err)
	}
	c.grace = 200 * time.Millisecond
	start := time.Now()
	err = c.Close()
	if err == nil || !strings.Contains(err.Error(), "was killed") {
		t.Errorf("Close = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v", d)
	}
	if err2 := c.Close(); err2 != err {
		t.Errorf("second Close = %v, want the first's", err2)
	}
}

func TestCloseReportsAFailedExit(t *testing.T) {
	c, err := Open(context.Background(), helper(t, "fail-after-quit", &syncBuffer{})...)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Close()
	if err == nil || !strings.Contains(err.Error(), "exit status 5") || !strings.Contains(err.Error(), "quit=true") {
		t.Errorf("Close = %v", err)
	}
}

func TestOpenCancelledKillsTheServer(t *testing.T) {
	// A "server" that never answers init.
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	c, err := Open(ctx, WithServer(sleep, "60"), WithStderr(nil))
	if c != nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Open = %v, %v", c, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Open took %v", d)
	}
}

func TestOpenServerThatIsNotThere(t *testing.T) {
	_, err := Open(context.Background(), WithServer("/nonexistent/virtx-uvm"))
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v", err)
	}
	if errors.Is(err, ErrBroken) || errors.Is(err, ErrInvalidOption) {
		t.Errorf("a missing server is neither broken nor an invalid option: %v", err)
	}
}

func TestServerExitsBeforeInit(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	c, err := Open(context.Background(), WithServer(sh, "-c", "echo 'cannot open /dev/kvm' >&2; exit 1"), WithStderr(nil))
	if c != nil {
		t.Fatal("Open returned a console")
	}
	// Whether init was already waiting when the server went depends on timing.
	mustBroken(t, err, "the server closed the channel")
	for _, want := range []string{"exit status 1", "cannot open /dev/kvm"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %q, want it to mention %q", err, want)
		}
	}
}

func TestDefaultServer(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "ok")
	t.Setenv("GORACE", "atexit_sleep_ms=0")
	t.Setenv("VIRTX_SERVER", exe+" -test.run=^$")
	c, err := Open(context.Background(), WithStderr(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// Without VIRTX_SERVER and virtx on PATH: the cache's virtx-uvm.
	home := t.TempDir()
	t.Setenv("VIRTX_SERVER", "")
	t.Setenv("PATH", t.TempDir())
	t.Setenv("VIRTX_HOME", home)
	if _, err := defaultServer(); err == nil || !strings.Contains(err.Error(), filepath.Join(home, "bin", "virtx-uvm")) {
		t.Errorf("no server: %v", err)
	}
	os.MkdirAll(filepath.Join(home, "bin"), 0o755)
	os.Symlink(exe, filepath.Join(home, "bin", "virtx-uvm"))
	if argv, err := defaultServer(); err != nil || len(argv) != 1 || argv[0] != filepath.Join(home, "bin", "virtx-uvm") {
		t.Errorf("cache server: %q, %v", argv, err)
	}

	// virtx on PATH wins over the cache.
	bin := t.TempDir()
	os.Symlink(exe, filepath.Join(bin, "virtx"))
	t.Setenv("PATH", bin)
	if argv, err := defaultServer(); err != nil || len(argv) != 2 || argv[1] != "serve" {
		t.Errorf("virtx serve: %q, %v", argv, err)
	}
}

func TestCacheDir(t *testing.T) {
	t.Setenv("VIRTX_HOME", "/opt/virtx")
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	t.Setenv("HOME", "/home/u")
	for _, tc := range []struct {
		home, xdg, want string
	}{
		{"/opt/virtx", "/xdg", "/opt/virtx"},
		{"", "/xdg", "/xdg/virtx"},
		{"", "relative", "/home/u/.cache/virtx"},
		{"", "", "/home/u/.cache/virtx"},
	} {
		t.Setenv("VIRTX_HOME", tc.home)
		t.Setenv("XDG_CACHE_HOME", tc.xdg)
		if got, err := CacheDir(); err != nil || got != tc.want {
			t.Errorf("VIRTX_HOME=%q XDG_CACHE_HOME=%q: %q, %v; want %q", tc.home, tc.xdg, got, err, tc.want)
		}
	}
}

func TestTailWriter(t *testing.T) {
	var sink syncBuffer
	tw := &tailWriter{w: &sink}
	tw.Write([]byte("first line\nsecond "))
	tw.Write([]byte("line\n\n  \n"))
	if got := tw.lastLine(); got != "second line" {
		t.Errorf("lastLine = %q", got)
	}
	tw.Write([]byte(strings.Repeat("x", 10000) + "\nend"))
	if got := tw.lastLine(); got != "end" {
		t.Errorf("lastLine = %q", got)
	}
	if len(tw.buf) > tailSize {
		t.Errorf("kept %d bytes", len(tw.buf))
	}
	if !strings.HasPrefix(sink.String(), "first line\nsecond line\n") {
		t.Errorf("not passed through")
	}
}

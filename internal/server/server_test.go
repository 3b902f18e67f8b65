package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

// fakeBackend records what the session rules asked of it.
type fakeBackend struct {
	mu        sync.Mutex
	boots     int
	shutdowns int
	failBoot  error
	admitErr  error
	lastSpec  *backend.Spec
	execGate  chan struct{} // when set, Exec waits on it (or on Shutdown)
	listeners map[uint16]net.Listener
}

func (f *fakeBackend) Name() string { return "fake" }

func (f *fakeBackend) Admit(ctx context.Context, spec *backend.Spec) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return "/start", f.admitErr
}

func (f *fakeBackend) Boot(ctx context.Context, spec *backend.Spec) (backend.Machine, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failBoot != nil {
		return nil, f.failBoot
	}
	f.boots++
	f.lastSpec = spec
	return &fakeMachine{f: f, down: make(chan struct{})}, nil
}

type fakeMachine struct {
	f    *fakeBackend
	down chan struct{}
	once sync.Once
}

func (m *fakeMachine) Exec(ctx context.Context, req executor.ExecRequest) (executor.ExecResult, error) {
	if req.Cmd[0] == "cd" {
		return executor.ExecResult{Cwd: req.Cmd[1]}, nil
	}
	if req.Cmd[0] == "die" {
		return executor.ExecResult{}, fmt.Errorf("%w: the executor went away", backend.ErrMachineGone)
	}
	if req.Cmd[0] == "pwd" {
		return executor.ExecResult{Stdout: []byte(req.Cwd), Cwd: req.Cwd}, nil
	}
	if gate := m.f.execGate; gate != nil {
		select {
		case <-gate:
		case <-m.down:
			return executor.ExecResult{Code: 137, Cwd: req.Cwd}, nil
		}
	}
	return executor.ExecResult{Stdout: []byte(fmt.Sprint(req.Cmd)), Cwd: req.Cwd}, nil
}

func (m *fakeMachine) Read(ctx context.Context, path string, offset, length int64) ([]byte, int64, error) {
	return []byte(path), int64(len(path)), nil
}

func (m *fakeMachine) Write(ctx context.Context, path string, data []byte, offset int64, has bool) (int64, error) {
	return int64(len(data)), nil
}

func (m *fakeMachine) Snapshot(ctx context.Context) ([]byte, error) { return []byte("layer"), nil }

func (m *fakeMachine) DialPort(ctx context.Context, port uint16) (net.Conn, error) {
	return net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
}

func (m *fakeMachine) Shutdown(ctx context.Context) error {
	m.once.Do(func() {
		close(m.down)
		m.f.mu.Lock()
		m.f.shutdowns++
		m.f.mu.Unlock()
	})
	return nil
}

func (f *fakeBackend) counts() (boots, shutdowns int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.boots, f.shutdowns
}

// client drives a Server in-process over pipes.
type client struct {
	t    *testing.T
	w    *io.PipeWriter
	fr   *protocol.FrameReader
	id   int64
	done chan error
}

func serve(t *testing.T, b backend.Backend) *client {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	c := &client{t: t, w: inW, fr: protocol.NewFrameReader(outR), done: make(chan error, 1)}
	go func() {
		err := New(b).Serve(context.Background(), inR, outW)
		outW.Close()
		c.done <- err
	}()
	t.Cleanup(func() { inW.Close(); <-c.done })
	return c
}

func (c *client) send(doc []byte) {
	if err := protocol.WriteFrame(c.w, doc); err != nil {
		c.t.Fatal(err)
	}
}

func (c *client) recv() *protocol.Message {
	c.t.Helper()
	f, err := c.fr.ReadFrame()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	m, err := protocol.Decode(f)
	if err != nil {
		c.t.Fatal(err)
	}
	return m
}

func (c *client) call(method string, p protocol.Payload) *protocol.Message {
	c.t.Helper()
	c.send(protocol.AppendRequest(nil, c.id, method, p))
	c.id++
	return c.recv()
}

func (c *client) notify(method string) { c.send(protocol.AppendNotification(nil, method)) }

func TestBootOnDemandStartStop(t *testing.T) {
	f := &fakeBackend{}
	c := serve(t, f)
	if m := c.call("init", &protocol.InitParams{}); m.Err != nil || m.Result.(*protocol.InitResult).Cwd != "/start" {
		t.Fatalf("%v", m)
	}
	if b, _ := f.counts(); b != 0 {
		t.Fatal("init booted")
	}
	c.call("exec", &protocol.ExecParams{Cmd: []string{"x"}})
	c.call("exec", &protocol.ExecParams{Cmd: []string{"x"}})
	if b, _ := f.counts(); b != 1 {
		t.Fatalf("boots %d, want 1", b)
	}
	c.notify("stop")
	c.call("version", nil) // orders after the stop
	if _, s := f.counts(); s != 1 {
		t.Fatalf("shutdowns %d after stop", s)
	}
	c.notify("start")
	c.call("version", nil)
	if b, _ := f.counts(); b != 2 {
		t.Fatalf("start did not boot: %d", b)
	}
	// cwd is the server's and survives stop.
	c.call("exec", &protocol.ExecParams{Cmd: []string{"cd", "/elsewhere"}})
	c.notify("stop")
	if m := c.call("exec", &protocol.ExecParams{Cmd: []string{"pwd"}}); string(m.Result.(*protocol.ExecResult).Stdout) != "/elsewhere" {
		t.Fatalf("cwd after stop: %v", m)
	}
	// Relative paths are joined onto it, keeping its spelling.
	if m := c.call("read", &protocol.ReadParams{Path: "a/../b"}); string(m.Result.(*protocol.ReadResult).Data) != "/elsewhere/b" {
		t.Fatalf("relative read: %q", m.Result.(*protocol.ReadResult).Data)
	}
	// A second init drops what was booted and resets where the session stands.
	c.call("init", &protocol.InitParams{})
	if _, s := f.counts(); s != 3 {
		t.Fatalf("shutdowns %d after re-init", s)
	}
	if m := c.call("exec", &protocol.ExecParams{Cmd: []string{"pwd"}}); string(m.Result.(*protocol.ExecResult).Stdout) != "/start" {
		t.Fatalf("cwd after re-init: %v", m)
	}
}

func TestBootFailureReachesTheCallAndRetries(t *testing.T) {
	f := &fakeBackend{failBoot: fmt.Errorf("%w: no kernel", backend.ErrBootFailed)}
	c := serve(t, f)
	c.call("init", &protocol.InitParams{})
	c.notify("start") // fails quietly
	if m := c.call("exec", &protocol.ExecParams{Cmd: []string{"x"}}); m.Err == nil || m.Err.Code != protocol.CodeBootFailed {
		t.Fatalf("%v", m)
	}
	f.mu.Lock()
	f.failBoot = fmt.Errorf("%w: tree gone", backend.ErrMountFailed)
	f.mu.Unlock()
	if m := c.call("read", &protocol.ReadParams{Path: "/x"}); m.Err == nil || m.Err.Code != protocol.CodeMountFailed {
		t.Fatalf("%v", m)
	}
	f.mu.Lock()
	f.failBoot = nil
	f.mu.Unlock()
	if m := c.call("exec", &protocol.ExecParams{Cmd: []string{"x"}}); m.Err != nil {
		t.Fatalf("no retry after a failed boot: %v", m)
	}
}

func TestStopDoesNotWaitForExecAndQuitDoes(t *testing.T) {
	f := &fakeBackend{execGate: make(chan struct{})}
	c := serve(t, f)
	c.send(protocol.AppendRequest(nil, 0, "exec", &protocol.ExecParams{Cmd: []string{"long"}}))
	time.Sleep(50 * time.Millisecond)
	c.notify("stop")
	m := c.recv()
	if m.Err != nil || m.Result.(*protocol.ExecResult).Code != 137 {
		t.Fatalf("exec under stop: %v", m)
	}
	// quit: the running exec is still answered, then the stream ends.
	gate := make(chan struct{})
	f.mu.Lock()
	f.execGate = gate
	f.mu.Unlock()
	c.send(protocol.AppendRequest(nil, 1, "exec", &protocol.ExecParams{Cmd: []string{"long"}}))
	c.notify("quit")
	time.AfterFunc(100*time.Millisecond, func() { close(gate) })
	if m := c.recv(); m.Err != nil || m.ID != 1 {
		t.Fatalf("exec before quit: %v", m)
	}
	if _, err := c.fr.ReadFrame(); err != io.EOF {
		t.Fatalf("after quit: %v", err)
	}
	if err := <-c.done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	c.done <- nil
}

func TestInitRefusalKeepsTheSession(t *testing.T) {
	f := &fakeBackend{}
	c := serve(t, f)
	c.call("init", &protocol.InitParams{})
	c.call("exec", &protocol.ExecParams{Cmd: []string{"cd", "/kept"}})
	f.mu.Lock()
	f.admitErr = fmt.Errorf("%w: no such thing", backend.ErrUnsupportedMachine)
	f.mu.Unlock()
	if m := c.call("init", &protocol.InitParams{}); m.Err == nil || m.Err.Code != protocol.CodeUnsupportedMachine {
		t.Fatalf("%v", m)
	}
	if _, s := f.counts(); s != 0 {
		t.Fatal("a refused init shut the session down")
	}
	if m := c.call("exec", &protocol.ExecParams{Cmd: []string{"pwd"}}); string(m.Result.(*protocol.ExecResult).Stdout) != "/kept" {
		t.Fatalf("%v", m)
	}
}

func TestPortsHeldFromInitAndWaitForBoot(t *testing.T) {
	// The "guest" service is a listener in this test process.
	svc, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	go func() {
		for {
			conn, err := svc.Accept()
			if err != nil {
				return
			}
			conn.Write([]byte("hello"))
			conn.Close()
		}
	}()
	probe, _ := net.Listen("tcp", "127.0.0.1:0")
	hostPort := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	f := &fakeBackend{}
	c := serve(t, f)
	port := protocol.Port{Host: uint16(hostPort), Guest: uint16(svc.Addr().(*net.TCPAddr).Port)}
	if m := c.call("init", &protocol.InitParams{Ports: []protocol.Port{port}}); m.Err != nil {
		t.Fatal(m)
	}
	// A second server cannot take the port now.
	c2 := serve(t, &fakeBackend{})
	if m := c2.call("init", &protocol.InitParams{Ports: []protocol.Port{port}}); m.Err == nil || m.Err.Code != protocol.CodeInvalidParams {
		t.Fatalf("taken port: %v", m)
	}
	// A connection while Idle waits for the next boot.
	conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", hostPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(conn)
		got <- string(b)
	}()
	select {
	case s := <-got:
		t.Fatalf("answered while Idle: %q", s)
	case <-time.After(100 * time.Millisecond):
	}
	c.notify("start")
	if s := <-got; s != "hello" {
		t.Fatalf("through the port: %q", s)
	}
	// Re-init with the same port keeps holding it.
	if m := c.call("init", &protocol.InitParams{Ports: []protocol.Port{port}}); m.Err != nil {
		t.Fatalf("re-init with a port it holds: %v", m)
	}
}

func TestMachineThatDiesIsDroppedAndRebooted(t *testing.T) {
	f := &fakeBackend{}
	c := serve(t, f)
	c.call("init", &protocol.InitParams{})
	c.call("exec", &protocol.ExecParams{Cmd: []string{"cd", "/kept"}})
	if m := c.call("exec", &protocol.ExecParams{Cmd: []string{"die"}}); m.Err == nil || m.Err.Code != protocol.CodeBootFailed {
		t.Fatalf("a dead machine: %v", m)
	}
	if b, s := f.counts(); b != 1 || s != 1 {
		t.Fatalf("boots %d shutdowns %d: the dead machine was not dropped", b, s)
	}
	if m := c.call("exec", &protocol.ExecParams{Cmd: []string{"pwd"}}); m.Err != nil || string(m.Result.(*protocol.ExecResult).Stdout) != "/kept" {
		t.Fatalf("next call after the machine died: %v", m)
	}
	if b, _ := f.counts(); b != 2 {
		t.Fatalf("boots %d: no new machine", b)
	}
}

func TestCallBeforeInitGetsTheDefaultSession(t *testing.T) {
	f := &fakeBackend{admitErr: fmt.Errorf("%w: no limits here", backend.ErrUnsupportedMachine)}
	c := serve(t, f)
	if m := c.call("exec", &protocol.ExecParams{Cmd: []string{"x"}}); m.Err == nil || m.Err.Code != protocol.CodeUnsupportedMachine {
		t.Fatalf("exec before init, default session refused: %v", m)
	}
	if b, _ := f.counts(); b != 0 {
		t.Fatal("booted a session the backend refused")
	}
	f.mu.Lock()
	f.admitErr = nil
	f.mu.Unlock()
	if m := c.call("exec", &protocol.ExecParams{Cmd: []string{"pwd"}}); m.Err != nil || string(m.Result.(*protocol.ExecResult).Stdout) != "/start" {
		t.Fatalf("exec before init: %v", m)
	}
}

package relay

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

func pair(t *testing.T, snapshot SnapshotFunc) *Client {
	t.Helper()
	a, b := net.Pipe()
	ex, err := executor.New(executor.Config{Env: os.Environ()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- Serve(ctx, b, ex, snapshot) }()
	c := NewClient(a)
	t.Cleanup(func() {
		cancel() // the boundary going away kills what runs in it
		c.Close()
		b.Close()
		<-done
	})
	return c
}

func TestRelayCarriesCallsAndCwd(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	c := pair(t, func(context.Context) ([]byte, error) { return []byte("layer"), nil })
	ctx := context.Background()
	r, err := c.Exec(ctx, executor.ExecRequest{Cmd: []string{"cd", "sub"}, Cwd: dir})
	if err != nil || r.Code != 0 || r.Cwd != dir+"/sub" {
		t.Fatalf("cd: %+v %v", r, err)
	}
	r, err = c.Exec(ctx, executor.ExecRequest{Cmd: []string{"sh", "-c", "echo $PWD; echo e >&2; exit 4"}, Cwd: r.Cwd})
	if err != nil || r.Code != 4 || string(r.Stdout) != dir+"/sub\n" || string(r.Stderr) != "e\n" || r.Cwd != dir+"/sub" {
		t.Fatalf("exec: %+v %v", r, err)
	}
	f := filepath.Join(dir, "f")
	if n, err := c.Write(ctx, f, []byte("hello"), 0, false); err != nil || n != 5 {
		t.Fatalf("write: %d %v", n, err)
	}
	if n, err := c.Write(ctx, f, []byte("J"), 0, true); err != nil || n != 5 {
		t.Fatalf("write at 0: %d %v", n, err)
	}
	data, size, err := c.Read(ctx, f, 1, 3)
	if err != nil || string(data) != "ell" || size != 5 {
		t.Fatalf("read: %q %d %v", data, size, err)
	}
	if b, err := c.Snapshot(ctx); err != nil || string(b) != "layer" {
		t.Fatalf("snapshot: %q %v", b, err)
	}
	// Errors keep their code across the relay.
	_, _, err = c.Read(ctx, filepath.Join(dir, "missing"), 0, -1)
	if code, _ := protocol.CodeOf(err); code != protocol.CodeNotFound {
		t.Fatalf("missing: %v", err)
	}
	_, err = c.Exec(ctx, executor.ExecRequest{Cmd: []string{"sleep", "5"}, Cwd: dir, Timeout: 100 * time.Millisecond})
	if pe, ok := err.(*protocol.Error); !ok || pe.Code != protocol.CodeTimedOut || pe.Message != "killed after 100ms" {
		t.Fatalf("timeout: %v", err)
	}
	_, err = c.Exec(ctx, executor.ExecRequest{Cmd: []string{"no-such-virtx-program"}, Cwd: dir})
	if code, _ := protocol.CodeOf(err); code != protocol.CodeNotExecutable {
		t.Fatalf("not executable: %v", err)
	}
}

func TestRelayStopDuringExec(t *testing.T) {
	c := pair(t, nil)
	go func() {
		time.Sleep(100 * time.Millisecond)
		c.Close()
	}()
	r, err := c.Exec(context.Background(), executor.ExecRequest{Cmd: []string{"sleep", "10"}, Cwd: "/"})
	if err != nil || r.Code != 137 {
		t.Fatalf("exec under Close: %+v %v", r, err)
	}
	if _, _, err := c.Read(context.Background(), "/etc/hostname", 0, -1); !errors.Is(err, backend.ErrSessionStopped) {
		t.Fatalf("after Close: %v", err)
	}
	_, err = pair(t, nil).Snapshot(context.Background())
	if code, _ := protocol.CodeOf(err); code != protocol.CodeMethodNotFound {
		t.Fatalf("snapshot without a layer: %v", err)
	}
}

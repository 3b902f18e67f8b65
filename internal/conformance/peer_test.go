package conformance

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// virtxBin is the binary under test, built once in TestMain.
var virtxBin string

func TestMain(m *testing.M) {
	// VIRTX_TEST_BINARY names a prebuilt binary (e.g. for a run as an unprivileged user,
	// who cannot build from root's module cache); otherwise the suite builds its own.
	if prebuilt := os.Getenv("VIRTX_TEST_BINARY"); prebuilt != "" {
		virtxBin = prebuilt
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "virtx-conformance-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Chmod(dir, 0o755)
	virtxBin = filepath.Join(dir, "virtx")
	// Static, as it ships: the sandbox's init then needs no re-exec to drop capabilities
	// on every thread, and the vm backend uses the same binary as the guest's /init.
	build := exec.Command("go", "build", "-o", virtxBin, "virtx.dev/virtx/cmd/virtx")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building virtx:", err)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// peer is a client speaking raw frames to one `virtx serve` process.
type peer struct {
	t      testing.TB
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	frames chan frameOrErr
	stderr *lockedBuffer
	nextID int64
	done   chan struct{}
	// abandon is closed when the test ends, so frames nobody will read are dropped.
	abandon chan struct{}
	exit    error
}

type frameOrErr struct {
	frame []byte
	err   error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startPeer(t testing.TB, backend string) *peer {
	t.Helper()
	return startPeerArgs(t, "serve", "--backend", backend)
}

// startPeerArgs starts the binary with exactly these arguments.
func startPeerArgs(t testing.TB, args ...string) *peer {
	t.Helper()
	return startPeerCmd(t, exec.Command(virtxBin, args...))
}

// startPeerCmd starts cmd, which runs the binary (perhaps through a wrapper that execs
// it), as a peer.
func startPeerCmd(t testing.TB, cmd *exec.Cmd) *peer {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	growPipe(stdin)
	growPipe(stdout)
	p := &peer{t: t, cmd: cmd, stdin: stdin, frames: make(chan frameOrErr, 64), stderr: &lockedBuffer{}, done: make(chan struct{}), abandon: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		fr := protocol.NewFrameReader(stdout)
		for {
			f, err := fr.ReadFrame()
			select {
			case p.frames <- frameOrErr{f, err}:
			case <-p.abandon: // the test is over: keep reading to the end, keep nothing
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		// Wait closes stdout: only after the reader has seen its end, so that a clean
		// close reads as io.EOF and never as "file already closed".
		<-readDone
		p.exit = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		close(p.abandon)
		p.stdin.Close()
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
			t.Errorf("server did not exit after stdin closed; stderr:\n%s", p.stderr)
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", p.stderr)
		}
	})
	return p
}

// sendDoc writes one frame around doc.
func (p *peer) sendDoc(doc []byte) {
	p.t.Helper()
	if err := protocol.WriteFrame(p.stdin, doc); err != nil {
		p.t.Fatalf("writing a frame: %v", err)
	}
}

// sendRaw writes bytes with no framing of their own.
func (p *peer) sendRaw(b []byte) {
	p.t.Helper()
	if _, err := p.stdin.Write(b); err != nil {
		p.t.Fatalf("writing: %v", err)
	}
}

func (p *peer) sendHeader(n uint32) {
	var h [4]byte
	binary.BigEndian.PutUint32(h[:], n)
	p.sendRaw(h[:])
}

// recvFrame waits for the next frame (or the stream's end).
func (p *peer) recvFrame(timeout time.Duration) ([]byte, error) {
	p.t.Helper()
	select {
	case f := <-p.frames:
		return f.frame, f.err
	case <-time.After(timeout):
		p.t.Fatalf("no frame within %v; stderr:\n%s", timeout, p.stderr)
		return nil, nil
	}
}

func (p *peer) recv() *protocol.Message {
	p.t.Helper()
	// Longer than the vm backend's BootTimeout (60 s), so that a boot that hangs shows
	// as the server's BOOT_FAILED, with the tail of the guest's console, not as silence.
	f, err := p.recvFrame(90 * time.Second)
	if err != nil {
		p.t.Fatalf("reading a frame: %v; stderr:\n%s", err, p.stderr)
	}
	m, err := protocol.Decode(f)
	if err != nil {
		p.t.Fatalf("server sent a frame we cannot decode: %v", err)
	}
	if m.Kind != protocol.KindResponse {
		p.t.Fatalf("server sent a %v, not a response: the channel runs one way", m)
	}
	return m
}

// expectNothing asserts no frame arrives within d (notifications are never answered).
func (p *peer) expectNothing(d time.Duration) {
	p.t.Helper()
	select {
	case f := <-p.frames:
		p.t.Fatalf("expected no frame, got %x (err %v)", f.frame, f.err)
	case <-time.After(d):
	}
}

// expectEOF asserts the server closes its stdout cleanly and exits.
func (p *peer) expectEOF() {
	p.t.Helper()
	f, err := p.recvFrame(30 * time.Second)
	if err != io.EOF {
		p.t.Fatalf("expected the stream to end, got frame %x err %v", f, err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.t.Fatalf("server did not exit")
	}
}

// call sends a request and returns its response, checking the id and method echo.
func (p *peer) call(method string, params protocol.Payload) *protocol.Message {
	p.t.Helper()
	id := p.nextID
	p.nextID++
	// As the client library does: one buffer of the right size, written in one go.
	frame := protocol.AppendRequest(protocol.NewFrameBuffer(protocol.SizeHint(params)), id, method, params)
	if err := protocol.WriteFramed(p.stdin, frame); err != nil {
		p.t.Fatalf("writing a frame: %v", err)
	}
	m := p.recv()
	if !m.HasID || m.ID != id {
		p.t.Fatalf("%s: response id %d (has %v), want %d", method, m.ID, m.HasID, id)
	}
	if m.Err == nil && m.Method != method {
		p.t.Fatalf("%s: result echoes method %q", method, m.Method)
	}
	return m
}

func (p *peer) notify(method string) { p.sendDoc(protocol.AppendNotification(nil, method)) }

// ok calls and fails the test on an error response.
func (p *peer) ok(method string, params protocol.Payload) any {
	p.t.Helper()
	m := p.call(method, params)
	if m.Err != nil {
		p.t.Fatalf("%s: unexpected error %v", method, m.Err)
	}
	return m.Result
}

// fails calls and asserts an error response with the given code.
func (p *peer) fails(code protocol.Code, method string, params protocol.Payload) *protocol.Error {
	p.t.Helper()
	m := p.call(method, params)
	if m.Err == nil {
		p.t.Fatalf("%s: got a result %+v, want error %v", method, m.Result, code)
	}
	if m.Err.Code != code {
		p.t.Fatalf("%s: got error %v, want code %v", method, m.Err, code)
	}
	return m.Err
}

func (p *peer) init(params *protocol.InitParams) string {
	p.t.Helper()
	return p.ok(protocol.MethodInit, params).(*protocol.InitResult).Cwd
}

func (p *peer) exec(argv ...string) *protocol.ExecResult {
	p.t.Helper()
	return p.ok(protocol.MethodExec, &protocol.ExecParams{Cmd: argv}).(*protocol.ExecResult)
}

// sh runs a shell command and returns its stdout, failing on a non-zero exit.
func (p *peer) sh(script string) string {
	p.t.Helper()
	r := p.exec("sh", "-c", script)
	if r.Code != 0 {
		p.t.Fatalf("sh -c %q: exit %d, stderr %q", script, r.Code, r.Stderr)
	}
	return string(r.Stdout)
}

func (p *peer) read(path string, offset, length *uint64) *protocol.ReadResult {
	p.t.Helper()
	return p.ok(protocol.MethodRead, &protocol.ReadParams{Path: path, Offset: offset, Len: length}).(*protocol.ReadResult)
}

func (p *peer) write(path string, data []byte, offset *uint64) uint64 {
	p.t.Helper()
	return p.ok(protocol.MethodWrite, &protocol.WriteParams{Path: path, Data: data, Offset: offset}).(*protocol.WriteResult).Size
}

func u64(v uint64) *uint64 { return &v }
func boolp(v bool) *bool   { return &v }

func trimNL(s string) string { return strings.TrimSuffix(s, "\n") }

// pwd asks the session where it stands.
func (p *peer) pwd() string {
	p.t.Helper()
	return trimNL(string(p.exec("pwd").Stdout))
}

// coldSession times one cold session on a backend: spawn `virtx serve`, init with params,
// first exec answered. The server's exit (after quit) is not timed.
func coldSession(b testing.TB, backend string, params *protocol.InitParams) time.Duration {
	b.Helper()
	start := time.Now()
	p := startPeer(b, backend)
	p.init(params)
	p.exec("true")
	d := time.Since(start)
	p.stdin.Close()
	<-p.done
	return d
}

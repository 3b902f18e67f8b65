package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

func TestInitCarriesTheOptions(t *testing.T) {
	s := newFake()
	s.cwd = "/home/agent"
	snap := []byte("a layer")
	c, _ := open(t, s,
		WithImage(protocol.ImageSource{Type: protocol.ImageRef, Ref: "alpine:3"}),
		WithReadOnlyMount("/srv/project", "/work"),
		WithMount("relative/out", "/work/out"),
		WithMountURL("https://example.com:8080/share", "/share", true),
		WithSnapshot(snap),
		WithPorts("8080:80", "5901:5900"),
		WithVCPUs(4), WithMemoryMiB(4096), WithGPU(true), WithGPUMemoryMiB(8192), WithDiskGiB(32),
	)
	if got := c.Cwd(); got != "/home/agent" {
		t.Errorf("Cwd = %q", got)
	}
	if got, want := c.Mounts(), []string{"/work", "/work/out", "/share"}; !slices.Equal(got, want) {
		t.Errorf("Mounts = %q, want %q", got, want)
	}
	c.Mounts()[0] = "changed"
	if c.Mounts()[0] != "/work" {
		t.Errorf("Mounts hands out its own slice")
	}

	msgs := s.messages()
	if len(msgs) != 1 || msgs[0].Method != "init" || msgs[0].ID != 0 {
		t.Fatalf("got %s, want init with id 0", s.methods())
	}
	p := msgs[0].Params.(*protocol.InitParams)
	abs, _ := filepath.Abs("relative/out")
	wantMounts := []string{"file:///srv/project:/work:ro", "file://" + abs + ":/work/out", "https://example.com:8080/share:/share:ro"}
	var gotMounts []string
	for _, m := range p.Mounts {
		gotMounts = append(gotMounts, m.String())
	}
	if !slices.Equal(gotMounts, wantMounts) {
		t.Errorf("mounts = %q, want %q", gotMounts, wantMounts)
	}
	if p.Image == nil || p.Image.Type != "ref" || p.Image.Ref != "alpine:3" {
		t.Errorf("image = %+v", p.Image)
	}
	if !bytes.Equal(p.Snapshot, snap) {
		t.Errorf("snapshot = %q", p.Snapshot)
	}
	if p.Network != nil {
		t.Errorf("network sent as %v; on is left out", *p.Network)
	}
	if len(p.Ports) != 2 || p.Ports[0] != (protocol.Port{Host: 8080, Guest: 80}) || p.Ports[1] != (protocol.Port{Host: 5901, Guest: 5900}) {
		t.Errorf("ports = %v", p.Ports)
	}
	if *p.VCPUs != 4 || *p.MemoryMiB != 4096 || !*p.GPU || *p.GPUMemoryMiB != 8192 || *p.DiskGiB != 32 {
		t.Errorf("machine = %d vcpus, %d MiB, gpu %v, %d MiB, %d GiB", *p.VCPUs, *p.MemoryMiB, *p.GPU, *p.GPUMemoryMiB, *p.DiskGiB)
	}
}

func TestInitDefaultIsEmptyAndNetworkOffIsSent(t *testing.T) {
	s := newFake()
	open(t, s)
	p := s.messages()[0].Params.(*protocol.InitParams)
	if p.Image != nil || p.Snapshot != nil || p.Network != nil || p.Ports != nil || p.VCPUs != nil ||
		p.MemoryMiB != nil || p.GPU != nil || p.GPUMemoryMiB != nil || p.DiskGiB != nil || p.Mounts != nil {
		t.Errorf("a default init should be {}, got %+v", p)
	}

	s = newFake()
	open(t, s, WithNetwork(false), WithGPU(false))
	p = s.messages()[0].Params.(*protocol.InitParams)
	if p.Network == nil || *p.Network || p.GPU == nil || *p.GPU {
		t.Errorf("network/gpu false should be sent: %+v", p)
	}
}

func TestInitRefused(t *testing.T) {
	s := newFake()
	s.initErr = protocol.Errorf(protocol.CodeUnsupportedMount, "mount 1: no provider for https")
	h := startFake(t, s)
	c, err := New(context.Background(), h.clientR, h.clientW, WithMountURL("https://x/y", "/y", false))
	if c != nil {
		t.Fatalf("New returned a console with %v", err)
	}
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want a *RefusedError", err)
	}
	if re.Method != "init" || re.Code != protocol.CodeUnsupportedMount || !strings.Contains(re.Message, "no provider") {
		t.Errorf("refused = %+v", re)
	}
	if !errors.Is(err, &protocol.Error{Code: protocol.CodeUnsupportedMount}) {
		t.Errorf("errors.Is(err, &protocol.Error{UNSUPPORTED_MOUNT}) = false")
	}
	if errors.Is(err, &protocol.Error{Code: protocol.CodeNotFound}) {
		t.Errorf("errors.Is matches another code")
	}
	if code, ok := protocol.CodeOf(err); !ok || code != protocol.CodeUnsupportedMount {
		t.Errorf("CodeOf = %v, %v", code, ok)
	}
	if errors.Is(err, ErrBroken) || errors.Is(err, ErrClosed) {
		t.Errorf("a refusal is neither broken nor closed")
	}
	h.waitServed(t) // the client closed its end…
	if !s.sawEOF() {
		t.Errorf("the server did not see a clean end")
	}
	if got := s.methods(); got != "0:init" { // …without a quit
		t.Errorf("the server got %q, want only init", got)
	}
}

func TestIDsCountFromZero(t *testing.T) {
	s := newFake()
	c, h := open(t, s)
	ctx := context.Background()

	if res, err := c.Exec(ctx, []string{"echo", "hi"}); err != nil || string(res.Stdout) != "hi\n" {
		t.Fatalf("exec: %v, %v", res, err)
	}
	if _, err := c.Exec(ctx, []string{"nonesuch"}); err == nil {
		t.Fatalf("exec of a missing program succeeded")
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(ctx, "/work/f", []byte("data")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(ctx, "/work/missing", 0, -1); err == nil {
		t.Fatal("read of a missing file succeeded")
	}
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if blob, err := c.Snapshot(ctx); err != nil || string(blob) != "layer" {
		t.Fatalf("snapshot: %q, %v", blob, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	h.waitServed(t)
	want := "0:init 1:exec 2:exec start 3:write 4:read stop 5:snapshot quit"
	if got := s.methods(); got != want {
		t.Errorf("wire:\n got %s\nwant %s", got, want)
	}
	// The wire types: a notification has neither id nor params; every request has params.
	for _, m := range s.messages() {
		if protocol.IsNotification(m.Method) != (m.Kind == protocol.KindNotification) {
			t.Errorf("%s arrived as kind %d", m.Method, m.Kind)
		}
	}
}

func TestExecNonZeroIsAResult(t *testing.T) {
	s := newFake()
	c, _ := open(t, s)
	res, err := c.Exec(context.Background(), []string{"exit", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 3 || string(res.Stderr) != "bye\n" {
		t.Errorf("res = %+v", res)
	}
}

func TestExecTimeoutOption(t *testing.T) {
	s := newFake()
	c, _ := open(t, s)
	ctx := context.Background()
	for _, tc := range []struct {
		opts []ExecOption
		want *uint64
	}{
		{nil, nil},
		{[]ExecOption{WithTimeout(0)}, nil},
		{[]ExecOption{WithTimeout(-time.Second)}, nil},
		{[]ExecOption{WithTimeout(5 * time.Second)}, ptr[uint64](5000)},
		{[]ExecOption{WithTimeout(1500 * time.Microsecond)}, ptr[uint64](2)},
		{[]ExecOption{WithTimeout(time.Nanosecond)}, ptr[uint64](1)},
	} {
		if _, err := c.Exec(ctx, []string{"echo"}, tc.opts...); err != nil {
			t.Fatal(err)
		}
		msgs := s.messages()
		got := msgs[len(msgs)-1].Params.(*protocol.ExecParams).TimeoutMS
		if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("timeout_ms = %v, want %v", deref(got), deref(tc.want))
		}
	}
}

func ptr[T any](v T) *T { return &v }

func deref(p *uint64) any {
	if p == nil {
		return "absent"
	}
	return *p
}

func TestRefusedErrorIs(t *testing.T) {
	s := newFake()
	c, _ := open(t, s)
	_, err := c.Read(context.Background(), "/nope", 0, -1)
	var re *RefusedError
	if !errors.As(err, &re) || re.Method != "read" || re.Code != protocol.CodeNotFound {
		t.Fatalf("err = %#v", err)
	}
	for _, target := range []error{
		&protocol.Error{Code: protocol.CodeNotFound},
		&RefusedError{Code: protocol.CodeNotFound},
		&RefusedError{Code: protocol.CodeNotFound, Method: "read"},
	} {
		if !errors.Is(err, target) {
			t.Errorf("errors.Is(err, %#v) = false", target)
		}
	}
	for _, target := range []error{
		&protocol.Error{Code: protocol.CodeIOFailed},
		&RefusedError{Code: protocol.CodeIOFailed, Method: "read"},
		ErrBroken,
	} {
		if errors.Is(err, target) {
			t.Errorf("errors.Is(err, %#v) = true", target)
		}
	}
	want := `console: read refused: NOT_FOUND (-32005): /nope: no such file`
	if err.Error() != want {
		t.Errorf("message = %q, want %q", err, want)
	}
	// The session is fine afterwards.
	if _, err := c.Exec(context.Background(), []string{"echo"}); err != nil {
		t.Errorf("after a refusal: %v", err)
	}
}

// captureDebug routes slog's default logger to a buffer for the test.
func captureDebug(t *testing.T) *syncBuffer {
	buf := &syncBuffer{}
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })
	return buf
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestUnknownIDIsDropped(t *testing.T) {
	logs := captureDebug(t)
	s := newFake()
	s.hook = func(s *fakeServer, m *protocol.Message) bool {
		if m.Method != "exec" {
			return false
		}
		// Answers to ids nobody issued, then the real one.
		s.reply(99, "exec", &protocol.ExecResult{Stdout: []byte("wrong")})
		s.refuse(m.ID+1, protocol.Errorf(protocol.CodeInternalError, "wrong too"))
		s.reply(m.ID, "exec", &protocol.ExecResult{Stdout: []byte("right")})
		return true
	}
	c, _ := open(t, s)
	res, err := c.Exec(context.Background(), []string{"x"})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "right" {
		t.Errorf("stdout = %q: paired by position, not by id", res.Stdout)
	}
	if _, err := c.Exec(context.Background(), []string{"x"}); err != nil {
		t.Fatalf("the channel did not survive a stray answer: %v", err)
	}
	if l := logs.String(); !strings.Contains(l, "id=99") || !strings.Contains(l, "id=2") {
		t.Errorf("the drops were not logged at debug:\n%s", l)
	}
}

func TestProtocolViolationsBreakTheChannel(t *testing.T) {
	for _, tc := range []struct {
		name string
		send func(s *fakeServer, m *protocol.Message)
		want string
	}{
		{"request", func(s *fakeServer, m *protocol.Message) {
			s.send(protocol.AppendRequest(protocol.NewFrameBuffer(64), 0, "exec", &protocol.ExecParams{Cmd: []string{"ls"}}))
		}, "the server sent a request (exec, id 0)"},
		{"notification", func(s *fakeServer, m *protocol.Message) {
			s.send(protocol.AppendNotification(protocol.NewFrameBuffer(64), "stop"))
		}, "the server sent a notification (stop)"},
		{"wrong method", func(s *fakeServer, m *protocol.Message) {
			s.reply(m.ID, "read", &protocol.ReadResult{Size: 1})
		}, "the answer to exec (id 1) is typed as read's"},
		{"undecodable", func(s *fakeServer, m *protocol.Message) {
			s.send(append(protocol.NewFrameBuffer(8), 1, 2, 3, 4, 5))
		}, "does not decode"},
		{"truncated", func(s *fakeServer, m *protocol.Message) {
			s.wmu.Lock()
			s.w.Write([]byte{0, 0, 1, 0, 9, 9})
			s.wmu.Unlock()
			s.w.Close()
		}, "ended inside a frame while exec (id 1) was waiting"},
		{"closed mid-call", func(s *fakeServer, m *protocol.Message) {
			s.w.Close()
		}, "the server closed the channel while exec (id 1) was waiting for its answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newFake()
			s.hook = func(s *fakeServer, m *protocol.Message) bool {
				if m.Method == "exec" {
					tc.send(s, m)
					return true
				}
				return false
			}
			c, h := open(t, s)
			_, err := c.Exec(context.Background(), []string{"ls"})
			mustBroken(t, err, tc.want)
			// Broken stays broken, and says the same thing.
			_, err2 := c.Read(context.Background(), "/x", 0, -1)
			if !errors.Is(err2, ErrBroken) || err2.Error() != err.Error() {
				t.Errorf("next call: %v", err2)
			}
			if err := c.Start(context.Background()); !errors.Is(err, ErrBroken) {
				t.Errorf("start after broken: %v", err)
			}
			// Closing a broken console is quiet and sends no quit.
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			h.waitServed(t)
			if got := s.methods(); got != "0:init 1:exec" {
				t.Errorf("wire = %q", got)
			}
			if _, err := c.Exec(context.Background(), []string{"ls"}); !errors.Is(err, ErrClosed) {
				t.Errorf("after Close: %v", err)
			}
		})
	}
}

func TestCloseIsIdempotentAndQuitsOnce(t *testing.T) {
	s := newFake()
	c, h := open(t, s)
	ctx := context.Background()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { c.Close() })
	}
	wg.Wait()
	h.waitServed(t)
	if got := s.methods(); got != "0:init quit" {
		t.Errorf("wire = %q, want init then one quit", got)
	}
	if !s.sawEOF() {
		t.Errorf("stdin was not closed after quit")
	}
	checks := map[string]error{}
	_, checks["exec"] = c.Exec(ctx, []string{"echo"})
	_, checks["read"] = c.Read(ctx, "/f", 0, -1)
	_, checks["readfile"] = c.ReadFile(ctx, "/f")
	_, checks["write"] = c.Write(ctx, "/f", nil)
	_, checks["writeat"] = c.WriteAt(ctx, "/f", nil, 1)
	checks["writefile"] = c.WriteFile(ctx, "/f", []byte("x"))
	_, checks["snapshot"] = c.Snapshot(ctx)
	checks["start"] = c.Start(ctx)
	checks["stop"] = c.Stop(ctx)
	for name, err := range checks {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func TestCloseAnswersTheCallInFlight(t *testing.T) {
	// A call still running when Close sends quit is answered if the server answers it.
	s := newFake()
	release, replied := make(chan struct{}), make(chan struct{})
	s.hook = func(s *fakeServer, m *protocol.Message) bool {
		if m.Method == "exec" {
			go func() {
				<-release
				s.reply(m.ID, "exec", &protocol.ExecResult{Stdout: []byte("late")})
				close(replied)
			}()
			return true
		}
		return false
	}
	// The server reads quit and the end of its input, answers, and only then exits.
	s.afterEOF = func(*fakeServer) { close(release); <-replied }
	c, _ := open(t, s)
	done := make(chan error, 1)
	go func() {
		res, err := c.Exec(context.Background(), []string{"x"})
		if err == nil && string(res.Stdout) != "late" {
			err = fmt.Errorf("stdout %q", res.Stdout)
		}
		done <- err
	}()
	waitFor(t, func() bool { return strings.Contains(s.methods(), "exec") })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("the call in flight: %v", err)
	}
}

func TestCloseFailsTheCallInFlight(t *testing.T) {
	s := newFake()
	s.hook = func(s *fakeServer, m *protocol.Message) bool { return m.Method == "exec" } // never answered
	c, _ := open(t, s)
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), []string{"x"})
		done <- err
	}()
	waitFor(t, func() bool { return strings.Contains(s.methods(), "exec") })
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("the call in flight: %v, want ErrClosed", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCancelReturnsPromptlyAndDropsTheLateAnswer(t *testing.T) {
	logs := captureDebug(t)
	s := newFake()
	release := make(chan struct{})
	s.hook = func(s *fakeServer, m *protocol.Message) bool {
		if p, ok := m.Params.(*protocol.ExecParams); ok && p.Cmd[0] == "hold" {
			go func() {
				<-release
				s.reply(m.ID, "exec", &protocol.ExecResult{Stdout: []byte("held")})
			}()
			return true
		}
		return false
	}
	c, _ := open(t, s)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, []string{"hold"})
		errc <- err
	}()
	waitFor(t, func() bool { return strings.Contains(s.methods(), "1:exec") })

	// A second caller waits its turn; its own cancellation frees it too.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if _, err := c.Exec(ctx2, []string{"echo", "queued"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("queued call: %v, want DeadlineExceeded", err)
	}

	start := time.Now()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("cancel took %v", d)
	}

	// The next call goes out at once; the held answer arrives first and is dropped.
	close(release)
	res, err := c.Exec(context.Background(), []string{"echo", "next"})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "next\n" {
		t.Errorf("stdout = %q", res.Stdout)
	}
	if got := s.methods(); got != "0:init 1:exec 2:exec" {
		t.Errorf("wire = %q (a queued call that never went out takes no id)", got)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "id=1") })

	// An already cancelled context sends nothing.
	if _, err := c.Exec(ctx, []string{"echo"}); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
	if err := c.Start(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: %v", err)
	}
	if got := s.methods(); got != "0:init 1:exec 2:exec" {
		t.Errorf("wire = %q", got)
	}
}

func TestCancelWhileTheServerIsNotReading(t *testing.T) {
	// A frame the server does not read blocks the write; cancelling still returns, and
	// the frame is finished in the background once the server reads again.
	s := newFake()
	gate := make(chan struct{})
	s.hook = func(s *fakeServer, m *protocol.Message) bool {
		if m.Method == "exec" && m.ID == 1 {
			s.answer(m)
			<-gate // then stop reading for a while
			return true
		}
		return false
	}
	h := startFake(t, s)
	bigWrite := make(chan struct{}, 1)
	w := &watchWriter{WriteCloser: h.clientW, big: bigWrite}
	c, err := New(context.Background(), h.clientR, w)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Exec(context.Background(), []string{"echo", "first"}); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(ctx, "/big", bytes.Repeat([]byte("x"), 1<<20))
		errc <- err
	}()
	<-bigWrite // the frame is being written, and nobody reads it
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("write: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled write did not return")
	}

	// The abandoned frame still holds the channel; a call that gives up waiting behind
	// it sent nothing and takes no id.
	ctx3, cancel3 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel3()
	if _, err := c.Exec(ctx3, []string{"echo", "never sent"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("call behind the blocked write: %v", err)
	}

	close(gate)
	res, err := c.Exec(context.Background(), []string{"echo", "after"})
	if err != nil || string(res.Stdout) != "after\n" {
		t.Fatalf("after: %v %v", res, err)
	}
	if got := s.methods(); got != "0:init 1:exec 2:write 3:exec" {
		t.Errorf("wire = %q", got)
	}
	if len(s.file("/big")) != 1<<20 {
		t.Errorf("the abandoned write did not land whole")
	}
}

// watchWriter says when a write of more than 64 KiB begins.
type watchWriter struct {
	io.WriteCloser
	big chan struct{}
}

func (w *watchWriter) Write(p []byte) (int, error) {
	if len(p) > 64<<10 {
		select {
		case w.big <- struct{}{}:
		default:
		}
	}
	return w.WriteCloser.Write(p)
}

func TestConcurrentCallsAreSerialised(t *testing.T) {
	s := newFake()
	var inFlight, most int
	var mu sync.Mutex
	s.hook = func(s *fakeServer, m *protocol.Message) bool {
		if m.Method != "exec" {
			return false
		}
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		go func() { // answer from elsewhere, so that the reader would see a pipelined request
			time.Sleep(time.Millisecond)
			mu.Lock()
			inFlight--
			mu.Unlock()
			s.answer(m)
		}()
		return true
	}
	c, _ := open(t, s)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			word := fmt.Sprint("w", i)
			res, err := c.Exec(context.Background(), []string{"echo", word})
			if err != nil {
				t.Error(err)
				return
			}
			if string(res.Stdout) != word+"\n" {
				t.Errorf("%s got %q", word, res.Stdout)
			}
		})
	}
	wg.Wait()
	if most != 1 {
		t.Errorf("%d calls were outstanding at once", most)
	}
	var ids []int64
	for _, m := range s.messages() {
		ids = append(ids, m.ID)
	}
	for i, id := range ids {
		if id != int64(i) {
			t.Fatalf("ids = %v", ids)
		}
	}
}

func TestValidationSendsNothing(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want []string
	}{
		{"relative guest", []Option{WithMount("/srv", "work")}, []string{`WithMount("/srv", "work")`, "not absolute"}},
		{"empty guest", []Option{WithReadOnlyMount("/srv", "")}, []string{"WithReadOnlyMount", "empty guest path"}},
		{"colon guest", []Option{WithMount("/srv", "/a:b")}, []string{"holds a ':'"}},
		{"empty host", []Option{WithMount("", "/work")}, []string{"empty host directory"}},
		{"duplicate guest", []Option{WithMount("/a", "/work"), WithReadOnlyMount("/b", "/work/")},
			[]string{`WithReadOnlyMount("/b", "/work/")`, `already mounted by WithMount("/a", "/work")`}},
		{"url without scheme", []Option{WithMountURL("/srv/x", "/x", false)}, []string{"WithMountURL", "not a URL"}},
		{"empty url", []Option{WithMountURL("", "/x", false)}, []string{"empty URL"}},
		{"url with nothing after the scheme", []Option{WithMountURL("file://", "/x", false)}, []string{"not a URL"}},
		{"bad port", []Option{WithPorts("80")}, []string{`WithPorts("80")`, "HOST:GUEST"}},
		{"port zero", []Option{WithPorts("0:80")}, []string{`WithPorts("0:80")`}},
		{"port range", []Option{WithPorts("70000:1")}, []string{"70000"}},
		{"duplicate host port", []Option{WithPorts("8080:80", "8080:81")}, []string{`WithPorts("8080:81")`, "already taken"}},
		{"port without network", []Option{WithPorts("8080:80"), WithNetwork(false)}, []string{"without a network"}},
		{"zero vcpus", []Option{WithVCPUs(0)}, []string{"WithVCPUs(0)"}},
		{"zero memory", []Option{WithMemoryMiB(0)}, []string{"WithMemoryMiB(0)"}},
		{"zero disk", []Option{WithDiskGiB(0)}, []string{"WithDiskGiB(0)"}},
		{"zero gpu memory", []Option{WithGPU(true), WithGPUMemoryMiB(0)}, []string{"WithGPUMemoryMiB(0)"}},
		{"gpu memory without gpu", []Option{WithGPUMemoryMiB(1024)}, []string{"WithGPUMemoryMiB(1024)", "WithGPU(true)"}},
		{"gpu memory with gpu off", []Option{WithGPU(false), WithGPUMemoryMiB(1024)}, []string{"WithGPU(true)"}},
		{"bad digest", []Option{WithImage(protocol.ImageSource{Type: "digest", Digest: "sha256:abc"})}, []string{"WithImage(digest)"}},
		{"empty ref", []Option{WithImage(protocol.ImageSource{Type: "ref"})}, []string{"empty ref"}},
		{"bad image type", []Option{WithImage(protocol.ImageSource{Type: "tarball"})}, []string{`WithImage("tarball")`}},
		{"bad recipe", []Option{WithImage(protocol.ImageSource{Type: "recipe", Recipe: &protocol.Recipe{}})}, []string{"base is empty"}},
		{"empty server", []Option{WithServer()}, []string{"WithServer()"}},
		{"bad env", []Option{WithServerEnv([]string{"NOEQUALS"})}, []string{"KEY=value"}},
		{"several at once", []Option{WithVCPUs(0), WithPorts("x")}, []string{"WithVCPUs(0)", `WithPorts("x")`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &refuseWriter{t: t}
			c, err := New(context.Background(), strings.NewReader(""), w, tc.opts...)
			if c != nil || err == nil {
				t.Fatalf("New accepted the options")
			}
			if !errors.Is(err, ErrInvalidOption) {
				t.Errorf("err = %v, want ErrInvalidOption", err)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %q, want it to mention %q", err, want)
				}
			}
			if w.closed {
				t.Errorf("the writer was closed")
			}
			// Open checks the same things before it looks for or starts a server.
			_, err = Open(context.Background(), append(tc.opts, WithServer("/nonexistent/virtx-server"))...)
			if !errors.Is(err, ErrInvalidOption) {
				t.Errorf("Open: %v, want ErrInvalidOption", err)
			}
		})
	}
}

type refuseWriter struct {
	t      *testing.T
	closed bool
}

func (w *refuseWriter) Write(p []byte) (int, error) {
	w.t.Errorf("%d bytes written", len(p))
	return len(p), nil
}

func (w *refuseWriter) Close() error { w.closed = true; return nil }

func TestValidOddities(t *testing.T) {
	// Accepted: a URL with a colon of its own, a host path with a colon, ports at the edges.
	s := newFake()
	open(t, s,
		WithMountURL("https://example.com:8080/share", "/work/in", true),
		WithMount("/srv/odd:name", "/work"),
		WithPorts("1:65535"),
	)
	p := s.messages()[0].Params.(*protocol.InitParams)
	if got := p.Mounts[1].String(); got != "file:///srv/odd:name:/work" {
		t.Errorf("mount = %q", got)
	}
}

func TestReadArguments(t *testing.T) {
	s := newFake()
	s.files["/f"] = []byte("0123456789")
	c, _ := open(t, s)
	ctx := context.Background()
	for _, tc := range []struct {
		off, n    int64
		wantOff   any
		wantLen   any
		wantData  string
		wantError bool
	}{
		{0, -1, "absent", "absent", "0123456789", false},
		{0, 3, "absent", uint64(3), "012", false},
		{4, -1, uint64(4), "absent", "456789", false},
		{4, 0, uint64(4), uint64(0), "", false},
		{20, 5, uint64(20), uint64(5), "", false},
	} {
		res, err := c.Read(ctx, "/f", tc.off, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		if string(res.Data) != tc.wantData || res.Size != 10 {
			t.Errorf("read(%d, %d) = %q, %d", tc.off, tc.n, res.Data, res.Size)
		}
		msgs := s.messages()
		p := msgs[len(msgs)-1].Params.(*protocol.ReadParams)
		if deref(p.Offset) != tc.wantOff || deref(p.Len) != tc.wantLen {
			t.Errorf("read(%d, %d) sent offset %v len %v", tc.off, tc.n, deref(p.Offset), deref(p.Len))
		}
	}
	n := len(s.messages())
	if _, err := c.Read(ctx, "/f", -1, 1); err == nil {
		t.Errorf("a negative offset was accepted")
	}
	if len(s.messages()) != n {
		t.Errorf("a negative offset was sent")
	}
}

func TestWriteAndWriteAt(t *testing.T) {
	s := newFake()
	c, _ := open(t, s)
	ctx := context.Background()
	if n, err := c.Write(ctx, "/f", []byte("hello")); err != nil || n != 5 {
		t.Fatalf("write: %d, %v", n, err)
	}
	if n, err := c.WriteAt(ctx, "/f", []byte("J"), 0); err != nil || n != 5 {
		t.Fatalf("writeat: %d, %v", n, err)
	}
	if n, err := c.WriteAt(ctx, "/f", []byte("!"), 7); err != nil || n != 8 {
		t.Fatalf("writeat past the end: %d, %v", n, err)
	}
	if got, _ := c.ReadFile(ctx, "/f"); string(got) != "Jello\x00\x00!" {
		t.Errorf("file = %q", got)
	}
	if n, err := c.Write(ctx, "/f", nil); err != nil || n != 0 {
		t.Fatalf("truncate: %d, %v", n, err)
	}
	msgs := s.messages()
	if p := msgs[len(msgs)-1].Params.(*protocol.WriteParams); p.Offset != nil || len(p.Data) != 0 {
		t.Errorf("an empty replace sent %+v", p)
	}
	if got, err := c.ReadFile(ctx, "/f"); err != nil || len(got) != 0 {
		t.Errorf("empty file: %q, %v", got, err)
	}
}

func TestReadFileAndWriteFileSplitAcrossFrames(t *testing.T) {
	const mib = 1 << 20
	for _, size := range []int{0, 1, mib - 1, mib, 3*mib + mib/2, 4 * mib} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			s := newFake()
			s.maxRead = mib
			c, _ := open(t, s)
			c.chunk = mib + len("/work/big") // WriteFile's pieces are chunk-len(path) bytes
			ctx := context.Background()
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(i*7 + i>>11)
			}
			if err := c.WriteFile(ctx, "/work/big", data); err != nil {
				t.Fatal(err)
			}
			got, err := c.ReadFile(ctx, "/work/big")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes, want %d (equal: false)", len(got), len(data))
			}

			pieces := max(1, (size+mib-1)/mib)
			var writes, reads []string
			for _, m := range s.messages() {
				switch p := m.Params.(type) {
				case *protocol.WriteParams:
					if len(p.Data) > mib {
						t.Errorf("a write of %d bytes", len(p.Data))
					}
					writes = append(writes, fmt.Sprint(deref(p.Offset)))
				case *protocol.ReadParams:
					if p.Len != nil {
						t.Errorf("ReadFile sent a len")
					}
					reads = append(reads, fmt.Sprint(deref(p.Offset)))
				}
			}
			var wantWrites, wantReads []string
			for i := range pieces {
				off := fmt.Sprint(uint64(i * mib))
				if i == 0 {
					off = "absent"
				}
				wantWrites = append(wantWrites, off)
				wantReads = append(wantReads, off)
			}
			if !slices.Equal(writes, wantWrites) {
				t.Errorf("writes at %v, want %v", writes, wantWrites)
			}
			if !slices.Equal(reads, wantReads) {
				t.Errorf("reads at %v, want %v", reads, wantReads)
			}
		})
	}
}

func TestReadFileStopsWhenTheFileShrinks(t *testing.T) {
	s := newFake()
	s.maxRead = 4
	s.files["/f"] = []byte("0123456789")
	s.hook = func(s *fakeServer, m *protocol.Message) bool {
		if p, ok := m.Params.(*protocol.ReadParams); ok && p.Offset != nil && *p.Offset == 4 {
			s.reply(m.ID, "read", &protocol.ReadResult{Data: []byte("45"), Size: 6})
			return true
		}
		if p, ok := m.Params.(*protocol.ReadParams); ok && p.Offset != nil && *p.Offset == 6 {
			s.reply(m.ID, "read", &protocol.ReadResult{Size: 6})
			return true
		}
		return false
	}
	c, _ := open(t, s)
	got, err := c.ReadFile(context.Background(), "/f")
	if err != nil || string(got) != "012345" {
		t.Errorf("got %q, %v", got, err)
	}
}

func TestRequestLargerThanAFrameIsRefusedLocally(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 64 MiB")
	}
	s := newFake()
	c, _ := open(t, s)
	_, err := c.Write(context.Background(), "/f", make([]byte, protocol.MaxPayload))
	if err == nil || !strings.Contains(err.Error(), "more than a frame holds") {
		t.Fatalf("err = %v", err)
	}
	if errors.Is(err, ErrBroken) {
		t.Errorf("a refused request broke the channel")
	}
	if _, err := c.Exec(context.Background(), []string{"echo"}); err != nil {
		t.Fatal(err)
	}
	if got := s.methods(); got != "0:init 1:exec" {
		t.Errorf("wire = %q: the refused request took an id", got)
	}
}

func TestNewCancelledDuringInit(t *testing.T) {
	s := newFake()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.hook = func(s *fakeServer, m *protocol.Message) bool { // never answered
		if m.Method == "init" {
			cancel()
			return true
		}
		return false
	}
	h := startFake(t, s)
	c, err := New(ctx, h.clientR, h.clientW)
	if c != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("New = %v, %v", c, err)
	}
	h.waitServed(t)
	if got := s.methods(); got != "0:init" {
		t.Errorf("wire = %q", got)
	}
}

func TestNewOverAReaderThatNeverEnds(t *testing.T) {
	// Close is bounded even when the far end never closes its output: after the grace
	// period the reader, an io.Closer here, is closed.
	s := newFake()
	stuck := make(chan struct{})
	s.afterEOF = func(*fakeServer) { <-stuck }
	h := startFake(t, s)
	t.Cleanup(func() { close(stuck) }) // runs before startFake's cleanup
	c, err := New(context.Background(), h.clientR, h.clientW)
	if err != nil {
		t.Fatal(err)
	}
	c.grace = 50 * time.Millisecond
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
	if _, err := c.Exec(context.Background(), []string{"echo"}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

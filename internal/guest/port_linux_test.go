package guest

import (
	"bytes"
	"io"
	"sync"
	"testing"
	"time"
)

// fakePort answers reads from a script: (0, EOF) while "not connected", then data.
type fakePort struct {
	mu    sync.Mutex
	reads []string // "" is a read of 0 bytes and io.EOF
	out   bytes.Buffer
}

func (f *fakePort) Read(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reads) == 0 {
		return 0, io.EOF
	}
	r := f.reads[0]
	f.reads = f.reads[1:]
	if r == "" {
		return 0, io.EOF
	}
	return copy(b, r), nil
}

func (f *fakePort) Write(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.out.Write(b)
}

// TestPortRetriesUntilConnected checks the port's two meanings of a read of 0: before
// the first byte the host is not connected yet (retried), after it the host is gone.
func TestPortRetriesUntilConnected(t *testing.T) {
	f := &fakePort{reads: []string{"", "", "", "hello ", "world"}}
	gone := make(chan struct{})
	p := newPort(f, func() { close(gone) })
	got, err := io.ReadAll(p)
	if err != nil || string(got) != "hello world" {
		t.Fatalf("read %q, %v", got, err)
	}
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the end of the host's side was not reported")
	}
	if _, err := p.Write([]byte("answer")); err != nil || f.out.String() != "answer" {
		t.Fatalf("write: %v %q", err, f.out.String())
	}
}

package linux

import (
	"io"
	"time"
)

// IdleTrimAfter is how long a virtx server or sandbox init waits for its next request
// before it hands back its pages of the binary (IdleTrimmer).
const IdleTrimAfter = 2 * time.Second

// IdleTrimmer drops this process's pages of its own executable (DropExecutablePages)
// once it has been idle — Busy not called — for a while: a server that waits for its
// client most of the time then holds little more than its own heap. An idle virtx server
// or sandbox init maps about 8 MiB of the binary's code and read-only data after serving
// a request (the runtime's tables, every package's init), and under 1 MiB (its writable
// data) once trimmed; the next request maps what it touches again.
//
// It is one timer reset by every Busy: nothing runs while the process is idle but the
// trim itself, once per idle spell. (A ticker that watched the CPU time instead woke the
// Go runtime's sysmon every tick: milliseconds of CPU a second for an idle process.)
type IdleTrimmer struct {
	after time.Duration
	t     *time.Timer
}

// NewIdleTrimmer starts an IdleTrimmer that trims after of idleness, counted from now.
func NewIdleTrimmer(after time.Duration) *IdleTrimmer {
	return &IdleTrimmer{after: after, t: time.AfterFunc(after, func() { DropExecutablePages() })}
}

// Busy says the process is at work: the trim waits for another spell of idleness.
func (t *IdleTrimmer) Busy() { t.t.Reset(t.after) }

// Stop ends it: no trim after this.
func (t *IdleTrimmer) Stop() { t.t.Stop() }

// Reader is r, each read of which is Busy: for a server whose requests arrive on r.
func (t *IdleTrimmer) Reader(r io.Reader) io.Reader { return busyReader{r, t} }

type busyReader struct {
	r io.Reader
	t *IdleTrimmer
}

func (b busyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.t.Busy()
	return n, err
}

package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"
)

func header(n uint32) []byte {
	var h [4]byte
	binary.BigEndian.PutUint32(h[:], n)
	return h[:]
}

// readers gives both ways of reading frames over the same bytes.
var readers = []struct {
	name string
	read func(io.Reader) func() ([]byte, error)
}{
	{"FrameReader", func(r io.Reader) func() ([]byte, error) { return NewFrameReader(r).ReadFrame }},
	{"ReadFrame", func(r io.Reader) func() ([]byte, error) { return func() ([]byte, error) { return ReadFrame(r) } }},
}

func TestReadFrameOutcomes(t *testing.T) {
	doc := AppendNotification(nil, MethodStop)
	frame := framed(doc)
	cases := []struct {
		name   string
		input  []byte
		frames int
		err    error
	}{
		{"nothing: a clean close", nil, 0, io.EOF},
		{"one frame, then a clean close", frame, 1, io.EOF},
		{"two frames", append(append([]byte(nil), frame...), frame...), 2, io.EOF},
		{"1 header byte", frame[:1], 0, ErrTruncated},
		{"2 header bytes", frame[:2], 0, ErrTruncated},
		{"3 header bytes", frame[:3], 0, ErrTruncated},
		{"header, no body", frame[:4], 0, ErrTruncated},
		{"header, part of the body", frame[:len(frame)-1], 0, ErrTruncated},
		{"a frame, then a partial header", append(append([]byte(nil), frame...), 0, 0), 1, ErrTruncated},
		{"a frame, then a partial body", append(append([]byte(nil), frame...), frame[:10]...), 1, ErrTruncated},
		{"zero length", header(0), 0, ErrEmptyFrame},
		{"zero length with bytes after", append(header(0), frame...), 0, ErrEmptyFrame},
		{"a frame, then zero length", append(append([]byte(nil), frame...), header(0)...), 1, ErrEmptyFrame},
		{"one past the cap", header(MaxPayload + 1), 0, ErrFrameTooLarge},
		{"1 GiB", header(1 << 30), 0, ErrFrameTooLarge},
		{"4 GiB - 1", header(0xffffffff), 0, ErrFrameTooLarge},
	}
	for _, c := range cases {
		for _, rd := range readers {
			for _, slow := range []bool{false, true} {
				name := c.name + "/" + rd.name
				var r io.Reader = bytes.NewReader(c.input)
				if slow {
					name += "/one byte at a time"
					r = iotest.OneByteReader(r)
				}
				t.Run(name, func(t *testing.T) {
					read := rd.read(r)
					for i := range c.frames {
						got, err := read()
						if err != nil {
							t.Fatalf("frame %d: %v", i, err)
						}
						diffBytes(t, "frame", got, doc)
					}
					got, err := read()
					if !errors.Is(err, c.err) {
						t.Fatalf("got (%d bytes, %v), want %v", len(got), err, c.err)
					}
					if got != nil {
						t.Errorf("an error came with %d bytes", len(got))
					}
				})
			}
		}
	}
}

// io.EOF means "closed between frames" and nothing else: a reader that reports EOF along
// with the last bytes of a frame (as io.Reader allows) still yields the frame.
func TestReadFrameDataWithEOF(t *testing.T) {
	doc := AppendNotification(nil, MethodQuit)
	r := NewFrameReader(iotest.DataErrReader(bytes.NewReader(framed(doc))))
	got, err := r.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	diffBytes(t, "frame", got, doc)
	if _, err := r.ReadFrame(); err != io.EOF {
		t.Errorf("after the frame: %v, want io.EOF", err)
	}
}

// A failing stream is that failure, not an ending and not a truncation.
func TestReadFrameReaderError(t *testing.T) {
	boom := errors.New("boom")
	for _, rd := range readers {
		for _, input := range [][]byte{nil, {0, 0}, append(header(100), 1, 2, 3)} {
			r := io.MultiReader(bytes.NewReader(input), iotest.ErrReader(boom))
			if _, err := rd.read(r)(); err != boom {
				t.Errorf("%s after %d bytes: %v, want boom", rd.name, len(input), err)
			}
		}
	}
}

// countingReader counts the bytes taken from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// allocated is how many bytes the function prepare returns allocates when called, the least
// of three tries, each with a function of its own: TotalAlloc counts every goroutine's
// allocations, and one running meanwhile (the test framework's, the race detector's)
// would otherwise be charged to it.
func allocated(prepare func() func()) uint64 {
	least := ^uint64(0)
	for range 3 {
		f := prepare()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	return least
}

// A header claiming 1 GiB is refused before anything of that size is allocated, and
// without reading past the header.
func TestReadFrameTooLargeNotAllocated(t *testing.T) {
	for _, rd := range readers {
		var src *countingReader
		var err error
		n := allocated(func() func() {
			src = &countingReader{r: bytes.NewReader(append(header(1<<30), "tiny"...))}
			read := rd.read(src) // the FrameReader's own buffer is allocated here, not below
			return func() { _, err = read() }
		})
		if !errors.Is(err, ErrFrameTooLarge) {
			t.Errorf("%s: %v, want ErrFrameTooLarge", rd.name, err)
		}
		if n > 64<<10 {
			t.Errorf("%s: refusing a 1 GiB header allocated %d bytes", rd.name, n)
		}
		if rd.name == "ReadFrame" && src.n != 4 {
			t.Errorf("%s: read %d bytes, want only the 4 of the header", rd.name, src.n)
		}
	}
}

// A header within the cap whose body never comes costs what arrived, not what it claimed:
// 4 bytes must not buy 64 MiB.
func TestReadFrameTruncatedNotAllocated(t *testing.T) {
	for _, supplied := range []int{11, 1 << 20} {
		for _, rd := range readers {
			var err error
			n := allocated(func() func() {
				read := rd.read(bytes.NewReader(append(header(MaxPayload), make([]byte, supplied)...)))
				return func() { _, err = read() }
			})
			if !errors.Is(err, ErrTruncated) {
				t.Errorf("%s: %v, want ErrTruncated", rd.name, err)
			}
			if limit := uint64((earnedShare+4)*supplied + firstChunk); n > limit {
				t.Errorf("%s: a 64 MiB header and %d bytes allocated %d bytes, want at most %d", rd.name, supplied, n, limit)
			}
		}
	}
}

func TestReadFrameExactlyMaxPayload(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 64 MiB")
	}
	body := bytes.Repeat([]byte{0xa5}, MaxPayload)
	body[0], body[MaxPayload-1] = 1, 2
	input := append(header(MaxPayload), body...)
	for _, rd := range readers {
		read := rd.read(bytes.NewReader(input))
		got, err := read()
		if err != nil {
			t.Fatalf("%s: %v", rd.name, err)
		}
		if len(got) != MaxPayload || cap(got) != MaxPayload || !bytes.Equal(got, body) {
			t.Errorf("%s: got %d bytes (cap %d), want the %d sent", rd.name, len(got), cap(got), MaxPayload)
		}
		if _, err := read(); err != io.EOF {
			t.Errorf("%s: after the frame: %v, want io.EOF", rd.name, err)
		}
	}
	var w bytes.Buffer
	if err := WriteFrame(&w, body); err != nil {
		t.Fatalf("WriteFrame of exactly MaxPayload: %v", err)
	}
	diffBytes(t, "WriteFrame", w.Bytes()[:4], header(MaxPayload))
	framedBuf := append(header(0), body...)
	w.Reset()
	if err := WriteFramed(&w, framedBuf); err != nil {
		t.Fatalf("WriteFramed of exactly MaxPayload: %v", err)
	}
	diffBytes(t, "WriteFramed", w.Bytes()[:4], header(MaxPayload))
}

// A frame is the caller's to keep: reading the next one does not overwrite it.
func TestReadFrameOwnsBuffer(t *testing.T) {
	a := AppendRequest(nil, 1, MethodExec, &ExecParams{Cmd: []string{"a"}})
	b := AppendRequest(nil, 2, MethodExec, &ExecParams{Cmd: []string{"b"}})
	r := NewFrameReader(bytes.NewReader(append(framed(a), framed(b)...)))
	first, _ := r.ReadFrame()
	keep := append([]byte(nil), first...)
	if _, err := r.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	diffBytes(t, "first frame after reading the second", first, keep)
}

// Frames of sizes around the reader's growth steps read back whole, with exact capacity.
func TestReadFrameSizes(t *testing.T) {
	for _, n := range []int{1, 5, firstChunk - 1, firstChunk, firstChunk + 1, 3*firstChunk + 7, 1 << 20,
		earnedShare * firstChunk, earnedShare*firstChunk + 1, earnedShare*2*firstChunk - 1, 5<<20 + 3} {
		body := make([]byte, n)
		for i := range body {
			body[i] = byte(i * 7)
		}
		got, err := NewFrameReader(iotest.HalfReader(bytes.NewReader(framed(body)))).ReadFrame()
		if err != nil {
			t.Fatalf("%d: %v", n, err)
		}
		if !bytes.Equal(got, body) || cap(got) != n {
			t.Errorf("%d bytes: got %d (cap %d)", n, len(got), cap(got))
		}
	}
}

// writeCounter records each Write, to check a frame goes out in one.
type writeCounter struct {
	writes [][]byte
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, append([]byte(nil), p...))
	return len(p), nil
}

func TestWriteFrame(t *testing.T) {
	doc := AppendRequest(nil, 2, MethodExec, &ExecParams{Cmd: []string{"ls"}})
	var w writeCounter
	if err := WriteFrame(&w, doc); err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 1 {
		t.Fatalf("%d writes, want 1", len(w.writes))
	}
	diffBytes(t, "frame", w.writes[0], execLsFrame)

	for _, bad := range []struct {
		name string
		doc  []byte
		err  error
	}{
		{"nil", nil, ErrEmptyFrame},
		{"empty", []byte{}, ErrEmptyFrame},
		{"oversized", make([]byte, MaxPayload+1), ErrFrameTooLarge},
	} {
		var w writeCounter
		if err := WriteFrame(&w, bad.doc); !errors.Is(err, bad.err) {
			t.Errorf("%s: %v, want %v", bad.name, err, bad.err)
		}
		if len(w.writes) != 0 {
			t.Errorf("%s: refused, yet wrote %d times", bad.name, len(w.writes))
		}
	}
}

func TestWriteFramed(t *testing.T) {
	buf := AppendRequest(NewFrameBuffer(0), 2, MethodExec, &ExecParams{Cmd: []string{"ls"}})
	var w writeCounter
	if err := WriteFramed(&w, buf); err != nil {
		t.Fatal(err)
	}
	if len(w.writes) != 1 {
		t.Fatalf("%d writes, want 1", len(w.writes))
	}
	diffBytes(t, "frame", w.writes[0], execLsFrame)

	// The header is overwritten, whatever was there.
	buf2 := append([]byte{9, 9, 9, 9}, execLsFrame[4:]...)
	w = writeCounter{}
	if err := WriteFramed(&w, buf2); err != nil {
		t.Fatal(err)
	}
	diffBytes(t, "stale header", w.writes[0], execLsFrame)

	for _, bad := range []struct {
		name string
		buf  []byte
		err  error
	}{
		{"nil", nil, ErrEmptyFrame},
		{"short of a header", []byte{0, 0}, ErrEmptyFrame},
		{"header only", NewFrameBuffer(10), ErrEmptyFrame},
		{"oversized", make([]byte, 4+MaxPayload+1), ErrFrameTooLarge},
	} {
		var w writeCounter
		if err := WriteFramed(&w, bad.buf); !errors.Is(err, bad.err) {
			t.Errorf("%s: %v, want %v", bad.name, err, bad.err)
		}
		if len(w.writes) != 0 {
			t.Errorf("%s: refused, yet wrote %d times", bad.name, len(w.writes))
		}
	}
	if b := NewFrameBuffer(100); len(b) != 4 || cap(b) < 104 {
		t.Errorf("NewFrameBuffer(100): len %d cap %d", len(b), cap(b))
	}
}

// A write error is returned as it is.
func TestWriteFrameError(t *testing.T) {
	boom := errors.New("boom")
	w := errWriter{boom}
	if err := WriteFrame(w, []byte{1}); err != boom {
		t.Errorf("WriteFrame: %v", err)
	}
	if err := WriteFramed(w, []byte{0, 0, 0, 0, 1}); err != boom {
		t.Errorf("WriteFramed: %v", err)
	}
}

type errWriter struct{ err error }

func (w errWriter) Write([]byte) (int, error) { return 0, w.err }

// Both ends of a pipe, the way a client and server use them: messages of every shape go
// through WriteFramed on one side and come out of FrameReader and Decode on the other.
func TestFramePipe(t *testing.T) {
	docs := [][]byte{
		AppendRequest(NewFrameBuffer(0), 0, MethodInit, &InitParams{Mounts: []Mount{{URL: "file:///srv/project", GuestPath: "/work", ReadOnly: true}}}),
		AppendResult(NewFrameBuffer(0), 0, MethodInit, &InitResult{Cwd: "/work"}),
		AppendNotification(NewFrameBuffer(0), MethodStart),
		AppendRequest(NewFrameBuffer(0), 1, MethodExec, &ExecParams{Cmd: []string{"sh", "-c", "echo hi"}}),
		AppendResult(NewFrameBuffer(0), 1, MethodExec, &ExecResult{Stdout: bytes.Repeat([]byte("hi\n"), 100000)}),
		AppendError(NewFrameBuffer(0), 2, true, &Error{Code: CodeTimedOut, Message: "killed after 5000ms"}),
		AppendNotification(NewFrameBuffer(0), MethodQuit),
	}
	pr, pw := io.Pipe()
	go func() {
		for _, d := range docs {
			if err := WriteFramed(pw, append([]byte(nil), d...)); err != nil {
				pw.CloseWithError(err)
				return
			}
		}
		pw.Close()
	}()
	r := NewFrameReader(pr)
	for i, d := range docs {
		got, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		diffBytes(t, "frame", got, d[4:])
		m := decodeOK(t, got)
		want := decodeOK(t, d[4:])
		if diff := cmp.Diff(want, m); diff != "" {
			t.Errorf("frame %d (-want +got):\n%s", i, diff)
		}
	}
	if _, err := r.ReadFrame(); err != io.EOF {
		t.Errorf("after the last frame: %v, want io.EOF", err)
	}
}

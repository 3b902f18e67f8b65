package protocol

import (
	"bytes"
	"io"
	"testing"
)

var benchSizes = []struct {
	name string
	n    int
}{
	{"4KiB", 4 << 10},
	{"16MiB", 16 << 20},
}

func benchResult(n int) *ExecResult {
	out := make([]byte, n)
	for i := range out {
		out[i] = byte(i*131 + i>>8)
	}
	return &ExecResult{Code: 0, Stdout: out, Stderr: []byte("warning: something\n")}
}

// Encoding an exec result the way a server answers: a buffer sized by SizeHint, the
// message appended in place behind a reserved header, one Write.
func BenchmarkEncodeExecResult(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			res := benchResult(s.n)
			b.SetBytes(int64(s.n))
			b.ReportAllocs()
			for b.Loop() {
				buf := AppendResult(NewFrameBuffer(SizeHint(res)), 7, MethodExec, res)
				if err := WriteFramed(io.Discard, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(s.name+"/reused-buffer", func(b *testing.B) {
			res := benchResult(s.n)
			buf := NewFrameBuffer(SizeHint(res))
			b.SetBytes(int64(s.n))
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendResult(buf[:headerLen], 7, MethodExec, res)
				if err := WriteFramed(io.Discard, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Decoding an exec result document (stdout aliases the frame, so this is the envelope's
// cost and the structural walk, not a copy of the output).
func BenchmarkDecodeExecResult(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			doc := AppendResult(nil, 7, MethodExec, benchResult(s.n))
			b.SetBytes(int64(s.n))
			b.ReportAllocs()
			for b.Loop() {
				m, err := Decode(doc)
				if err != nil {
					b.Fatal(err)
				}
				if len(m.Result.(*ExecResult).Stdout) != s.n {
					b.Fatal("short stdout")
				}
			}
		})
	}
}

// The whole path for one exec result: encode, frame, write, read the frame back, decode.
func BenchmarkFrameRoundTrip(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name+"/buffer", func(b *testing.B) {
			res := benchResult(s.n)
			var wire bytes.Buffer
			r := NewFrameReader(&wire)
			b.SetBytes(int64(s.n))
			b.ReportAllocs()
			for b.Loop() {
				wire.Reset()
				if err := WriteFramed(&wire, AppendResult(NewFrameBuffer(SizeHint(res)), 7, MethodExec, res)); err != nil {
					b.Fatal(err)
				}
				frame, err := r.ReadFrame()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Decode(frame); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(s.name+"/pipe", func(b *testing.B) {
			res := benchResult(s.n)
			pr, pw := io.Pipe()
			defer pr.Close()
			frames := make(chan int)
			done := make(chan error, 1)
			go func() {
				defer pw.Close()
				for range frames {
					if err := WriteFramed(pw, AppendResult(NewFrameBuffer(SizeHint(res)), 7, MethodExec, res)); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			r := NewFrameReader(pr)
			b.SetBytes(int64(s.n))
			b.ReportAllocs()
			for b.Loop() {
				frames <- 1
				frame, err := r.ReadFrame()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := Decode(frame); err != nil {
					b.Fatal(err)
				}
			}
			close(frames)
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// Control frames, the other half of the traffic: a small request each way.
func BenchmarkControlFrame(b *testing.B) {
	p := &ExecParams{Cmd: []string{"sh", "-c", "echo hi"}, TimeoutMS: u64(5000)}
	var wire bytes.Buffer
	r := NewFrameReader(&wire)
	b.ReportAllocs()
	for b.Loop() {
		wire.Reset()
		if err := WriteFramed(&wire, AppendRequest(NewFrameBuffer(SizeHint(p)), 2, MethodExec, p)); err != nil {
			b.Fatal(err)
		}
		frame, err := r.ReadFrame()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Decode(frame); err != nil {
			b.Fatal(err)
		}
	}
}

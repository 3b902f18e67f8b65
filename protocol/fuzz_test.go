package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime/metrics"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// seedDocs are real messages of every shape: what this package writes for each method,
// what an upstream peer may write instead, and a few refusals.
func seedDocs() [][]byte {
	recipe := &Recipe{Base: "alpine:3.20", Steps: []Step{
		{Kind: StepRun, Run: "apk add --no-cache jq"},
		{Kind: StepCopy, Src: "app", Dst: "/app"},
		{Kind: StepEnv, Key: "K", Value: "V"},
		{Kind: StepWorkdir, Workdir: "/app"},
	}}
	docs := [][]byte{
		AppendRequest(nil, 0, MethodVersion, nil),
		AppendRequest(nil, 1, MethodBuildImage, &BuildImageParams{Recipe: recipe, Ref: "tools:1"}),
		AppendRequest(nil, 2, MethodRemoveImage, &RemoveImageParams{Image: &ImageSource{Type: ImageDigest, Digest: digest64}}),
		AppendRequest(nil, 3, MethodListImages, Empty{}),
		AppendRequest(nil, 4, MethodInit, &InitParams{
			Image: &ImageSource{Type: ImageRecipe, Recipe: recipe}, Snapshot: []byte("tar"),
			Network: ptrBool(true), Ports: []Port{{8080, 80}}, VCPUs: u64(2), MemoryMiB: u64(2048),
			GPU: ptrBool(false), GPUMemoryMiB: u64(1), DiskGiB: u64(8),
			Mounts: []Mount{{URL: "file:///srv/odd:name", GuestPath: "/work", ReadOnly: true}, {URL: "https://example.com:8080/share", GuestPath: "/work/in"}},
		}),
		AppendRequest(nil, 5, MethodExec, &ExecParams{Cmd: []string{"sh", "-c", "echo hi"}, TimeoutMS: u64(5000)}),
		AppendRequest(nil, 6, MethodRead, &ReadParams{Path: "/work/log", Offset: u64(4096), Len: u64(1024)}),
		AppendRequest(nil, 7, MethodWrite, &WriteParams{Path: "/work/in", Data: []byte("hi\n"), Offset: u64(3)}),
		AppendRequest(nil, 8, MethodSnapshot, Empty{}),
		AppendNotification(nil, MethodStart),
		AppendNotification(nil, MethodStop),
		AppendNotification(nil, MethodQuit),
		AppendResult(nil, 0, MethodVersion, &VersionResult{Version: "0.1.0"}),
		AppendResult(nil, 1, MethodBuildImage, &BuildImageResult{Ref: "tools:1", Digest: digest64}),
		AppendResult(nil, 2, MethodRemoveImage, Empty{}),
		AppendResult(nil, 3, MethodListImages, &ListImagesResult{Images: []ImageEntry{{Digest: digest64, Refs: []string{"a:b"}}}}),
		AppendResult(nil, 4, MethodInit, &InitResult{Cwd: "/work"}),
		AppendResult(nil, 5, MethodExec, &ExecResult{Code: 1, Stdout: []byte("hi\n"), Stderr: []byte{0xff}, Truncated: true}),
		AppendRequest(nil, 5, MethodExec, &ExecParams{Cmd: []string{"pwd"}, Cwd: "/work"}),
		AppendResult(nil, 5, MethodExec, &ExecResult{Stdout: []byte("/work\n"), Cwd: "/work"}),
		AppendResult(nil, 6, MethodRead, &ReadResult{Data: []byte("x"), Size: 10000}),
		AppendResult(nil, 7, MethodWrite, &WriteResult{Size: 3}),
		AppendResult(nil, 8, MethodSnapshot, &SnapshotResult{Blob: []byte("layer")}),
		AppendError(nil, 5, true, &Error{Code: CodeTimedOut, Message: "killed after 5000ms"}),
		AppendError(nil, 0, false, &Error{Code: CodeParseError, Message: "not BSON"}),
		// Upstream variations.
		mustMarshal(D{E("params", D{E("cmd", A{"ls"}), E("timeout_ms", int32(10))}), E("method", "exec"), E("id", int32(2)), rpc, E("trace_id", "t")}),
		initParams(E("snapshot", A{int32(1), int64(2), int32(255)}), E("vcpus", int64(4)), E("memory_mib", 2048.0), E("network", nil)),
		mustMarshal(D{rpc, E("id", nil), E("method", "stop")}),
		mustMarshal(D{rpc, E("id", int64(9)), E("method", "version")}),
		resDoc("exec", D{E("code", int64(0)), E("stdout", bson.Binary{Subtype: 0x80, Data: []byte("x")})}),
		// Refusals.
		mustMarshal(D{rpc, E("id", int64(4)), E("result", D{}), E("error", D{E("code", int64(1))})}),
		mustMarshal(D{rpc, E("id", int64(7)), E("method", "stop")}),
		reqDoc(int64(1), "frobnicate", D{}),
		withRawParams(unhex("0b000000 10 7800 ffffff 00")),
	}
	return docs
}

func FuzzDecode(f *testing.F) {
	for _, d := range seedDocs() {
		f.Add(d)
	}
	// The decode tables: every refusal rule and every accepted variation, each a
	// document a mutation is a byte or two away from something new.
	for _, c := range refusalCases() {
		f.Add(c.doc)
	}
	for _, c := range acceptCases() {
		f.Add(c.doc)
	}
	f.Add([]byte{})
	f.Add([]byte{5, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, doc []byte) {
		orig := append([]byte(nil), doc...)
		m, err := Decode(doc)
		if !bytes.Equal(doc, orig) {
			t.Fatal("Decode modified its input")
		}
		if err != nil {
			if m != nil {
				t.Fatalf("a refusal came with a message %+v", m)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("refusal %T %v is not an *Error", err, err)
			}
			switch e.Code {
			case CodeParseError, CodeInvalidRequest, CodeMethodNotFound, CodeInvalidParams:
			default:
				t.Fatalf("refused with %s", e.Code)
			}
			if e.Code == CodeParseError && e.HasID {
				t.Fatal("a parse error claims to have read an id")
			}
			// The refusal is answerable: the error it becomes reads back as itself.
			answer := decodeOK(t, AppendError(nil, e.ID, e.HasID, e))
			if answer.Err.Code != e.Code || answer.HasID != e.HasID || answer.ID != e.ID {
				t.Fatalf("refusal %+v answered as %+v", e, answer)
			}
			return
		}

		var again []byte
		switch m.Kind {
		case KindRequest:
			p, ok := m.Params.(Payload)
			if !ok || !m.HasID {
				t.Fatalf("request %+v: params %T, id %v", m, m.Params, m.HasID)
			}
			again = AppendRequest(nil, m.ID, m.Method, p)
		case KindNotification:
			if m.HasID || !IsNotification(m.Method) {
				t.Fatalf("notification %+v", m)
			}
			again = AppendNotification(nil, m.Method)
		case KindResponse:
			switch {
			case m.Err != nil:
				if m.Result != nil || m.Method != "" {
					t.Fatalf("error response with a result or method: %+v", m)
				}
				again = AppendError(nil, m.ID, m.HasID, m.Err)
			default:
				r, ok := m.Result.(Payload)
				if !ok || !m.HasID {
					t.Fatalf("result %+v: %T, id %v", m, m.Result, m.HasID)
				}
				again = AppendResult(nil, m.ID, m.Method, r)
			}
		default:
			t.Fatalf("kind %d", m.Kind)
		}
		m2, err := Decode(again)
		if err != nil {
			t.Fatalf("%s re-encoded and was refused: %v\nfirst: %+v", m, err, m)
		}
		if diff := cmp.Diff(m, m2, cmpOpts...); diff != "" {
			t.Fatalf("re-encoded and decoded differently (-first +again):\n%s", diff)
		}
		// And the encoding is a fixed point from there on.
		var third []byte
		switch {
		case m2.Kind == KindRequest:
			third = AppendRequest(nil, m2.ID, m2.Method, m2.Params.(Payload))
		case m2.Kind == KindNotification:
			third = AppendNotification(nil, m2.Method)
		case m2.Err != nil:
			third = AppendError(nil, m2.ID, m2.HasID, m2.Err)
		default:
			third = AppendResult(nil, m2.ID, m2.Method, m2.Result.(Payload))
		}
		if !bytes.Equal(again, third) {
			t.Fatalf("encoding is not stable:\n%x\n%x", again, third)
		}
	})
}

// heapAllocs is the bytes allocated on the heap so far. runtime/metrics, unlike
// ReadMemStats, does not stop the world, so it is cheap enough to call per fuzz input;
// large allocations (everything that matters here) are counted as they happen.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func frameSeeds() [][]byte {
	var all []byte
	var seeds [][]byte
	for _, d := range seedDocs() {
		fr := framed(d)
		seeds = append(seeds, fr)
		all = append(all, fr...)
	}
	exec := framed(seedDocs()[5])
	seeds = append(seeds,
		all,
		nil,
		exec[:2],
		exec[:len(exec)-1],
		append(append([]byte(nil), exec...), 0, 0, 0),
		header(0),
		header(MaxPayload+1),
		append(header(1<<30), "tiny"...),
		append(header(MaxPayload), "a few bytes"...),
		append(header(3), 1, 2, 3),
	)
	return seeds
}

func FuzzReadFrame(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		// Never more than a small multiple of what was supplied: a header alone must not
		// buy its claimed size. (The multiple is the reader's growth policy, see
		// readFrame; the slack covers the first chunk of a body and the frames slice.) The heap counter is process-wide and the fuzzing engine
		// allocates beside us, so the reading is the least of three: what the reader
		// allocates is deterministic, the noise is not. Always three, never "again if
		// over": a branch taken on noise is coverage the fuzzer chases and cannot
		// reproduce.
		frames, err, alloc := readAll(data)
		_, _, alloc2 := readAll(data)
		_, _, alloc3 := readAll(data)
		alloc = min(alloc, alloc2, alloc3)
		if limit := uint64((earnedShare+4)*len(data)) + 256<<10; alloc > limit {
			t.Fatalf("%d input bytes made the reader allocate %d", len(data), alloc)
		}

		// Each frame re-encodes to exactly the bytes it came from.
		var out bytes.Buffer
		for i, fr := range frames {
			if len(fr) == 0 || len(fr) > MaxPayload || len(fr) > len(data) {
				t.Fatalf("frame %d of %d bytes from %d of input", i, len(fr), len(data))
			}
			if cap(fr) != len(fr) {
				t.Fatalf("frame %d: len %d cap %d", i, len(fr), cap(fr))
			}
			if err := WriteFrame(&out, fr); err != nil {
				t.Fatalf("frame %d does not write back: %v", i, err)
			}
		}
		if !bytes.HasPrefix(data, out.Bytes()) {
			t.Fatal("frames re-encode to different bytes")
		}

		// The error says exactly what is left.
		rest := data[out.Len():]
		var size uint64
		if len(rest) >= 4 {
			size = uint64(binary.BigEndian.Uint32(rest))
		}
		switch {
		case err == io.EOF:
			if len(rest) != 0 {
				t.Fatalf("io.EOF with %d bytes unread", len(rest))
			}
		case errors.Is(err, ErrTruncated):
			if len(rest) == 0 || (len(rest) >= 4 && size <= uint64(len(rest)-4)) {
				t.Fatalf("ErrTruncated, with %d bytes left and a header of %d", len(rest), size)
			}
		case errors.Is(err, ErrEmptyFrame):
			if len(rest) < 4 || size != 0 {
				t.Fatalf("ErrEmptyFrame with %x left", rest[:min(len(rest), 4)])
			}
		case errors.Is(err, ErrFrameTooLarge):
			if size <= MaxPayload {
				t.Fatalf("ErrFrameTooLarge for a header of %d", size)
			}
		default:
			t.Fatalf("unexpected error %v", err)
		}

		// The unbuffered reader sees the same frames and the same ending.
		src := bytes.NewReader(data)
		for i := 0; ; i++ {
			fr, err2 := ReadFrame(src)
			if err2 != nil {
				if i != len(frames) || sentinel(err2) != sentinel(err) {
					t.Fatalf("ReadFrame ended at frame %d with %v; FrameReader at %d with %v", i, err2, len(frames), err)
				}
				break
			}
			if i >= len(frames) || !bytes.Equal(fr, frames[i]) {
				t.Fatalf("ReadFrame frame %d differs", i)
			}
		}
	})
}

// sentinel is which of the framing errors err is.
func sentinel(err error) error {
	for _, s := range []error{io.EOF, ErrTruncated, ErrEmptyFrame, ErrFrameTooLarge} {
		if errors.Is(err, s) {
			return s
		}
	}
	return err
}

// readAll reads frames from data until an error, and reports the heap bytes it took.
func readAll(data []byte) (frames [][]byte, err error, alloc uint64) {
	r := NewFrameReader(bytes.NewReader(data))
	before := heapAllocs()
	for {
		var fr []byte
		if fr, err = r.ReadFrame(); err != nil {
			break
		}
		frames = append(frames, fr)
	}
	return frames, err, heapAllocs() - before
}

package protocol

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// These tests pin the bytes, not a round trip: a round trip passes just as well if stdout
// became a base64 string, or an id an Int32, on both ends at once.

// The minimal exec request of PROTOCOL.md, `{"jsonrpc":"2.0","id":2,"method":"exec",
// "params":{"cmd":["ls"]}}`, spelled out byte by byte. PROTOCOL.md's codec table gives
// it as 84 bytes of BSON.
var execLsFrame = unhex(`
	00000054
	54000000
	02 6a736f6e72706300 | 04000000 322e3000
	12 696400           | 0200000000000000
	02 6d6574686f6400   | 05000000 6578656300
	03 706172616d7300   | 19000000
	    04 636d6400     | 0f000000
	        02 3000     | 03000000 6c7300
	        00
	    00
	00`)

func TestRequestFrameBytes(t *testing.T) {
	doc := AppendRequest(nil, 2, MethodExec, &ExecParams{Cmd: []string{"ls"}})
	if len(doc) != 84 {
		t.Errorf("exec {cmd:[ls]} is %d bytes, PROTOCOL.md says 84", len(doc))
	}
	var w bytes.Buffer
	if err := WriteFrame(&w, doc); err != nil {
		t.Fatal(err)
	}
	diffBytes(t, "WriteFrame", w.Bytes(), execLsFrame)

	// The same frame built in place, with the header reserved up front.
	buf := AppendRequest(NewFrameBuffer(84), 2, MethodExec, &ExecParams{Cmd: []string{"ls"}})
	w.Reset()
	if err := WriteFramed(&w, buf); err != nil {
		t.Fatal(err)
	}
	diffBytes(t, "WriteFramed", w.Bytes(), execLsFrame)

	// And a third party agrees with the hand-written dump.
	want := marshal(t, bson.D{
		{Key: "jsonrpc", Value: "2.0"},
		{Key: "id", Value: int64(2)},
		{Key: "method", Value: "exec"},
		{Key: "params", Value: bson.D{{Key: "cmd", Value: bson.A{"ls"}}}},
	})
	diffBytes(t, "bson.Marshal", want, execLsFrame[4:])
}

func TestResultFrameBytes(t *testing.T) {
	doc := AppendResult(nil, 2, MethodExec, &ExecResult{Code: 0, Stdout: []byte("hi\n"), Stderr: nil})
	want := marshal(t, bson.D{
		{Key: "jsonrpc", Value: "2.0"},
		{Key: "id", Value: int64(2)},
		{Key: "method", Value: "exec"},
		{Key: "result", Value: bson.D{
			{Key: "code", Value: int32(0)},
			{Key: "stdout", Value: bin("hi\n")},
			{Key: "stderr", Value: bin("")},
			{Key: "truncated", Value: false},
		}},
	})
	diffBytes(t, "exec result", doc, want)

	// stdout, located by hand: type 0x05 (Binary), key, int32 length 3, subtype 0x00,
	// the three bytes themselves — never a string, never base64.
	stdout := append([]byte{0x05}, "stdout\x00"+"\x03\x00\x00\x00"+"\x00"+"hi\n"...)
	i := bytes.Index(doc, stdout)
	if i < 0 {
		t.Fatalf("no Binary stdout of subtype 0 holding \"hi\\n\" in\n%x", doc)
	}
	if sub := doc[i+len("\x05stdout\x00")+4]; sub != 0x00 {
		t.Errorf("stdout subtype = %#x, want 0x00", sub)
	}
	if bytes.Contains(doc, []byte(base64.StdEncoding.EncodeToString([]byte("hi\n")))) {
		t.Error("the frame holds stdout as base64")
	}
	stderr := append([]byte{0x05}, "stderr\x00"+"\x00\x00\x00\x00"+"\x00"...)
	if !bytes.Contains(doc, stderr) {
		t.Errorf("empty stderr is not an empty Binary of subtype 0:\n%x", doc)
	}
	if typ := typeOf(t, doc, "result", "code"); typ != bsoncore.TypeInt32 {
		t.Errorf("exec code is %s, want int32", typ)
	}
}

func TestErrorFrameBytes(t *testing.T) {
	doc := AppendError(nil, 2, true, &Error{Code: CodeTimedOut, Message: "killed after 5000ms"})
	want := marshal(t, bson.D{
		{Key: "jsonrpc", Value: "2.0"},
		{Key: "id", Value: int64(2)},
		{Key: "error", Value: bson.D{
			{Key: "code", Value: int64(-32000)},
			{Key: "message", Value: "killed after 5000ms"},
		}},
	})
	diffBytes(t, "error", doc, want)
	if _, err := bsoncore.Document(doc).LookupErr("method"); err == nil {
		t.Error("an error frame carries a method")
	}
	if typ := typeOf(t, doc, "error", "code"); typ != bsoncore.TypeInt64 {
		t.Errorf("error code is %s, want int64", typ)
	}
	// The Decode-side fields of an *Error (ID, HasID) never reach the wire.
	withID := AppendError(nil, 2, true, &Error{Code: CodeTimedOut, Message: "killed after 5000ms", ID: 9, HasID: true})
	diffBytes(t, "error with Decode fields set", withID, want)
}

func TestNullIDErrorFrameBytes(t *testing.T) {
	doc := AppendError(nil, 0, false, &Error{Code: CodeParseError, Message: "not a BSON document"})
	want := marshal(t, bson.D{
		{Key: "jsonrpc", Value: "2.0"},
		{Key: "id", Value: nil},
		{Key: "error", Value: bson.D{
			{Key: "code", Value: int64(-32700)},
			{Key: "message", Value: "not a BSON document"},
		}},
	})
	diffBytes(t, "null-id error", doc, want)

	// And it reads back: an error to a frame whose id could not be read.
	m := decodeOK(t, doc)
	if m.Kind != KindResponse || m.HasID || m.Err == nil || m.Err.Code != CodeParseError {
		t.Errorf("decoded %+v, want an error response with no id", m)
	}
}

func TestNotificationFrameBytes(t *testing.T) {
	for _, method := range []string{MethodStart, MethodStop, MethodQuit} {
		doc := AppendNotification(nil, method)
		want := marshal(t, bson.D{
			{Key: "jsonrpc", Value: "2.0"},
			{Key: "method", Value: method},
		})
		diffBytes(t, method, doc, want)
	}
	// `{"jsonrpc":"2.0","method":"stop"}`, by hand.
	diffBytes(t, "stop by hand", AppendNotification(nil, MethodStop), unhex(`
		27000000
		02 6a736f6e72706300 | 04000000 322e3000
		02 6d6574686f6400   | 05000000 73746f7000
		00`))
}

// Every method's params and result, against the same members written by bson.Marshal in
// the order the appender writes them: this pins each member's BSON type.
func TestMethodBytes(t *testing.T) {
	digest := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	recipe := &Recipe{Base: "alpine:3.20", Steps: []Step{
		{Kind: StepRun, Run: "apk add --no-cache jq"},
		{Kind: StepCopy, Src: "app", Dst: "/app"},
		{Kind: StepEnv, Key: "PATH", Value: "/app/bin:/usr/bin"},
		{Kind: StepWorkdir, Workdir: "/app"},
	}}
	recipeD := bson.D{
		{Key: "v", Value: int32(1)},
		{Key: "base", Value: "alpine:3.20"},
		{Key: "steps", Value: bson.A{
			bson.D{{Key: "run", Value: "apk add --no-cache jq"}},
			bson.D{{Key: "copy", Value: bson.D{{Key: "src", Value: "app"}, {Key: "dst", Value: "/app"}}}},
			bson.D{{Key: "env", Value: bson.D{{Key: "key", Value: "PATH"}, {Key: "value", Value: "/app/bin:/usr/bin"}}}},
			bson.D{{Key: "workdir", Value: "/app"}},
		}},
	}
	req := func(id int64, method string, params bson.D) bson.D {
		return bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: id}, {Key: "method", Value: method}, {Key: "params", Value: params}}
	}
	res := func(id int64, method string, result bson.D) bson.D {
		return bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: id}, {Key: "method", Value: method}, {Key: "result", Value: result}}
	}
	cases := []struct {
		name string
		got  []byte
		want bson.D
	}{
		{"version params", AppendRequest(nil, 0, MethodVersion, nil), req(0, "version", bson.D{})},
		{"version result", AppendResult(nil, 0, MethodVersion, &VersionResult{Version: "0.1.0"}),
			res(0, "version", bson.D{{Key: "version", Value: "0.1.0"}})},
		{"build_image params", AppendRequest(nil, 1, MethodBuildImage, &BuildImageParams{Recipe: recipe, Ref: "tools:1"}),
			req(1, "build_image", bson.D{{Key: "recipe", Value: recipeD}, {Key: "ref", Value: "tools:1"}})},
		{"build_image params without ref", AppendRequest(nil, 1, MethodBuildImage, &BuildImageParams{Recipe: &Recipe{Base: "alpine"}}),
			req(1, "build_image", bson.D{{Key: "recipe", Value: bson.D{{Key: "v", Value: int32(1)}, {Key: "base", Value: "alpine"}, {Key: "steps", Value: bson.A{}}}}})},
		{"build_image result", AppendResult(nil, 1, MethodBuildImage, &BuildImageResult{Ref: "tools:1", Digest: digest}),
			res(1, "build_image", bson.D{{Key: "ref", Value: "tools:1"}, {Key: "digest", Value: digest}})},
		{"remove_image params ref", AppendRequest(nil, 2, MethodRemoveImage, &RemoveImageParams{Image: &ImageSource{Type: ImageRef, Ref: "tools:1"}}),
			req(2, "remove_image", bson.D{{Key: "image", Value: bson.D{{Key: "type", Value: "ref"}, {Key: "ref", Value: "tools:1"}}}})},
		{"remove_image params digest", AppendRequest(nil, 2, MethodRemoveImage, &RemoveImageParams{Image: &ImageSource{Type: ImageDigest, Digest: digest}}),
			req(2, "remove_image", bson.D{{Key: "image", Value: bson.D{{Key: "type", Value: "digest"}, {Key: "digest", Value: digest}}}})},
		{"remove_image result", AppendResult(nil, 2, MethodRemoveImage, Empty{}), res(2, "remove_image", bson.D{})},
		{"list_images params", AppendRequest(nil, 3, MethodListImages, Empty{}), req(3, "list_images", bson.D{})},
		{"list_images result", AppendResult(nil, 3, MethodListImages, &ListImagesResult{Images: []ImageEntry{
			{Digest: digest, Refs: []string{"tools:1", "tools:latest"}},
			{Digest: digest},
		}}), res(3, "list_images", bson.D{{Key: "images", Value: bson.A{
			bson.D{{Key: "digest", Value: digest}, {Key: "refs", Value: bson.A{"tools:1", "tools:latest"}}},
			bson.D{{Key: "digest", Value: digest}}, // refs omitted when empty
		}}})},
		{"list_images result empty", AppendResult(nil, 3, MethodListImages, &ListImagesResult{}),
			res(3, "list_images", bson.D{{Key: "images", Value: bson.A{}}})},
		{"init params default", AppendRequest(nil, 4, MethodInit, &InitParams{}), req(4, "init", bson.D{})},
		{"init params full", AppendRequest(nil, 4, MethodInit, &InitParams{
			Image:        &ImageSource{Type: ImageRecipe, Recipe: &Recipe{Base: "alpine"}},
			Snapshot:     []byte{1, 2, 3},
			Network:      ptrBool(true),
			Ports:        []Port{{8080, 80}, {5901, 5900}},
			VCPUs:        u64(4),
			MemoryMiB:    u64(4096),
			GPU:          ptrBool(true),
			GPUMemoryMiB: u64(8192),
			DiskGiB:      u64(32),
			Mounts: []Mount{
				{URL: "file:///srv/project", GuestPath: "/work", ReadOnly: true},
				{URL: "file:///srv/out", GuestPath: "/work/out"},
			},
		}), req(4, "init", bson.D{
			{Key: "image", Value: bson.D{{Key: "type", Value: "recipe"}, {Key: "recipe", Value: bson.D{{Key: "v", Value: int32(1)}, {Key: "base", Value: "alpine"}, {Key: "steps", Value: bson.A{}}}}}},
			{Key: "snapshot", Value: bson.Binary{Data: []byte{1, 2, 3}}},
			{Key: "network", Value: true},
			{Key: "ports", Value: bson.A{"8080:80", "5901:5900"}},
			{Key: "vcpus", Value: int32(4)},
			{Key: "memory_mib", Value: int64(4096)},
			{Key: "gpu", Value: true},
			{Key: "gpu_memory_mib", Value: int64(8192)},
			{Key: "disk_gib", Value: int64(32)},
			{Key: "mounts", Value: bson.A{"file:///srv/project:/work:ro", "file:///srv/out:/work/out"}},
		})},
		{"init params network off", AppendRequest(nil, 4, MethodInit, &InitParams{Network: ptrBool(false)}),
			req(4, "init", bson.D{{Key: "network", Value: false}})},
		{"init result", AppendResult(nil, 4, MethodInit, &InitResult{Cwd: "/work"}),
			res(4, "init", bson.D{{Key: "cwd", Value: "/work"}})},
		{"init result without cwd", AppendResult(nil, 4, MethodInit, &InitResult{}), res(4, "init", bson.D{})},
		{"exec params", AppendRequest(nil, 5, MethodExec, &ExecParams{Cmd: []string{"sh", "-c", "echo hi"}, TimeoutMS: u64(5000)}),
			req(5, "exec", bson.D{{Key: "cmd", Value: bson.A{"sh", "-c", "echo hi"}}, {Key: "timeout_ms", Value: int64(5000)}})},
		{"exec result", AppendResult(nil, 5, MethodExec, &ExecResult{Code: 130, Stdout: []byte{0xff, 0}, Stderr: []byte("x"), Truncated: true}),
			res(5, "exec", bson.D{{Key: "code", Value: int32(130)}, {Key: "stdout", Value: bson.Binary{Data: []byte{0xff, 0}}}, {Key: "stderr", Value: bin("x")}, {Key: "truncated", Value: true}})},
		{"read params", AppendRequest(nil, 6, MethodRead, &ReadParams{Path: "/work/out/log.txt", Offset: u64(4096), Len: u64(1024)}),
			req(6, "read", bson.D{{Key: "path", Value: "/work/out/log.txt"}, {Key: "offset", Value: int64(4096)}, {Key: "len", Value: int64(1024)}})},
		{"read params path only", AppendRequest(nil, 6, MethodRead, &ReadParams{Path: "/f"}),
			req(6, "read", bson.D{{Key: "path", Value: "/f"}})},
		{"read result", AppendResult(nil, 6, MethodRead, &ReadResult{Data: []byte("hi\n"), Size: 10000}),
			res(6, "read", bson.D{{Key: "data", Value: bin("hi\n")}, {Key: "size", Value: int64(10000)}})},
		{"write params", AppendRequest(nil, 7, MethodWrite, &WriteParams{Path: "/work/in/data", Data: []byte("hi\n"), Offset: u64(0)}),
			req(7, "write", bson.D{{Key: "path", Value: "/work/in/data"}, {Key: "data", Value: bin("hi\n")}, {Key: "offset", Value: int64(0)}})},
		{"write params empty", AppendRequest(nil, 7, MethodWrite, &WriteParams{Path: "/empty"}),
			req(7, "write", bson.D{{Key: "path", Value: "/empty"}})}, // data omitted when empty
		{"write result", AppendResult(nil, 7, MethodWrite, &WriteResult{Size: 3}),
			res(7, "write", bson.D{{Key: "size", Value: int64(3)}})},
		{"snapshot params", AppendRequest(nil, 8, MethodSnapshot, Empty{}), req(8, "snapshot", bson.D{})},
		{"snapshot result", AppendResult(nil, 8, MethodSnapshot, &SnapshotResult{Blob: []byte("tar")}),
			res(8, "snapshot", bson.D{{Key: "blob", Value: bin("tar")}})},
		{"large id", AppendRequest(nil, 1<<40, MethodVersion, nil), req(1<<40, "version", bson.D{})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			diffBytes(t, c.name, c.got, marshal(t, c.want))
		})
	}
}

// The integer and byte types WIRE-NOTES.md fixes, member by member.
func TestMemberTypes(t *testing.T) {
	initReq := AppendRequest(nil, 1, MethodInit, &InitParams{
		Snapshot: []byte{1}, VCPUs: u64(2), MemoryMiB: u64(2048), GPU: ptrBool(true),
		GPUMemoryMiB: u64(1024), DiskGiB: u64(8),
	})
	execReq := AppendRequest(nil, 2, MethodExec, &ExecParams{Cmd: []string{"true"}, TimeoutMS: u64(1)})
	readReq := AppendRequest(nil, 3, MethodRead, &ReadParams{Path: "/f", Offset: u64(1), Len: u64(2)})
	writeReq := AppendRequest(nil, 4, MethodWrite, &WriteParams{Path: "/f", Data: []byte{1}, Offset: u64(1)})
	execRes := AppendResult(nil, 2, MethodExec, &ExecResult{Code: -1, Stdout: []byte("o"), Stderr: []byte("e")})
	readRes := AppendResult(nil, 3, MethodRead, &ReadResult{Data: []byte("d"), Size: 1})
	writeRes := AppendResult(nil, 4, MethodWrite, &WriteResult{Size: 1})
	snapRes := AppendResult(nil, 5, MethodSnapshot, &SnapshotResult{Blob: []byte("b")})
	errRes := AppendError(nil, 6, true, &Error{Code: CodeIOFailed, Message: "ro"})

	cases := []struct {
		doc  []byte
		path []string
		want bsoncore.Type
	}{
		{initReq, []string{"id"}, bsoncore.TypeInt64},
		{initReq, []string{"params", "vcpus"}, bsoncore.TypeInt32},
		{initReq, []string{"params", "memory_mib"}, bsoncore.TypeInt64},
		{initReq, []string{"params", "gpu_memory_mib"}, bsoncore.TypeInt64},
		{initReq, []string{"params", "disk_gib"}, bsoncore.TypeInt64},
		{initReq, []string{"params", "gpu"}, bsoncore.TypeBoolean},
		{initReq, []string{"params", "snapshot"}, bsoncore.TypeBinary},
		{execReq, []string{"params", "cmd"}, bsoncore.TypeArray},
		{execReq, []string{"params", "timeout_ms"}, bsoncore.TypeInt64},
		{readReq, []string{"params", "offset"}, bsoncore.TypeInt64},
		{readReq, []string{"params", "len"}, bsoncore.TypeInt64},
		{writeReq, []string{"params", "offset"}, bsoncore.TypeInt64},
		{writeReq, []string{"params", "data"}, bsoncore.TypeBinary},
		{execRes, []string{"id"}, bsoncore.TypeInt64},
		{execRes, []string{"result", "code"}, bsoncore.TypeInt32},
		{execRes, []string{"result", "stdout"}, bsoncore.TypeBinary},
		{execRes, []string{"result", "stderr"}, bsoncore.TypeBinary},
		{execRes, []string{"result", "truncated"}, bsoncore.TypeBoolean},
		{readRes, []string{"result", "data"}, bsoncore.TypeBinary},
		{readRes, []string{"result", "size"}, bsoncore.TypeInt64},
		{writeRes, []string{"result", "size"}, bsoncore.TypeInt64},
		{snapRes, []string{"result", "blob"}, bsoncore.TypeBinary},
		{errRes, []string{"id"}, bsoncore.TypeInt64},
		{errRes, []string{"error", "code"}, bsoncore.TypeInt64},
	}
	for _, c := range cases {
		v, err := bsoncore.Document(c.doc).LookupErr(c.path...)
		if err != nil {
			t.Errorf("%v: %v", c.path, err)
			continue
		}
		if v.Type != c.want {
			t.Errorf("%v is %s, want %s", c.path, v.Type, c.want)
		}
		if v.Type == bsoncore.TypeBinary {
			if sub, _ := v.Binary(); sub != 0 {
				t.Errorf("%v has Binary subtype %#x, want 0", c.path, sub)
			}
		}
	}
}

// A vcpus beyond Int32 cannot be said on the wire; the encoder clamps rather than wrap to a
// negative count (and the decoder refuses one, see the decode tables).
func TestVCPUsClamped(t *testing.T) {
	doc := AppendRequest(nil, 0, MethodInit, &InitParams{VCPUs: u64(1 << 40)})
	v, err := bsoncore.Document(doc).LookupErr("params", "vcpus")
	if err != nil {
		t.Fatal(err)
	}
	if n, ok := v.Int32OK(); !ok || n != 1<<31-1 {
		t.Errorf("vcpus 1<<40 encodes as %v, want Int32 %d", v, 1<<31-1)
	}
}

// AppendRequest and friends append: whatever was in dst stays, and the document starts
// where dst ended.
func TestAppendKeepsPrefix(t *testing.T) {
	prefix := []byte("PREFIX")
	doc := AppendRequest(append([]byte(nil), prefix...), 2, MethodExec, &ExecParams{Cmd: []string{"ls"}})
	if !bytes.HasPrefix(doc, prefix) {
		t.Fatalf("prefix clobbered: %q", doc[:6])
	}
	diffBytes(t, "after prefix", doc[len(prefix):], execLsFrame[4:])
	if n := binary.LittleEndian.Uint32(doc[len(prefix):]); n != 84 {
		t.Errorf("document length %d, want 84", n)
	}
}

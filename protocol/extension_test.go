package protocol

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// exec's cwd extension (internal/relay, between a server and its executor): a string
// member after the others, present only when set, so a public peer's frames are
// unchanged byte for byte.
func TestExecCwdExtension(t *testing.T) {
	withCwd := AppendRequest(nil, 3, MethodExec, &ExecParams{Cmd: []string{"pwd"}, TimeoutMS: u64(10), Cwd: "/work"})
	diffBytes(t, "exec params with cwd", withCwd, marshal(t, bson.D{
		rpc, E("id", int64(3)), E("method", "exec"),
		E("params", D{E("cmd", A{"pwd"}), E("timeout_ms", int64(10)), E("cwd", "/work")}),
	}))
	res := AppendResult(nil, 3, MethodExec, &ExecResult{Code: 0, Stdout: []byte("/work\n"), Cwd: "/work"})
	diffBytes(t, "exec result with cwd", res, marshal(t, bson.D{
		rpc, E("id", int64(3)), E("method", "exec"),
		E("result", D{E("code", int32(0)), E("stdout", bin("/work\n")), E("stderr", bin("")), E("truncated", false), E("cwd", "/work")}),
	}))

	m := decodeOK(t, withCwd)
	if diff := cmp.Diff(&ExecParams{Cmd: []string{"pwd"}, TimeoutMS: u64(10), Cwd: "/work"}, m.Params); diff != "" {
		t.Errorf("params (-want +got):\n%s", diff)
	}
	m = decodeOK(t, res)
	if diff := cmp.Diff(&ExecResult{Stdout: []byte("/work\n"), Stderr: []byte{}, Cwd: "/work"}, m.Result); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}

	if e := decodeErr(t, execParams(E("cwd", int32(1)))); e.Code != CodeInvalidParams {
		t.Errorf("exec cwd a number: %v", e)
	}
	if e := decodeErr(t, resDoc("exec", D{E("code", int32(0)), E("cwd", true)})); e.Code != CodeInvalidRequest {
		t.Errorf("exec result cwd a bool: %v", e)
	}
}

// SizeHint is room enough that building a frame with a large payload allocates once.
func TestSizeHint(t *testing.T) {
	big := make([]byte, 16<<20)
	for _, c := range []struct {
		name  string
		build func([]byte) []byte
		p     Payload
	}{
		{"exec result", nil, &ExecResult{Code: 1, Stdout: big, Stderr: big[:1000], Truncated: true, Cwd: "/work/some/where"}},
		{"read result", nil, &ReadResult{Data: big, Size: 1 << 40}},
		{"snapshot result", nil, &SnapshotResult{Blob: big}},
		{"write params", func(b []byte) []byte {
			return AppendRequest(b, 1<<40, MethodWrite, &WriteParams{Path: "/work/out/data.bin", Data: big, Offset: u64(1 << 40)})
		}, &WriteParams{Path: "/work/out/data.bin", Data: big, Offset: u64(1 << 40)}},
		{"init params", func(b []byte) []byte {
			return AppendRequest(b, 1<<40, MethodInit, &InitParams{Snapshot: big, Mounts: []Mount{{URL: "file:///srv/project", GuestPath: "/work", ReadOnly: true}}})
		}, &InitParams{Snapshot: big, Mounts: []Mount{{URL: "file:///srv/project", GuestPath: "/work", ReadOnly: true}}}},
		{"version result", nil, &VersionResult{Version: "0.1.0"}},
	} {
		buf := NewFrameBuffer(SizeHint(c.p))
		before := cap(buf)
		var out []byte
		if c.build != nil {
			out = c.build(buf)
		} else {
			out = AppendResult(buf, 1<<40, methodOf(c.p), c.p)
		}
		if &out[0] != &buf[0] || cap(out) != before {
			t.Errorf("%s: a buffer of SizeHint %d grew to %d bytes", c.name, SizeHint(c.p), len(out)-4)
		}
	}
}

func methodOf(p Payload) string {
	switch p.(type) {
	case *ExecResult:
		return MethodExec
	case *ReadResult:
		return MethodRead
	case *SnapshotResult:
		return MethodSnapshot
	}
	return MethodVersion
}

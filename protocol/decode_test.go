package protocol

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Shorthands for building documents with bson.Marshal (never this package's appenders).
type D = bson.D
type A = bson.A

func E(k string, v any) bson.E { return bson.E{Key: k, Value: v} }

var rpc = E("jsonrpc", "2.0")

func reqDoc(id any, method string, params any) []byte {
	return mustMarshal(D{rpc, E("id", id), E("method", method), E("params", params)})
}

func execParams(members ...bson.E) []byte {
	return reqDoc(int64(1), "exec", append(D{E("cmd", A{"ls"})}, members...))
}

func initParams(members ...bson.E) []byte { return reqDoc(int64(1), "init", D(members)) }

func resDoc(method string, result any) []byte {
	return mustMarshal(D{rpc, E("id", int64(4)), E("method", method), E("result", result)})
}

const digest64 = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// raw builds a document whose "params" member is the given bytes, trusted as they are:
// the way to put malformed BSON below the top level.
func withRawParams(params []byte) []byte {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendStringElement(d, "jsonrpc", "2.0")
	d = bsoncore.AppendInt64Element(d, "id", 1)
	d = bsoncore.AppendStringElement(d, "method", "exec")
	d = bsoncore.AppendHeader(d, bsoncore.TypeEmbeddedDocument, "params")
	d = append(d, params...)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

func nested(depth int) []byte {
	v := any(D{})
	for range depth {
		v = D{E("x", v)}
	}
	return reqDoc(int64(1), "version", v)
}

// Every rule of PROTOCOL.md's "What is refused when reading", and the code it is refused
// with; hasID says whether the refusal carries the id, which it must whenever it could be
// read, so that the error answers the request it refuses.
type refusalCase struct {
	name  string
	doc   []byte
	code  Code
	id    int64
	hasID bool
}

func refusalCases() []refusalCase {
	valid := execParams()
	return []refusalCase{
		// -32700: not BSON at all, or not exactly one well-formed document.
		{"no bytes", nil, CodeParseError, 0, false},
		{"text", []byte(`{"jsonrpc":"2.0","id":1,"method":"version"}`), CodeParseError, 0, false},
		{"four bytes", []byte{5, 0, 0, 0}, CodeParseError, 0, false},
		{"truncated", valid[:len(valid)-1], CodeParseError, 0, false},
		{"length says more", append([]byte{byte(len(valid) + 1)}, valid[1:]...), CodeParseError, 0, false},
		{"length says less", append([]byte{byte(len(valid) - 1)}, valid[1:]...), CodeParseError, 0, false},
		{"negative length", []byte{0xff, 0xff, 0xff, 0xff, 0}, CodeParseError, 0, false},
		{"trailing bytes", append(append([]byte(nil), valid...), 0), CodeParseError, 0, false},
		{"no terminator", append(append([]byte(nil), valid[:len(valid)-1]...), 1), CodeParseError, 0, false},
		{"unknown element type", unhex("0c000000 99 7800 01000000 00"), CodeParseError, 0, false},
		{"nested element overruns", withRawParams(unhex("0b000000 10 7800 ffffff 00")), CodeParseError, 0, false},
		{"nested document too short", withRawParams(unhex("04000000")), CodeParseError, 0, false},
		{"nested string unterminated", withRawParams(unhex("0f000000 02 7800 03000000 6c7378 00")), CodeParseError, 0, false},
		{"nested string zero length", withRawParams(unhex("0c000000 02 7800 00000000 00")), CodeParseError, 0, false},
		{"nested too deep", nested(maxDepth + 1), CodeParseError, 0, false},

		// jsonrpc missing, or not exactly "2.0".
		{"jsonrpc missing", mustMarshal(D{E("id", int64(3)), E("method", "version")}), CodeInvalidRequest, 3, true},
		{"jsonrpc 1.0", mustMarshal(D{E("jsonrpc", "1.0"), E("id", int64(3)), E("method", "version")}), CodeInvalidRequest, 3, true},
		{"jsonrpc 2", mustMarshal(D{E("jsonrpc", "2"), E("id", int64(3)), E("method", "version")}), CodeInvalidRequest, 3, true},
		{"jsonrpc number", mustMarshal(D{E("jsonrpc", 2.0), E("id", int64(3)), E("method", "version")}), CodeInvalidRequest, 3, true},
		{"jsonrpc null", mustMarshal(D{E("jsonrpc", nil), E("id", int64(3)), E("method", "version")}), CodeInvalidRequest, 3, true},
		{"jsonrpc on a notification", mustMarshal(D{E("jsonrpc", "2.1"), E("method", "stop")}), CodeInvalidRequest, 0, false},

		// id that is not an integer: refused, and without an id to echo.
		{"id string", reqDoc("3", "version", D{}), CodeInvalidRequest, 0, false},
		{"id fraction", reqDoc(2.5, "version", D{}), CodeInvalidRequest, 0, false},
		{"id NaN", reqDoc(math.NaN(), "version", D{}), CodeInvalidRequest, 0, false},
		{"id beyond 2^53 as double", reqDoc(float64(1<<60), "version", D{}), CodeInvalidRequest, 0, false},
		{"id bool", reqDoc(true, "version", D{}), CodeInvalidRequest, 0, false},

		// method that is not a string, or not a method.
		{"method number", mustMarshal(D{rpc, E("id", int64(3)), E("method", int32(1))}), CodeInvalidRequest, 3, true},
		{"unknown method", reqDoc(int64(9), "frobnicate", D{}), CodeMethodNotFound, 9, true},
		{"unknown method Int32 id", reqDoc(int32(9), "frobnicate", D{}), CodeMethodNotFound, 9, true},
		{"method case", reqDoc(int64(9), "Exec", D{}), CodeMethodNotFound, 9, true},
		{"empty method", reqDoc(int64(9), "", D{}), CodeMethodNotFound, 9, true},
		{"unknown method without id", mustMarshal(D{rpc, E("method", "frobnicate")}), CodeMethodNotFound, 0, false},

		// a request with no id; a notification with one.
		{"exec without id", mustMarshal(D{rpc, E("method", "exec"), E("params", D{E("cmd", A{"ls"})})}), CodeInvalidRequest, 0, false},
		{"exec with null id", reqDoc(nil, "exec", D{E("cmd", A{"ls"})}), CodeInvalidRequest, 0, false},
		{"version without id", mustMarshal(D{rpc, E("method", "version")}), CodeInvalidRequest, 0, false},
		{"start with id", mustMarshal(D{rpc, E("id", int64(7)), E("method", "start")}), CodeInvalidRequest, 7, true},
		{"stop with id", mustMarshal(D{rpc, E("id", int64(7)), E("method", "stop")}), CodeInvalidRequest, 7, true},
		{"quit with Int32 id", mustMarshal(D{rpc, E("id", int32(7)), E("method", "quit")}), CodeInvalidRequest, 7, true},

		// result and error together, or neither.
		{"result and error", mustMarshal(D{rpc, E("id", int64(4)), E("result", D{}), E("error", D{E("code", int64(-32603)), E("message", "x")})}), CodeInvalidRequest, 4, true},
		{"result and error with method", mustMarshal(D{rpc, E("id", int64(4)), E("method", "version"), E("result", D{E("version", "1")}), E("error", D{E("code", int64(-32603))})}), CodeInvalidRequest, 4, true},
		{"neither", mustMarshal(D{rpc, E("id", int64(4))}), CodeInvalidRequest, 4, true},
		{"neither, params only", mustMarshal(D{rpc, E("id", int64(4)), E("params", D{})}), CodeInvalidRequest, 4, true},
		{"nothing but jsonrpc", mustMarshal(D{rpc}), CodeInvalidRequest, 0, false},

		// a result with no method to type it, or one that is not what it answers with.
		{"result without method", mustMarshal(D{rpc, E("id", int64(4)), E("result", D{E("version", "1")})}), CodeInvalidRequest, 4, true},
		{"result without id", mustMarshal(D{rpc, E("method", "version"), E("result", D{E("version", "1")})}), CodeInvalidRequest, 0, false},
		{"result with null id", mustMarshal(D{rpc, E("id", nil), E("method", "version"), E("result", D{E("version", "1")})}), CodeInvalidRequest, 0, false},
		{"result for unknown method", resDoc("frobnicate", D{}), CodeInvalidRequest, 4, true},
		{"result for a notification", resDoc("stop", D{}), CodeInvalidRequest, 4, true},
		{"result not a document", resDoc("version", "0.1"), CodeInvalidRequest, 4, true},
		{"result an array", resDoc("version", A{"0.1"}), CodeInvalidRequest, 4, true},
		{"version result empty", resDoc("version", D{}), CodeInvalidRequest, 4, true},
		{"version result number", resDoc("version", D{E("version", int32(1))}), CodeInvalidRequest, 4, true},
		{"build_image result no digest", resDoc("build_image", D{E("ref", "a:b")}), CodeInvalidRequest, 4, true},
		{"build_image result no ref", resDoc("build_image", D{E("digest", digest64)}), CodeInvalidRequest, 4, true},
		{"list_images result no images", resDoc("list_images", D{}), CodeInvalidRequest, 4, true},
		{"list_images result strings", resDoc("list_images", D{E("images", A{"x"})}), CodeInvalidRequest, 4, true},
		{"list_images result entry without digest", resDoc("list_images", D{E("images", A{D{E("refs", A{"a:b"})}})}), CodeInvalidRequest, 4, true},
		{"list_images result refs not strings", resDoc("list_images", D{E("images", A{D{E("digest", digest64), E("refs", A{int32(1)})}})}), CodeInvalidRequest, 4, true},
		{"init result cwd number", resDoc("init", D{E("cwd", int32(1))}), CodeInvalidRequest, 4, true},
		{"exec result without code", resDoc("exec", D{E("stdout", bin("")), E("stderr", bin("")), E("truncated", false)}), CodeInvalidRequest, 4, true},
		{"exec result code string", resDoc("exec", D{E("code", "0")}), CodeInvalidRequest, 4, true},
		{"exec result code beyond int32", resDoc("exec", D{E("code", int64(1)<<40)}), CodeInvalidRequest, 4, true},
		{"exec result stdout base64 string", resDoc("exec", D{E("code", int32(0)), E("stdout", "aGkK")}), CodeInvalidRequest, 4, true},
		{"exec result truncated number", resDoc("exec", D{E("code", int32(0)), E("truncated", int32(1))}), CodeInvalidRequest, 4, true},
		{"read result without size", resDoc("read", D{E("data", bin("x"))}), CodeInvalidRequest, 4, true},
		{"read result negative size", resDoc("read", D{E("data", bin("x")), E("size", int64(-1))}), CodeInvalidRequest, 4, true},
		{"read result data string", resDoc("read", D{E("data", "x"), E("size", int64(1))}), CodeInvalidRequest, 4, true},
		{"write result without size", resDoc("write", D{}), CodeInvalidRequest, 4, true},
		{"write result size string", resDoc("write", D{E("size", "3")}), CodeInvalidRequest, 4, true},
		{"snapshot result without blob", resDoc("snapshot", D{}), CodeInvalidRequest, 4, true},
		{"snapshot result blob string", resDoc("snapshot", D{E("blob", "x")}), CodeInvalidRequest, 4, true},

		// params and a result together; method together with error.
		{"params and result", mustMarshal(D{rpc, E("id", int64(4)), E("method", "version"), E("params", D{}), E("result", D{E("version", "1")})}), CodeInvalidRequest, 4, true},
		{"params and error", mustMarshal(D{rpc, E("id", int64(4)), E("params", D{}), E("error", D{E("code", int64(-32603)), E("message", "x")})}), CodeInvalidRequest, 4, true},
		{"method and error", mustMarshal(D{rpc, E("id", int64(4)), E("method", "exec"), E("error", D{E("code", int64(-32000)), E("message", "killed after 5000ms")})}), CodeInvalidRequest, 4, true},

		// an error that is not one.
		{"error not a document", mustMarshal(D{rpc, E("id", int64(4)), E("error", "boom")}), CodeInvalidRequest, 4, true},
		{"error without code", mustMarshal(D{rpc, E("id", int64(4)), E("error", D{E("message", "x")})}), CodeInvalidRequest, 4, true},
		{"error code string", mustMarshal(D{rpc, E("id", int64(4)), E("error", D{E("code", "-32000"), E("message", "x")})}), CodeInvalidRequest, 4, true},
		{"error message number", mustMarshal(D{rpc, E("id", int64(4)), E("error", D{E("code", int64(-32000)), E("message", int32(1))})}), CodeInvalidRequest, 4, true},

		// params of the wrong type.
		{"params array", reqDoc(int64(5), "exec", A{A{"ls"}}), CodeInvalidParams, 5, true},
		{"params string", reqDoc(int64(5), "version", "x"), CodeInvalidParams, 5, true},
		{"params number", reqDoc(int64(5), "snapshot", int32(0)), CodeInvalidParams, 5, true},
		{"params binary", reqDoc(int64(5), "init", bin("")), CodeInvalidParams, 5, true},

		// params of the wrong shape, method by method.
		{"exec without params", mustMarshal(D{rpc, E("id", int64(5)), E("method", "exec")}), CodeInvalidParams, 5, true},
		{"exec cmd missing", reqDoc(int64(5), "exec", D{}), CodeInvalidParams, 5, true},
		{"exec cmd empty", reqDoc(int64(5), "exec", D{E("cmd", A{})}), CodeInvalidParams, 5, true},
		{"exec cmd string", reqDoc(int64(5), "exec", D{E("cmd", "ls")}), CodeInvalidParams, 5, true},
		{"exec cmd of numbers", reqDoc(int64(5), "exec", D{E("cmd", A{int32(1)})}), CodeInvalidParams, 5, true},
		{"exec cmd a document", reqDoc(int64(5), "exec", D{E("cmd", D{E("0", "ls")})}), CodeInvalidParams, 5, true},
		{"exec timeout string", execParams(E("timeout_ms", "5000")), CodeInvalidParams, 1, true},
		{"exec timeout negative", execParams(E("timeout_ms", int64(-1))), CodeInvalidParams, 1, true},
		{"exec timeout fraction", execParams(E("timeout_ms", 1.5)), CodeInvalidParams, 1, true},
		{"exec timeout infinite", execParams(E("timeout_ms", math.Inf(1))), CodeInvalidParams, 1, true},
		{"exec timeout zero", execParams(E("timeout_ms", int64(0))), CodeInvalidParams, 1, true},
		{"read path missing", reqDoc(int64(5), "read", D{E("offset", int64(0))}), CodeInvalidParams, 5, true},
		{"read path empty", reqDoc(int64(5), "read", D{E("path", "")}), CodeInvalidParams, 5, true},
		{"read path number", reqDoc(int64(5), "read", D{E("path", int32(1))}), CodeInvalidParams, 5, true},
		{"read offset negative", reqDoc(int64(5), "read", D{E("path", "/f"), E("offset", int32(-1))}), CodeInvalidParams, 5, true},
		{"read len string", reqDoc(int64(5), "read", D{E("path", "/f"), E("len", "1")}), CodeInvalidParams, 5, true},
		{"write path missing", reqDoc(int64(5), "write", D{E("data", bin("x"))}), CodeInvalidParams, 5, true},
		{"write data base64 string", reqDoc(int64(5), "write", D{E("path", "/f"), E("data", "aGkK")}), CodeInvalidParams, 5, true},
		{"write offset bool", reqDoc(int64(5), "write", D{E("path", "/f"), E("offset", true)}), CodeInvalidParams, 5, true},
		{"init vcpus string", initParams(E("vcpus", "4")), CodeInvalidParams, 1, true},
		{"init vcpus negative", initParams(E("vcpus", int32(-1))), CodeInvalidParams, 1, true},
		{"init vcpus beyond int32", initParams(E("vcpus", int64(1)<<40)), CodeInvalidParams, 1, true},
		{"init memory fraction", initParams(E("memory_mib", 1.5)), CodeInvalidParams, 1, true},
		{"init disk negative", initParams(E("disk_gib", int64(-8))), CodeInvalidParams, 1, true},
		{"init gpu_memory string", initParams(E("gpu_memory_mib", "1")), CodeInvalidParams, 1, true},
		{"init network string", initParams(E("network", "off")), CodeInvalidParams, 1, true},
		{"init gpu number", initParams(E("gpu", int32(1))), CodeInvalidParams, 1, true},
		{"init ports string", initParams(E("ports", "8080:80")), CodeInvalidParams, 1, true},
		{"init port malformed", initParams(E("ports", A{"8080:80", "80"})), CodeInvalidParams, 1, true},
		{"init port zero", initParams(E("ports", A{"0:80"})), CodeInvalidParams, 1, true},
		{"init port number", initParams(E("ports", A{int32(80)})), CodeInvalidParams, 1, true},
		{"init mounts string", initParams(E("mounts", "file:///a:/w")), CodeInvalidParams, 1, true},
		{"init mount without scheme", initParams(E("mounts", A{"/srv:/work"})), CodeInvalidParams, 1, true},
		{"init mount relative", initParams(E("mounts", A{"file:///srv:work"})), CodeInvalidParams, 1, true},
		{"init mount number", initParams(E("mounts", A{int32(1)})), CodeInvalidParams, 1, true},
		{"init snapshot string", initParams(E("snapshot", "tar")), CodeInvalidParams, 1, true},
		{"init snapshot byte 256", initParams(E("snapshot", A{int32(1), int32(256)})), CodeInvalidParams, 1, true},
		{"init snapshot byte negative", initParams(E("snapshot", A{int32(-1)})), CodeInvalidParams, 1, true},
		{"init snapshot byte double", initParams(E("snapshot", A{1.0})), CodeInvalidParams, 1, true},
		{"init snapshot byte string", initParams(E("snapshot", A{"a"})), CodeInvalidParams, 1, true},
		{"init image string", initParams(E("image", "alpine")), CodeInvalidParams, 1, true},
		{"init image type unknown", initParams(E("image", D{E("type", "oci")})), CodeInvalidParams, 1, true},
		{"init image type missing", initParams(E("image", D{E("ref", "a:b")})), CodeInvalidParams, 1, true},
		{"init image ref empty", initParams(E("image", D{E("type", "ref"), E("ref", "")})), CodeInvalidParams, 1, true},
		{"init image digest malformed", initParams(E("image", D{E("type", "digest"), E("digest", "sha256:xyz")})), CodeInvalidParams, 1, true},
		{"init image digest uppercase", initParams(E("image", D{E("type", "digest"), E("digest", strings.ToUpper(digest64))})), CodeInvalidParams, 1, true},
		{"init image recipe missing", initParams(E("image", D{E("type", "recipe")})), CodeInvalidParams, 1, true},
		{"init image recipe bad", initParams(E("image", D{E("type", "recipe"), E("recipe", D{E("v", int32(1))})})), CodeInvalidParams, 1, true},
		{"build_image without recipe", reqDoc(int64(5), "build_image", D{E("ref", "a:b")}), CodeInvalidParams, 5, true},
		{"build_image recipe string", reqDoc(int64(5), "build_image", D{E("recipe", "FROM alpine")}), CodeInvalidParams, 5, true},
		{"recipe v missing", buildDoc(D{E("base", "alpine"), E("steps", A{})}), CodeInvalidParams, 5, true},
		{"recipe v 2", buildDoc(D{E("v", int32(2)), E("base", "alpine"), E("steps", A{})}), CodeInvalidParams, 5, true},
		{"recipe v string", buildDoc(D{E("v", "1"), E("base", "alpine")}), CodeInvalidParams, 5, true},
		{"recipe base missing", buildDoc(D{E("v", int32(1)), E("steps", A{})}), CodeInvalidParams, 5, true},
		{"recipe base empty", buildDoc(D{E("v", int32(1)), E("base", "")}), CodeInvalidParams, 5, true},
		{"recipe steps not array", buildDoc(D{E("v", int32(1)), E("base", "alpine"), E("steps", D{})}), CodeInvalidParams, 5, true},
		{"recipe step string", recipeWith(A{"RUN true"}), CodeInvalidParams, 5, true},
		{"recipe step empty", recipeWith(A{D{}}), CodeInvalidParams, 5, true},
		{"recipe step two members", recipeWith(A{D{E("run", "true"), E("workdir", "/")}}), CodeInvalidParams, 5, true},
		{"recipe step unknown", recipeWith(A{D{E("frobnicate", "x")}}), CodeInvalidParams, 5, true},
		{"recipe run empty", recipeWith(A{D{E("run", "  ")}}), CodeInvalidParams, 5, true},
		{"recipe run number", recipeWith(A{D{E("run", int32(1))}}), CodeInvalidParams, 5, true},
		{"recipe copy src absolute", recipeWith(A{D{E("copy", D{E("src", "/etc"), E("dst", "/x")})}}), CodeInvalidParams, 5, true},
		{"recipe copy src dotdot", recipeWith(A{D{E("copy", D{E("src", "a/../../x"), E("dst", "/x")})}}), CodeInvalidParams, 5, true},
		{"recipe copy dst relative", recipeWith(A{D{E("copy", D{E("src", "a"), E("dst", "x")})}}), CodeInvalidParams, 5, true},
		{"recipe copy dst missing", recipeWith(A{D{E("copy", D{E("src", "a")})}}), CodeInvalidParams, 5, true},
		{"recipe copy string", recipeWith(A{D{E("copy", "a /x")}}), CodeInvalidParams, 5, true},
		{"recipe env key empty", recipeWith(A{D{E("env", D{E("key", ""), E("value", "v")})}}), CodeInvalidParams, 5, true},
		{"recipe env key with =", recipeWith(A{D{E("env", D{E("key", "A=B"), E("value", "v")})}}), CodeInvalidParams, 5, true},
		{"recipe env value missing", recipeWith(A{D{E("env", D{E("key", "A")})}}), CodeInvalidParams, 5, true},
		{"recipe workdir relative", recipeWith(A{D{E("workdir", "app")}}), CodeInvalidParams, 5, true},
		{"build_image ref number", reqDoc(int64(5), "build_image", D{E("recipe", D{E("v", int32(1)), E("base", "alpine")}), E("ref", int32(1))}), CodeInvalidParams, 5, true},
		{"remove_image without image", reqDoc(int64(5), "remove_image", D{}), CodeInvalidParams, 5, true},
		{"remove_image image string", reqDoc(int64(5), "remove_image", D{E("image", "a:b")}), CodeInvalidParams, 5, true},
		{"remove_image ref missing", reqDoc(int64(5), "remove_image", D{E("image", D{E("type", "ref")})}), CodeInvalidParams, 5, true},
	}
}

func TestDecodeRefusals(t *testing.T) {
	for _, c := range refusalCases() {
		t.Run(c.name, func(t *testing.T) {
			e := decodeErr(t, c.doc)
			if e.Code != c.code {
				t.Errorf("code %d (%s), want %d (%s): %s", e.Code, e.Code, c.code, c.code, e.Message)
			}
			if e.HasID != c.hasID || e.ID != c.id {
				t.Errorf("refusal carries id (%d, %v), want (%d, %v)", e.ID, e.HasID, c.id, c.hasID)
			}
			if e.Message == "" {
				t.Error("refusal has no message")
			}
		})
	}
}

func buildDoc(recipe D) []byte { return reqDoc(int64(5), "build_image", D{E("recipe", recipe)}) }

func recipeWith(steps A) []byte {
	return buildDoc(D{E("v", int32(1)), E("base", "alpine"), E("steps", steps)})
}

// What a reader must take although it is not what this package writes.
type acceptCase struct {
	name string
	doc  []byte
	want *Message
}

func acceptCases() []acceptCase {
	execLs := &ExecParams{Cmd: []string{"ls"}}
	req := func(id int64, method string, params any) *Message {
		return &Message{Kind: KindRequest, ID: id, HasID: true, Method: method, Params: params}
	}
	res := func(method string, result any) *Message {
		return &Message{Kind: KindResponse, ID: 4, HasID: true, Method: method, Result: result}
	}
	return []acceptCase{
		// ids: Int32 or Int64, or a Double holding an integer.
		{"id int64", reqDoc(int64(2), "exec", D{E("cmd", A{"ls"})}), req(2, "exec", execLs)},
		{"id int32", reqDoc(int32(2), "exec", D{E("cmd", A{"ls"})}), req(2, "exec", execLs)},
		{"id double", reqDoc(2.0, "exec", D{E("cmd", A{"ls"})}), req(2, "exec", execLs)},
		{"id zero", reqDoc(int64(0), "version", D{}), req(0, "version", Empty{})},
		{"id negative", reqDoc(int64(-1), "version", D{}), req(-1, "version", Empty{})},
		{"id max int64", reqDoc(int64(math.MaxInt64), "version", D{}), req(math.MaxInt64, "version", Empty{})},

		// integer members in either width, or as an integral Double.
		{"timeout int32", execParams(E("timeout_ms", int32(5000))), req(1, "exec", &ExecParams{Cmd: []string{"ls"}, TimeoutMS: u64(5000)})},
		{"timeout int64", execParams(E("timeout_ms", int64(5000))), req(1, "exec", &ExecParams{Cmd: []string{"ls"}, TimeoutMS: u64(5000)})},
		{"timeout double", execParams(E("timeout_ms", 5000.0)), req(1, "exec", &ExecParams{Cmd: []string{"ls"}, TimeoutMS: u64(5000)})},
		{"timeout null", execParams(E("timeout_ms", nil)), req(1, "exec", execLs)},
		{"vcpus int64", initParams(E("vcpus", int64(8))), req(1, "init", &InitParams{VCPUs: u64(8)})},
		{"vcpus double", initParams(E("vcpus", 8.0)), req(1, "init", &InitParams{VCPUs: u64(8)})},
		{"vcpus max int32", initParams(E("vcpus", int64(math.MaxInt32))), req(1, "init", &InitParams{VCPUs: u64(math.MaxInt32)})},
		{"memory int32", initParams(E("memory_mib", int32(2048))), req(1, "init", &InitParams{MemoryMiB: u64(2048)})},
		{"read offset/len int32", reqDoc(int64(1), "read", D{E("path", "/f"), E("offset", int32(1)), E("len", int32(2))}),
			req(1, "read", &ReadParams{Path: "/f", Offset: u64(1), Len: u64(2)})},
		{"write offset double", reqDoc(int64(1), "write", D{E("path", "/f"), E("offset", 3.0)}),
			req(1, "write", &WriteParams{Path: "/f", Offset: u64(3)})},
		{"exec code int64", resDoc("exec", D{E("code", int64(-1)), E("stdout", bin("")), E("stderr", bin("")), E("truncated", false)}),
			res("exec", &ExecResult{Code: -1, Stdout: []byte{}, Stderr: []byte{}})},
		{"exec code double", resDoc("exec", D{E("code", 2.0), E("stdout", bin("o")), E("stderr", bin("e")), E("truncated", true)}),
			res("exec", &ExecResult{Code: 2, Stdout: []byte("o"), Stderr: []byte("e"), Truncated: true})},
		{"exec result minimal", resDoc("exec", D{E("code", int32(0))}), res("exec", &ExecResult{})},
		{"read size int32", resDoc("read", D{E("data", bin("d")), E("size", int32(1))}), res("read", &ReadResult{Data: []byte("d"), Size: 1})},
		{"write size double", resDoc("write", D{E("size", 3.0)}), res("write", &WriteResult{Size: 3})},

		// null reads as absent; missing params reads as {}.
		{"notification null id", mustMarshal(D{rpc, E("id", nil), E("method", "stop")}),
			&Message{Kind: KindNotification, Method: "stop", Params: Empty{}}},
		{"version without params", mustMarshal(D{rpc, E("id", int64(1)), E("method", "version")}), req(1, "version", Empty{})},
		{"version null params", reqDoc(int64(1), "version", nil), req(1, "version", Empty{})},
		{"snapshot without params", mustMarshal(D{rpc, E("id", int64(1)), E("method", "snapshot")}), req(1, "snapshot", Empty{})},
		{"list_images without params", mustMarshal(D{rpc, E("id", int64(1)), E("method", "list_images")}), req(1, "list_images", Empty{})},
		{"init without params", mustMarshal(D{rpc, E("id", int64(1)), E("method", "init")}), req(1, "init", &InitParams{})},
		{"init null params", reqDoc(int64(1), "init", nil), req(1, "init", &InitParams{})},
		{"init null members", initParams(E("network", nil), E("vcpus", nil), E("mounts", nil), E("image", nil), E("snapshot", nil)), req(1, "init", &InitParams{})},

		// member order is free.
		{"params before method", mustMarshal(D{E("params", D{E("cmd", A{"ls"})}), E("method", "exec"), E("id", int64(2)), rpc}), req(2, "exec", execLs)},
		{"result before method", mustMarshal(D{E("result", D{E("size", int64(3))}), E("id", int64(4)), E("method", "write"), rpc}), res("write", &WriteResult{Size: 3})},
		{"params members reordered", reqDoc(int64(1), "read", D{E("len", int64(2)), E("offset", int64(1)), E("path", "/f")}),
			req(1, "read", &ReadParams{Path: "/f", Offset: u64(1), Len: u64(2)})},
		{"recipe members reordered", reqDoc(int64(1), "build_image", D{E("ref", "t:1"), E("recipe", D{E("steps", A{D{E("copy", D{E("dst", "/x"), E("src", "a")})}}), E("base", "alpine"), E("v", int64(1))})}),
			req(1, "build_image", &BuildImageParams{Ref: "t:1", Recipe: &Recipe{Base: "alpine", Steps: []Step{{Kind: StepCopy, Src: "a", Dst: "/x"}}}})},

		// unknown members are ignored, at every level.
		{"trace_id on a request", mustMarshal(D{rpc, E("id", int64(2)), E("trace_id", "abc"), E("method", "exec"), E("params", D{E("cmd", A{"ls"})})}), req(2, "exec", execLs)},
		{"unknown member in params", execParams(E("trace_id", "/elsewhere"), E("env", D{E("A", "B")})), req(1, "exec", execLs)},
		{"trace_id on a notification", mustMarshal(D{rpc, E("method", "quit"), E("trace_id", int64(1))}), &Message{Kind: KindNotification, Method: "quit", Params: Empty{}}},
		{"params on a notification", mustMarshal(D{rpc, E("method", "start"), E("params", D{})}), &Message{Kind: KindNotification, Method: "start", Params: Empty{}}},
		{"unknown member in result", resDoc("init", D{E("cwd", "/work"), E("booted", true)}), res("init", &InitResult{Cwd: "/work"})},
		{"unknown member in image entry", resDoc("list_images", D{E("images", A{D{E("digest", digest64), E("size", int64(1))}})}),
			res("list_images", &ListImagesResult{Images: []ImageEntry{{Digest: digest64}}})},
		{"trace_id on an error, and data", mustMarshal(D{rpc, E("id", int64(4)), E("trace_id", "x"), E("error", D{E("code", int64(-32005)), E("message", "no such file"), E("data", D{E("path", "/f")})})}),
			&Message{Kind: KindResponse, ID: 4, HasID: true, Err: &Error{Code: CodeNotFound, Message: "no such file"}}},
		{"error code int32", mustMarshal(D{rpc, E("id", int64(4)), E("error", D{E("code", int32(-32000)), E("message", "killed after 5000ms")})}),
			&Message{Kind: KindResponse, ID: 4, HasID: true, Err: &Error{Code: CodeTimedOut, Message: "killed after 5000ms"}}},
		{"error with null id", mustMarshal(D{rpc, E("id", nil), E("error", D{E("code", int64(-32700)), E("message", "not BSON")})}),
			&Message{Kind: KindResponse, Err: &Error{Code: CodeParseError, Message: "not BSON"}}},
		{"error without id", mustMarshal(D{rpc, E("error", D{E("code", int64(-32600)), E("message", "x")})}),
			&Message{Kind: KindResponse, Err: &Error{Code: CodeInvalidRequest, Message: "x"}}},
		{"error code unknown to us", mustMarshal(D{rpc, E("id", int64(4)), E("error", D{E("code", int64(-31999)), E("message", "new")})}),
			&Message{Kind: KindResponse, ID: 4, HasID: true, Err: &Error{Code: -31999, Message: "new"}}},

		// init.snapshot as Binary, or as an array of small integers.
		{"snapshot binary", initParams(E("snapshot", bson.Binary{Data: []byte{0, 1, 255}})), req(1, "init", &InitParams{Snapshot: []byte{0, 1, 255}})},
		{"snapshot int32 array", initParams(E("snapshot", A{int32(0), int32(1), int32(255)})), req(1, "init", &InitParams{Snapshot: []byte{0, 1, 255}})},
		{"snapshot int64 array", initParams(E("snapshot", A{int64(0), int64(1), int64(255)})), req(1, "init", &InitParams{Snapshot: []byte{0, 1, 255}})},
		{"snapshot empty array", initParams(E("snapshot", A{})), req(1, "init", &InitParams{Snapshot: []byte{}})},

		// a nesting as deep as the limit allows still reads.
		{"nested to the limit", nested(maxDepth - 1), req(1, "version", Empty{})},
	}
}

func TestDecodeAccepts(t *testing.T) {
	for _, c := range acceptCases() {
		t.Run(c.name, func(t *testing.T) {
			got := decodeOK(t, c.doc)
			if diff := cmp.Diff(c.want, got, cmpOpts...); diff != "" {
				t.Errorf("Decode (-want +got):\n%s", diff)
			}
		})
	}
}

// The snapshot's two spellings are the same bytes, and an empty Binary is present-but-
// empty (a snapshot of nothing), not absent.
func TestDecodeSnapshotSpellings(t *testing.T) {
	tar := []byte("ustar\x00\x00\xff")
	arr := A{}
	for _, b := range tar {
		arr = append(arr, int32(b))
	}
	a := decodeOK(t, initParams(E("snapshot", bson.Binary{Data: tar}))).Params.(*InitParams)
	b := decodeOK(t, initParams(E("snapshot", arr))).Params.(*InitParams)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("Binary and array spellings differ (-binary +array):\n%s", diff)
	}
	empty := decodeOK(t, initParams(E("snapshot", bson.Binary{}))).Params.(*InitParams)
	if empty.Snapshot == nil {
		t.Error("an empty snapshot Binary reads as no snapshot")
	}
	absent := decodeOK(t, initParams()).Params.(*InitParams)
	if absent.Snapshot != nil {
		t.Error("no snapshot member reads as a snapshot")
	}
}

// Typed params for all twelve methods, as upstream peers write them (bson.Marshal, not
// this package), against go-cmp.
func TestDecodeParamsAllMethods(t *testing.T) {
	recipe := D{E("v", int32(1)), E("base", "alpine:3.20"), E("steps", A{
		D{E("run", "cd '/' && apk add --no-cache jq")},
		D{E("copy", D{E("src", "bin/tool"), E("dst", "/usr/local/bin/tool")})},
		D{E("env", D{E("key", "LANG"), E("value", "C.UTF-8")})},
		D{E("workdir", "/src")},
	})}
	wantRecipe := &Recipe{Base: "alpine:3.20", Steps: []Step{
		{Kind: StepRun, Run: "cd '/' && apk add --no-cache jq"},
		{Kind: StepCopy, Src: "bin/tool", Dst: "/usr/local/bin/tool"},
		{Kind: StepEnv, Key: "LANG", Value: "C.UTF-8"},
		{Kind: StepWorkdir, Workdir: "/src"},
	}}
	cases := []struct {
		method string
		doc    []byte
		want   *Message
	}{
		{"version", reqDoc(int64(0), "version", D{}),
			&Message{Kind: KindRequest, ID: 0, HasID: true, Method: "version", Params: Empty{}}},
		{"build_image", reqDoc(int64(1), "build_image", D{E("recipe", recipe), E("ref", "tools:1")}),
			&Message{Kind: KindRequest, ID: 1, HasID: true, Method: "build_image", Params: &BuildImageParams{Recipe: wantRecipe, Ref: "tools:1"}}},
		{"remove_image", reqDoc(int64(2), "remove_image", D{E("image", D{E("type", "digest"), E("digest", digest64)})}),
			&Message{Kind: KindRequest, ID: 2, HasID: true, Method: "remove_image", Params: &RemoveImageParams{Image: &ImageSource{Type: ImageDigest, Digest: digest64}}}},
		{"list_images", reqDoc(int64(3), "list_images", D{}),
			&Message{Kind: KindRequest, ID: 3, HasID: true, Method: "list_images", Params: Empty{}}},
		{"init", reqDoc(int64(4), "init", D{
			E("image", D{E("type", "recipe"), E("recipe", recipe)}),
			E("snapshot", bson.Binary{Data: []byte("layer")}),
			E("network", false),
			E("ports", A{"8080:80", "5901:5900"}),
			E("vcpus", int32(4)),
			E("memory_mib", int64(4096)),
			E("gpu", true),
			E("gpu_memory_mib", int64(8192)),
			E("disk_gib", int64(32)),
			E("mounts", A{"file:///srv/project:/work:ro", "file:///srv/out:/work/out", "https://example.com:8080/share:/work/in:ro"}),
		}), &Message{Kind: KindRequest, ID: 4, HasID: true, Method: "init", Params: &InitParams{
			Image:        &ImageSource{Type: ImageRecipe, Recipe: wantRecipe},
			Snapshot:     []byte("layer"),
			Network:      ptrBool(false),
			Ports:        []Port{{Host: 8080, Guest: 80}, {Host: 5901, Guest: 5900}},
			VCPUs:        u64(4),
			MemoryMiB:    u64(4096),
			GPU:          ptrBool(true),
			GPUMemoryMiB: u64(8192),
			DiskGiB:      u64(32),
			Mounts: []Mount{
				{URL: "file:///srv/project", GuestPath: "/work", ReadOnly: true},
				{URL: "file:///srv/out", GuestPath: "/work/out"},
				{URL: "https://example.com:8080/share", GuestPath: "/work/in", ReadOnly: true},
			},
		}}},
		{"init ref image", reqDoc(int64(4), "init", D{E("image", D{E("type", "ref"), E("ref", "tools:1")})}),
			&Message{Kind: KindRequest, ID: 4, HasID: true, Method: "init", Params: &InitParams{Image: &ImageSource{Type: ImageRef, Ref: "tools:1"}}}},
		{"exec", reqDoc(int64(5), "exec", D{E("cmd", A{"sh", "-c", "echo hi"}), E("timeout_ms", int64(5000))}),
			&Message{Kind: KindRequest, ID: 5, HasID: true, Method: "exec", Params: &ExecParams{Cmd: []string{"sh", "-c", "echo hi"}, TimeoutMS: u64(5000)}}},
		{"read", reqDoc(int64(6), "read", D{E("path", "/work/out/log.txt"), E("offset", int64(4096)), E("len", int64(1024))}),
			&Message{Kind: KindRequest, ID: 6, HasID: true, Method: "read", Params: &ReadParams{Path: "/work/out/log.txt", Offset: u64(4096), Len: u64(1024)}}},
		{"write", reqDoc(int64(7), "write", D{E("path", "/work/in/data"), E("data", bin("hi\n")), E("offset", int64(0))}),
			&Message{Kind: KindRequest, ID: 7, HasID: true, Method: "write", Params: &WriteParams{Path: "/work/in/data", Data: []byte("hi\n"), Offset: u64(0)}}},
		{"snapshot", reqDoc(int64(8), "snapshot", D{}),
			&Message{Kind: KindRequest, ID: 8, HasID: true, Method: "snapshot", Params: Empty{}}},
		{"start", mustMarshal(D{rpc, E("method", "start")}), &Message{Kind: KindNotification, Method: "start", Params: Empty{}}},
		{"stop", mustMarshal(D{rpc, E("method", "stop")}), &Message{Kind: KindNotification, Method: "stop", Params: Empty{}}},
		{"quit", mustMarshal(D{rpc, E("method", "quit")}), &Message{Kind: KindNotification, Method: "quit", Params: Empty{}}},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		seen[c.want.Method] = true
		t.Run(c.method, func(t *testing.T) {
			got := decodeOK(t, c.doc)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("Decode (-want +got):\n%s", diff)
			}
			// What this package writes for the same params reads back the same.
			if got.Kind == KindRequest {
				again := decodeOK(t, AppendRequest(nil, got.ID, got.Method, got.Params.(Payload)))
				if diff := cmp.Diff(got, again, cmpOpts...); diff != "" {
					t.Errorf("re-encoded (-first +again):\n%s", diff)
				}
			}
		})
	}
	if len(seen) != len(methodTable) {
		t.Errorf("covered %d methods, the table has %d", len(seen), len(methodTable))
	}
}

// Typed results for the nine answering methods: AppendResult, then Decode.
func TestResultRoundTrip(t *testing.T) {
	cases := []struct {
		method string
		result Payload
	}{
		{MethodVersion, &VersionResult{Version: "virtx 0.1.0"}},
		{MethodBuildImage, &BuildImageResult{Ref: "tools:1", Digest: digest64}},
		{MethodRemoveImage, Empty{}},
		{MethodListImages, &ListImagesResult{Images: []ImageEntry{{Digest: digest64, Refs: []string{"tools:1", "tools:latest"}}, {Digest: digest64}}}},
		{MethodListImages, &ListImagesResult{Images: []ImageEntry{}}},
		{MethodInit, &InitResult{Cwd: "/work"}},
		{MethodInit, &InitResult{}},
		{MethodExec, &ExecResult{Code: 0, Stdout: []byte("hi\n"), Stderr: []byte{}}},
		{MethodExec, &ExecResult{Code: 137, Stdout: []byte{0xff, 0xfe, 0}, Stderr: []byte("Killed\n"), Truncated: true}},
		{MethodExec, &ExecResult{Code: math.MinInt32}},
		{MethodRead, &ReadResult{Data: []byte("hi\n"), Size: 10000}},
		{MethodRead, &ReadResult{Data: []byte{}, Size: 1 << 40}},
		{MethodWrite, &WriteResult{Size: 3}},
		{MethodWrite, &WriteResult{Size: 0}},
		{MethodSnapshot, &SnapshotResult{Blob: []byte("layer tar")}},
	}
	answering := map[string]bool{}
	for i, c := range cases {
		answering[c.method] = true
		t.Run(c.method, func(t *testing.T) {
			id := int64(100 + i)
			got := decodeOK(t, AppendResult(nil, id, c.method, c.result))
			want := &Message{Kind: KindResponse, ID: id, HasID: true, Method: c.method, Result: c.result}
			if diff := cmp.Diff(want, got, cmpOpts...); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
	if len(answering) != 9 {
		t.Errorf("covered %d answering methods, want 9", len(answering))
	}
}

// Errors round-trip with every code the protocol has, with and without an id.
func TestErrorRoundTrip(t *testing.T) {
	for code := range codeNames {
		for _, hasID := range []bool{true, false} {
			id := int64(0)
			if hasID {
				id = 42
			}
			e := &Error{Code: code, Message: code.String() + ": détail"}
			got := decodeOK(t, AppendError(nil, id, hasID, e))
			want := &Message{Kind: KindResponse, ID: id, HasID: hasID, Err: e}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s (-want +got):\n%s", code, diff)
			}
		}
	}
}

// A decoded Binary aliases the frame it came in (the package doc promises one copy).
func TestDecodeAliasesBinary(t *testing.T) {
	doc := AppendResult(nil, 1, MethodExec, &ExecResult{Stdout: []byte("abc")})
	m := decodeOK(t, doc)
	out := m.Result.(*ExecResult).Stdout
	i := strings.Index(string(doc), "abc")
	doc[i] = 'X'
	if string(out) != "Xbc" {
		t.Errorf("stdout %q does not alias the frame", out)
	}
}

func TestErrorHelpers(t *testing.T) {
	err := error(Errorf(CodeNotFound, "no %s", "file"))
	if code, ok := CodeOf(err); !ok || code != CodeNotFound {
		t.Errorf("CodeOf = %v, %v", code, ok)
	}
	if _, ok := CodeOf(strings.NewReader("").UnreadByte()); ok {
		t.Error("CodeOf found a code in a plain error")
	}
	if got, want := err.Error(), "NOT_FOUND (-32005): no file"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if Code(-32003).String() != "code -32003" {
		t.Errorf("an unused code names itself %q", Code(-32003).String())
	}
	if !errors.Is(err, &Error{Code: CodeNotFound}) || errors.Is(err, &Error{Code: CodeIOFailed}) {
		t.Error("errors.Is does not match by code")
	}
}

package conformance

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"virtx.dev/virtx/protocol"
)

type testCase struct {
	name string
	run  func(e *env)
}

// marshal builds a raw document for the read-side refusal cases.
func marshal(e *env, d bson.D) []byte {
	b, err := bson.Marshal(d)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

var cases = []testCase{
	// ---- methods ----
	{"version", func(e *env) {
		p := e.peer()
		v := p.ok(protocol.MethodVersion, nil).(*protocol.VersionResult)
		if v.Version == "" {
			e.t.Fatal("empty version")
		}
		// version needs no init, and works again after one.
		p.init(&protocol.InitParams{})
		p.ok(protocol.MethodVersion, nil)
	}},
	{"list_images/no-init", func(e *env) {
		p := e.peer()
		if r := p.ok(protocol.MethodListImages, nil).(*protocol.ListImagesResult); r.Images == nil {
			e.t.Fatal("images member missing")
		}
	}},
	{"images/unknown-and-unbuildable", func(e *env) {
		p := e.peer()
		digest := "sha256:" + strings.Repeat("0", 64)
		err := p.fails(protocol.CodeUnknownImage, protocol.MethodRemoveImage, &protocol.RemoveImageParams{Image: &protocol.ImageSource{Type: protocol.ImageDigest, Digest: digest}})
		if !strings.Contains(err.Message, digest) {
			e.t.Fatalf("message does not name the image: %q", err.Message)
		}
		if c := e.code("build-image", 0); c != 0 {
			p.fails(c, protocol.MethodBuildImage, &protocol.BuildImageParams{Recipe: &protocol.Recipe{Base: "virtx-none:latest"}})
		}
		// A malformed recipe is refused as the frame is read.
		p.sendDoc(marshal(e, bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: p.nextID}, {Key: "method", Value: "build_image"},
			{Key: "params", Value: bson.D{{Key: "recipe", Value: bson.D{{Key: "v", Value: int32(2)}, {Key: "base", Value: "x"}}}}}}))
		p.nextID++
		if m := p.recv(); m.Err == nil || m.Err.Code != protocol.CodeInvalidParams {
			e.t.Fatalf("recipe v2: %v", m)
		}
	}},
	{"init/default", func(e *env) {
		p := e.peer()
		cwd := p.init(&protocol.InitParams{})
		if !filepath.IsAbs(cwd) {
			e.t.Fatalf("init answered cwd %q, want an absolute path", cwd)
		}
		if got := p.pwd(); got != cwd {
			e.t.Fatalf("pwd %q, init said %q", got, cwd)
		}
	}},
	{"init/replaces-earlier", func(e *env) {
		_, guestA, mA := e.tree("a", false, map[string]string{"only-a": "x"})
		_, guestB, mB := e.tree("b", false, map[string]string{"only-b": "y"})
		p := e.peer()
		cwd := p.init(&protocol.InitParams{Mounts: []protocol.Mount{mA}})
		p.exec("cd", guestA)
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{mB}})
		if got := p.pwd(); got != cwd {
			e.t.Fatalf("after a second init pwd is %q, want the init's %q", got, cwd)
		}
		if got := p.sh("cat " + guestB + "/only-b"); got != "y" {
			e.t.Fatalf("second init's tree: %q", got)
		}
	}},
	{"exec/echo", func(e *env) {
		p := e.peer()
		r := p.exec("echo", "hi")
		if r.Code != 0 || string(r.Stdout) != "hi\n" || len(r.Stderr) != 0 || r.Truncated {
			e.t.Fatalf("got %+v", r)
		}
	}},
	{"exec/exit-code", func(e *env) {
		p := e.peer()
		if r := p.exec("sh", "-c", "exit 3"); r.Code != 3 {
			e.t.Fatalf("code %d", r.Code)
		}
		if r := p.exec("sh", "-c", "kill -9 $$"); r.Code != 137 {
			e.t.Fatalf("killed by SIGKILL: code %d, want 137", r.Code)
		}
	}},
	{"exec/bytes-apart", func(e *env) {
		p := e.peer()
		r := p.exec("sh", "-c", `printf 'a\000\377b'; printf 'err\n' >&2`)
		if !bytes.Equal(r.Stdout, []byte("a\x00\xffb")) || string(r.Stderr) != "err\n" {
			e.t.Fatalf("stdout %q stderr %q", r.Stdout, r.Stderr)
		}
	}},
	{"exec/not-executable", func(e *env) {
		p := e.peer()
		p.fails(protocol.CodeNotExecutable, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"no-such-program-virtx"}})
		dir, guest, m := e.tree("t", false, map[string]string{"plain": "not a program"})
		_ = dir
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		p.fails(protocol.CodeNotExecutable, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{guest + "/plain"}})
	}},
	{"exec/empty-argv", func(e *env) {
		p := e.peer()
		p.fails(protocol.CodeInvalidParams, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{}})
	}},
	{"exec/timeout-kills-tree", func(e *env) {
		p := e.peer()
		marker := "1000.0" + strconv.Itoa(os.Getpid())
		err := p.fails(protocol.CodeTimedOut, protocol.MethodExec, &protocol.ExecParams{
			Cmd: []string{"sh", "-c", "sleep " + marker + " & sleep " + marker}, TimeoutMS: u64(300)})
		if err.Message != "killed after 300ms" {
			e.t.Fatalf("message %q", err.Message)
		}
		left := p.sh(`for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f 2>/dev/null; echo; done | grep -c "sleep ` + strings.Replace(marker, ".", "[.]", 1) + `" || true`)
		if trimNL(left) != "0" {
			e.t.Fatalf("%s processes of the killed tree are still alive", trimNL(left))
		}
		// The session still answers.
		if r := p.exec("true"); r.Code != 0 {
			e.t.Fatal("session broken after a timeout")
		}
	}},
	{"exec/output-cap", func(e *env) {
		p := e.peer()
		r := p.exec("sh", "-c", "head -c 40000000 /dev/zero; echo done >&2")
		if !r.Truncated || len(r.Stdout) >= 40000000 || len(r.Stdout) == 0 {
			e.t.Fatalf("truncated=%v len=%d", r.Truncated, len(r.Stdout))
		}
		if string(r.Stderr) != "done\n" {
			e.t.Fatalf("stderr %q: the command must run to its end", r.Stderr)
		}
	}},
	{"exec/background-child-returns", func(e *env) {
		p := e.peer()
		start := time.Now()
		r := p.exec("sh", "-c", "sleep 30 & echo started")
		if r.Code != 0 || string(r.Stdout) != "started\n" {
			e.t.Fatalf("%+v", r)
		}
		if d := time.Since(start); d > 10*time.Second {
			e.t.Fatalf("exec waited %v for a background child holding its stdout", d)
		}
	}},
	// ---- where the session stands ----
	{"cwd/cd-moves", func(e *env) {
		_, guest, m := e.tree("w", false, map[string]string{"sub/f": "in sub"})
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		if r := p.exec("cd", guest); r.Code != 0 || len(r.Stdout) != 0 {
			e.t.Fatalf("cd: %+v", r)
		}
		if r := p.exec("cd", "sub"); r.Code != 0 {
			e.t.Fatalf("relative cd: %+v", r)
		}
		if got := p.pwd(); got != guest+"/sub" {
			e.t.Fatalf("pwd %q", got)
		}
		if got := p.sh("cat f"); got != "in sub" {
			e.t.Fatalf("relative path after cd: %q", got)
		}
		if got := p.read("f", nil, nil); string(got.Data) != "in sub" {
			e.t.Fatalf("relative read after cd: %q", got.Data)
		}
		// sh -c 'cd …' moves nothing.
		p.sh("cd / && true")
		if got := p.pwd(); got != guest+"/sub" {
			e.t.Fatalf("sh -c cd moved the session to %q", got)
		}
		r := p.exec("cd", "no-such-dir")
		if r.Code == 0 || !strings.Contains(string(r.Stderr), "no-such-dir") {
			e.t.Fatalf("cd to a missing dir: %+v", r)
		}
		p.exec("cd", "..")
		if got := p.pwd(); got != guest {
			e.t.Fatalf("cd .. → %q", got)
		}
	}},
	{"cwd/spelling-through-symlink", func(e *env) {
		hostDir, guest, m := e.tree("s", false, map[string]string{"real/f": "x"})
		if err := os.Symlink("real", filepath.Join(hostDir, "link")); err != nil {
			e.t.Fatal(err)
		}
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		p.exec("cd", guest+"/link")
		want := guest + "/link"
		if got := p.pwd(); got != want {
			e.t.Fatalf("pwd %q, want %q", got, want)
		}
		if got := p.sh(`echo "$PWD"; pwd`); got != want+"\n"+want+"\n" {
			e.t.Fatalf("$PWD / sh pwd: %q", got)
		}
	}},
	{"cwd/survives-stop", func(e *env) {
		_, guest, m := e.tree("c", false, nil)
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		p.exec("cd", guest)
		p.notify(protocol.MethodStop)
		p.notify(protocol.MethodStart)
		if got := p.pwd(); got != guest {
			e.t.Fatalf("after stop/start pwd is %q", got)
		}
	}},
	// ---- read / write ----
	{"read/edges", func(e *env) {
		_, guest, m := e.tree("r", false, map[string]string{"ten": "0123456789", "d/x": ""})
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		f := guest + "/ten"
		for _, c := range []struct {
			off, n *uint64
			want   string
		}{
			{nil, nil, "0123456789"},
			{u64(4), nil, "456789"},
			{u64(4), u64(3), "456"},
			{nil, u64(2), "01"},
			{u64(10), nil, ""},
			{u64(99), u64(5), ""},
			{u64(8), u64(100), "89"},
		} {
			r := p.read(f, c.off, c.n)
			if string(r.Data) != c.want || r.Size != 10 {
				e.t.Fatalf("read(off %v len %v) = %q size %d, want %q size 10", c.off, c.n, r.Data, r.Size, c.want)
			}
		}
		p.fails(protocol.CodeNotFound, protocol.MethodRead, &protocol.ReadParams{Path: guest + "/missing"})
		p.fails(protocol.CodeNotFound, protocol.MethodRead, &protocol.ReadParams{Path: guest + "/ten/below-a-file"})
		p.fails(protocol.CodeIsADirectory, protocol.MethodRead, &protocol.ReadParams{Path: guest + "/d"})
	}},
	{"write/edges", func(e *env) {
		hostDir, guest, m := e.tree("w", false, map[string]string{"d/x": ""})
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		f := guest + "/f"
		if n := p.write(f, []byte("hello world"), nil); n != 11 {
			e.t.Fatalf("size %d", n)
		}
		if n := p.write(f, []byte("HELLO"), u64(0)); n != 11 {
			e.t.Fatalf("overwrite in place: size %d", n)
		}
		if got := string(p.read(f, nil, nil).Data); got != "HELLO world" {
			e.t.Fatalf("after overwrite: %q", got)
		}
		if n := p.write(f, []byte("!"), u64(13)); n != 14 {
			e.t.Fatalf("past the end: size %d", n)
		}
		if got := string(p.read(f, nil, nil).Data); got != "HELLO world\x00\x00!" {
			e.t.Fatalf("zero extension: %q", got)
		}
		if n := p.write(f, []byte("new"), nil); n != 3 {
			e.t.Fatalf("replace: size %d", n)
		}
		if n := p.write(f, nil, nil); n != 0 {
			e.t.Fatalf("no data replaces with an empty file: size %d", n)
		}
		p.exec("cd", guest)
		p.write("rel", []byte("r"), nil)
		if b, err := os.ReadFile(filepath.Join(hostDir, "rel")); err != nil || string(b) != "r" {
			if e.target.name == "host" {
				e.t.Fatalf("relative write: %q %v", b, err)
			}
		}
		if got := p.sh("cat " + guest + "/rel"); got != "r" {
			e.t.Fatalf("relative write seen by a command: %q", got)
		}
		p.fails(protocol.CodeNotFound, protocol.MethodWrite, &protocol.WriteParams{Path: guest + "/no/such/dir/f", Data: []byte("x")})
		p.fails(protocol.CodeIsADirectory, protocol.MethodWrite, &protocol.WriteParams{Path: guest + "/d", Data: []byte("x")})
	}},
	{"trees/ro-write-refused", func(e *env) {
		hostDir, guest, m := e.tree("ro", true, map[string]string{"keep": "original"})
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		p.fails(protocol.CodeIOFailed, protocol.MethodWrite, &protocol.WriteParams{Path: guest + "/keep", Data: []byte("x")})
		p.fails(protocol.CodeIOFailed, protocol.MethodWrite, &protocol.WriteParams{Path: guest + "/new", Data: []byte("x")})
		if b, _ := os.ReadFile(filepath.Join(hostDir, "keep")); string(b) != "original" {
			e.t.Fatalf("ro tree changed: %q", b)
		}
		if got := string(p.read(guest+"/keep", nil, nil).Data); got != "original" {
			e.t.Fatalf("read of ro tree: %q", got)
		}
	}},
	{"trees/ro-command-erofs", func(e *env) {
		_, guest, m := e.tree("ro", true, map[string]string{"keep": "original"})
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		r := p.exec("sh", "-c", "echo x > "+guest+"/keep")
		if r.Code == 0 || !strings.Contains(string(r.Stderr), "Read-only") {
			e.t.Fatalf("a command wrote in an ro tree: %+v", r)
		}
	}},
	{"trees/nested-in-order", func(e *env) {
		_, outer, mOuter := e.tree("outer", false, map[string]string{"o": "outer"})
		_, inner, mInner := e.tree("inner", false, map[string]string{"i": "inner"})
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{mOuter, mInner}})
		if got := p.sh("cat " + outer + "/o " + inner + "/i"); got != "outerinner" {
			e.t.Fatalf("%q", got)
		}
	}},
	{"trees/mount-failed-deferred", func(e *env) {
		hostDir, _, m := e.tree("gone", false, nil)
		os.RemoveAll(hostDir)
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}}) // init mounts nothing
		p.fails(protocol.CodeMountFailed, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"true"}})
		// A failed boot leaves the session Idle: the next call tries again.
		os.MkdirAll(hostDir, 0o755)
		if r := p.exec("true"); r.Code != 0 {
			e.t.Fatalf("%+v", r)
		}
	}},
	// ---- snapshot ----
	{"snapshot/roundtrip", func(e *env) {
		p := e.peer()
		if c := e.code("snapshot", 0); c != 0 {
			p.fails(c, protocol.MethodSnapshot, nil)
			return
		}
		p.sh("mkdir -p /root/snap && echo kept > /root/snap/file")
		blob := p.ok(protocol.MethodSnapshot, nil).(*protocol.SnapshotResult).Blob
		if len(blob) == 0 {
			e.t.Fatal("empty snapshot")
		}
		q := e.peer()
		q.init(&protocol.InitParams{Snapshot: blob})
		if got := q.sh("cat /root/snap/file"); got != "kept\n" {
			e.t.Fatalf("resumed session sees %q", got)
		}
	}},
	// ---- start / stop / quit ----
	{"notifications/never-answered", func(e *env) {
		p := e.peer()
		p.notify(protocol.MethodStart)
		p.notify(protocol.MethodStart) // already booted: nothing
		p.expectNothing(300 * time.Millisecond)
		p.ok(protocol.MethodVersion, nil)
		p.notify(protocol.MethodStop)
		p.notify(protocol.MethodStop) // already idle: nothing
		p.expectNothing(300 * time.Millisecond)
		if r := p.exec("echo", "again"); string(r.Stdout) != "again\n" {
			e.t.Fatal("exec after stop did not boot again")
		}
	}},
	{"notifications/stop-during-exec", func(e *env) {
		p := e.peer()
		p.exec("true")
		start := time.Now()
		p.sendDoc(protocol.AppendRequest(nil, p.nextID, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"sleep", "30"}}))
		p.nextID++
		time.Sleep(300 * time.Millisecond)
		p.notify(protocol.MethodStop)
		p.recv() // answered (killed, or failed), not left hanging
		if d := time.Since(start); d > 20*time.Second {
			e.t.Fatalf("stop waited for the exec: %v", d)
		}
		if r := p.exec("echo", "up"); string(r.Stdout) != "up\n" {
			e.t.Fatal("no boot after stop")
		}
	}},
	{"quit/answers-running-exec", func(e *env) {
		p := e.peer()
		p.sendDoc(protocol.AppendRequest(nil, 0, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"sh", "-c", "sleep 0.5; echo finished"}}))
		p.notify(protocol.MethodQuit)
		m := p.recv()
		if m.Err != nil || string(m.Result.(*protocol.ExecResult).Stdout) != "finished\n" {
			e.t.Fatalf("exec accepted before quit: %v", m)
		}
		p.expectEOF()
		if p.exit != nil {
			e.t.Fatalf("server exit after quit: %v", p.exit)
		}
	}},
	{"quit/eof-answers-running-exec", func(e *env) {
		p := e.peer()
		p.sendDoc(protocol.AppendRequest(nil, 0, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"sh", "-c", "sleep 0.5; echo finished"}}))
		p.stdin.Close()
		m := p.recv()
		if m.Err != nil || string(m.Result.(*protocol.ExecResult).Stdout) != "finished\n" {
			e.t.Fatalf("exec accepted before EOF: %v", m)
		}
		p.expectEOF()
	}},
	// ---- what is refused when reading ----
	{"refused/envelope", func(e *env) {
		p := e.peer()
		for _, c := range []struct {
			name  string
			doc   bson.D
			code  protocol.Code
			hasID bool
		}{
			{"jsonrpc missing", bson.D{{Key: "id", Value: int64(7)}, {Key: "method", Value: "version"}, {Key: "params", Value: bson.D{}}}, protocol.CodeInvalidRequest, true},
			{"jsonrpc 1.0", bson.D{{Key: "jsonrpc", Value: "1.0"}, {Key: "id", Value: int64(7)}, {Key: "method", Value: "version"}}, protocol.CodeInvalidRequest, true},
			{"unknown method", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "method", Value: "frobnicate"}}, protocol.CodeMethodNotFound, true},
			{"params not a document", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "method", Value: "exec"}, {Key: "params", Value: bson.A{"ls"}}}, protocol.CodeInvalidParams, true},
			{"cmd not strings", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "method", Value: "exec"}, {Key: "params", Value: bson.D{{Key: "cmd", Value: bson.A{int32(1)}}}}}, protocol.CodeInvalidParams, true},
			{"request without id", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "method", Value: "exec"}, {Key: "params", Value: bson.D{{Key: "cmd", Value: bson.A{"ls"}}}}}, protocol.CodeInvalidRequest, false},
			{"notification with id", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "method", Value: "stop"}}, protocol.CodeInvalidRequest, true},
			{"result and error", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "result", Value: bson.D{}}, {Key: "error", Value: bson.D{{Key: "code", Value: int64(1)}, {Key: "message", Value: "x"}}}}, protocol.CodeInvalidRequest, true},
			{"neither", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}}, protocol.CodeInvalidRequest, true},
			{"result without method", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "result", Value: bson.D{}}}, protocol.CodeInvalidRequest, true},
			{"params and result", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "method", Value: "version"}, {Key: "params", Value: bson.D{}}, {Key: "result", Value: bson.D{{Key: "version", Value: "1"}}}}, protocol.CodeInvalidRequest, true},
			{"method and error", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "method", Value: "version"}, {Key: "error", Value: bson.D{{Key: "code", Value: int64(1)}, {Key: "message", Value: "x"}}}}, protocol.CodeInvalidRequest, true},
			{"a response sent to the server", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "method", Value: "version"}, {Key: "result", Value: bson.D{{Key: "version", Value: "1"}}}}, protocol.CodeInvalidRequest, true},
			{"result not what the method answers", bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(7)}, {Key: "method", Value: "write"}, {Key: "result", Value: bson.D{{Key: "size", Value: "big"}}}}, protocol.CodeInvalidRequest, true},
		} {
			p.sendDoc(marshal(e, c.doc))
			m := p.recv()
			if m.Err == nil || m.Err.Code != c.code || m.HasID != c.hasID || (c.hasID && m.ID != 7) {
				e.t.Fatalf("%s: got %v (id %d has %v), want %v", c.name, m, m.ID, m.HasID, c.code)
			}
		}
		// Not BSON at all: a parse error, and the session goes on.
		p.sendRaw([]byte{0, 0, 0, 6, 1, 2, 3, 4, 5, 6})
		if m := p.recv(); m.Err == nil || m.Err.Code != protocol.CodeParseError || m.HasID {
			e.t.Fatalf("garbage: %v", m)
		}
		p.ok(protocol.MethodVersion, nil)
	}},
	{"accepted/variations", func(e *env) {
		p := e.peer()
		// Int32 id, params before method, unknown members, a null member read as absent.
		p.sendDoc(marshal(e, bson.D{{Key: "params", Value: bson.D{{Key: "cmd", Value: bson.A{"echo", "x"}}, {Key: "timeout_ms", Value: int32(5000)}, {Key: "extra", Value: true}}}, {Key: "trace_id", Value: "abc"}, {Key: "method", Value: "exec"}, {Key: "id", Value: int32(0)}, {Key: "jsonrpc", Value: "2.0"}}))
		if m := p.recv(); m.Err != nil || m.ID != 0 || string(m.Result.(*protocol.ExecResult).Stdout) != "x\n" {
			e.t.Fatalf("%v", m)
		}
		// A request with no params reads as {}.
		p.sendDoc(marshal(e, bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: int64(1)}, {Key: "method", Value: "version"}}))
		if m := p.recv(); m.Err != nil {
			e.t.Fatalf("%v", m)
		}
	}},
	{"framing/zero-length-ends", func(e *env) {
		p := e.peer()
		p.sendHeader(0)
		if m := p.recv(); m.Err == nil || m.Err.Code != protocol.CodeParseError {
			e.t.Fatalf("%v", m)
		}
		p.expectEOF()
	}},
	{"framing/oversize-ends", func(e *env) {
		p := e.peer()
		p.sendHeader(protocol.MaxPayload + 1)
		if m := p.recv(); m.Err == nil || m.Err.Code != protocol.CodeParseError {
			e.t.Fatalf("%v", m)
		}
		p.expectEOF()
	}},
	{"framing/truncated-ends", func(e *env) {
		p := e.peer()
		p.sendHeader(100)
		p.sendRaw([]byte{1, 2, 3})
		p.stdin.Close()
		if m := p.recv(); m.Err == nil || m.Err.Code != protocol.CodeParseError {
			e.t.Fatalf("%v", m)
		}
		p.expectEOF()
	}},
	// ---- init validation ----
	{"init/invalid-params", func(e *env) {
		_, _, m := e.tree("v", false, nil)
		p := e.peer()
		dup := m
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			e.t.Fatal(err)
		}
		defer ln.Close()
		taken := uint16(ln.Addr().(*net.TCPAddr).Port)
		for name, params := range map[string]*protocol.InitParams{
			"duplicate guest path":    {Mounts: []protocol.Mount{m, dup}},
			"tree at /":               {Mounts: []protocol.Mount{{URL: "file:///tmp", GuestPath: "/"}}},
			"port taken":              {Ports: []protocol.Port{{Host: taken, Guest: 80}}},
			"ports with network off":  {Network: boolp(false), Ports: []protocol.Port{{Host: 18080, Guest: 80}}},
			"vcpus 0":                 {VCPUs: u64(0)},
			"memory 0":                {MemoryMiB: u64(0)},
			"disk 0":                  {DiskGiB: u64(0)},
			"gpu memory 0":            {GPU: boolp(true), GPUMemoryMiB: u64(0)},
			"gpu memory without gpu":  {GPUMemoryMiB: u64(1024)},
			"gpu memory with gpu off": {GPU: boolp(false), GPUMemoryMiB: u64(1024)},
		} {
			m := p.call(protocol.MethodInit, params)
			if m.Err == nil || m.Err.Code != protocol.CodeInvalidParams {
				e.t.Errorf("%s: got %v, want -32602", name, m)
			}
		}
		// Bad strings are refused as the frame is read.
		for _, d := range []bson.D{
			{{Key: "mounts", Value: bson.A{"not-a-mount"}}},
			{{Key: "mounts", Value: bson.A{"file:///x:relative"}}},
			{{Key: "ports", Value: bson.A{"0:80"}}},
			{{Key: "ports", Value: bson.A{"80"}}},
			{{Key: "vcpus", Value: int32(-1)}},
		} {
			p.sendDoc(marshal(e, bson.D{{Key: "jsonrpc", Value: "2.0"}, {Key: "id", Value: p.nextID}, {Key: "method", Value: "init"}, {Key: "params", Value: d}}))
			p.nextID++
			if m := p.recv(); m.Err == nil || m.Err.Code != protocol.CodeInvalidParams {
				e.t.Errorf("%v: got %v, want -32602", d, m)
			}
		}
	}},
	{"init/unsupported-scheme", func(e *env) {
		p := e.peer()
		err := p.fails(protocol.CodeUnsupportedMount, protocol.MethodInit, &protocol.InitParams{Mounts: []protocol.Mount{{URL: "nosuch://x/y", GuestPath: "/data"}}})
		if !strings.Contains(err.Message, "nosuch") {
			e.t.Fatalf("message does not name the entry: %q", err.Message)
		}
	}},
	{"init/backend-refusals", func(e *env) {
		p := e.peer()
		check := func(key string, params *protocol.InitParams) {
			if c := e.code(key, 0); c != 0 {
				p.fails(c, protocol.MethodInit, params)
			} else {
				p.init(params)
			}
		}
		check("network-off", &protocol.InitParams{Network: boolp(false)})
		// A digest nobody has: resolving it asks no registry (a ref could reach the internet).
		check("image", &protocol.InitParams{Image: &protocol.ImageSource{Type: protocol.ImageDigest, Digest: "sha256:" + strings.Repeat("e", 64)}})
		check("machine-shape", &protocol.InitParams{VCPUs: u64(1), MemoryMiB: u64(512)})
		check("init-snapshot", &protocol.InitParams{Snapshot: []byte{}})
		// Never a quietly smaller machine.
		p.fails(protocol.CodeUnsupportedMachine, protocol.MethodInit, &protocol.InitParams{VCPUs: u64(100000)})
		// A refused init leaves the session usable.
		p.ok(protocol.MethodVersion, nil)
		p.exec("true")
	}},
	{"init/network-off", func(e *env) {
		p := e.peer()
		p.init(&protocol.InitParams{Network: boolp(false)})
		out := p.sh("ls /sys/class/net")
		if strings.TrimSpace(out) != "lo" {
			e.t.Fatalf("network off, interfaces: %q", out)
		}
	}},
	{"init/machine-shape", func(e *env) {
		p := e.peer()
		p.init(&protocol.InitParams{VCPUs: u64(1), MemoryMiB: u64(512)})
		p.exec("true")
	}},
	{"trees/elsewhere", func(e *env) {
		_, _, m := e.tree("x", false, map[string]string{"f": "here"})
		m.GuestPath = "/virtx-elsewhere/x"
		p := e.peer()
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		if got := p.sh("cat /virtx-elsewhere/x/f"); got != "here" {
			e.t.Fatalf("%q", got)
		}
	}},
	{"trees/host-elsewhere-refused", func(e *env) {
		c := e.code("tree-elsewhere", 0)
		if c == 0 {
			return // this backend places trees anywhere: trees/elsewhere covers it
		}
		_, _, m := e.tree("x", false, nil)
		m.GuestPath = "/virtx-elsewhere/x"
		p := e.peer()
		p.fails(c, protocol.MethodInit, &protocol.InitParams{Mounts: []protocol.Mount{m}})
	}},
	// ---- ports ----
	{"ports/forward", func(e *env) {
		// A service inside the session, on a free port, echoing one line.
		probe, _ := net.Listen("tcp", "127.0.0.1:0")
		guest := probe.Addr().(*net.TCPAddr).Port
		probe.Close()
		probe, _ = net.Listen("tcp", "127.0.0.1:0")
		hostPort := probe.Addr().(*net.TCPAddr).Port
		probe.Close()
		p := e.peer()
		p.init(&protocol.InitParams{Ports: []protocol.Port{{Host: uint16(hostPort), Guest: uint16(guest)}}})
		// The listener is held from init, before anything boots.
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", hostPort)); err != nil {
			e.t.Fatalf("port not held at init: %v", err)
		} else {
			c.Close()
		}
		script := fmt.Sprintf(`import socket,sys
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0",%d)); s.listen(1)
print("listening", flush=True)
c,_=s.accept(); c.sendall(b"pong:"+c.recv(100)); c.close()`, guest)
		p.exec("sh", "-c", "python3 -c '"+script+"' > /dev/null 2>&1 &")
		var conn net.Conn
		deadline := time.Now().Add(20 * time.Second)
		for {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", hostPort))
			if err == nil {
				c.SetDeadline(time.Now().Add(5 * time.Second))
				c.Write([]byte("ping"))
				buf := make([]byte, 64)
				n, _ := c.Read(buf)
				c.Close()
				if string(buf[:n]) == "pong:ping" {
					conn = c
					break
				}
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("no answer through the port")
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = conn
	}},
}

package conformance

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// requirePrereq skips a test whose prerequisite is missing — except in CI (CI=true),
// where a skipped prerequisite would make a green run a lie, so it fails.
func requirePrereq(t *testing.T, ok bool, what, fix string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing in CI: %s (%s)", what, fix)
	}
	t.Skipf("prerequisite missing: %s (%s)", what, fix)
}

// upstreamScript drives our server with the upstream virtx Python client (PyPI `virtx`):
// its ConsoleClient, pointed at our binary with the builder's cmd([...]), mounts a
// directory, writes, execs and reads; its ImageClient asks version.
const upstreamScript = `
import asyncio, os, sys
from virtx import ConsoleClient, ImageClient, ConsoleRefused

server, tree = sys.argv[1], sys.argv[2]
cmd = [server, "serve", "--backend", "host"]

async def main():
    images = await ImageClient.try_from_cmd(cmd)
    v = await images.version()
    assert isinstance(v, str) and v, v
    await images.close()

    console = await ConsoleClient.builder().cmd(cmd).mount(tree, tree).build()
    assert console.mounts == [tree], console.mounts
    n = await console.write(tree + "/hello.txt", b"hello from upstream\n")
    assert n == 20, n
    r = await console.exec(["cd", tree])
    assert r.code == 0
    r = await console.exec(["sh", "-c", "cat hello.txt; echo err >&2; exit 3"])
    assert r.code == 3 and r.stdout == b"hello from upstream\n" and r.stderr == b"err\n", (r.code, r.stdout, r.stderr)
    r = await console.exec(["cat", "hello.txt"])
    assert r.stdout == b"hello from upstream\n", r.stdout
    r = await console.read(tree + "/hello.txt", offset=6, len=4)
    assert r.data == b"from" and r.size == 20, (r.data, r.size)
    n = await console.write(tree + "/hello.txt", b"HELLO", offset=0)
    assert n == 20, n
    r = await console.read("hello.txt")
    assert r.data == b"HELLO from upstream\n", r.data
    try:
        await console.read(tree + "/missing")
        raise AssertionError("read of a missing file succeeded")
    except ConsoleRefused as e:
        assert e.code == -32005, e.code
    try:
        await console.exec(["sleep", "5"], timeout_ms=200)
        raise AssertionError("timeout not enforced")
    except ConsoleRefused as e:
        assert e.code == -32000, e.code
    await console.stop()
    await console.start()
    r = await console.exec(["pwd"])
    assert r.stdout.decode().strip() == tree, r.stdout
    await console.close()

    try:
        await ConsoleClient.builder().cmd(cmd).network(False).build()
        raise AssertionError("host backend accepted network off")
    except ConsoleRefused as e:
        assert e.code == -32010, e.code
    print("upstream client OK")

asyncio.run(main())
# virtx 0.1.2's native extension segfaults in about one interpreter shutdown in ten, after
# everything above has run and every console is closed (faulthandler: no Python frame
# left; the same with the server of before this test existed). Leave without the
# finalization it crashes in: a failure above has already ended this script non-zero.
sys.stdout.flush()
os._exit(0)
`

func TestUpstreamPythonClient(t *testing.T) {
	py := os.Getenv("VIRTX_PYTHON")
	if py == "" {
		py = "python3"
	}
	probe := exec.Command(py, "-c", "import virtx")
	out, err := probe.CombinedOutput()
	requirePrereq(t, err == nil, "the upstream Python client: "+strings.TrimSpace(string(out)),
		"pip install virtx, and point VIRTX_PYTHON at that python")
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "drive.py")
	if err := os.WriteFile(script, []byte(upstreamScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, script, virtxBin, tree)
	cmd.Dir = dir
	out, err = cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "upstream client OK") {
		t.Fatalf("upstream client against our server: %v\n%s", err, out)
	}
}

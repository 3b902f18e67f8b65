package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/internal/fault"
	"virtx.dev/virtx/internal/linux/cgroup"
	"virtx.dev/virtx/protocol"
)

// The test binary is its own sandbox init: the backend starts /proc/self/exe as
// `virtx __sandbox-init`, and TestMain hands that to RunInit.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == InitCommand {
		if err := RunInit(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "sandbox init:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "virtx-sandbox-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	testCache = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testCache is the cache directory the tests share, so the host image is built once.
var testCache string

// requireSandbox skips a test where this host cannot make sandboxes, naming the fix —
// and fails it when CI=true, where a skip would make a green run a lie.
func requireSandbox(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("prerequisite missing in CI: %v", err)
		}
		t.Skipf("prerequisite missing: %v", err)
	}
}

func newBackend(t *testing.T) *Backend {
	t.Helper()
	requireSandbox(t)
	b := New(WithCacheDir(testCache))
	t.Cleanup(func() { b.Close() })
	return b
}

func boot(t *testing.T, b *Backend, spec *backend.Spec) backend.Machine {
	t.Helper()
	m, err := b.Boot(context.Background(), spec)
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	return m
}

func run(t *testing.T, m backend.Machine, argv ...string) executor.ExecResult {
	t.Helper()
	r, err := m.Exec(context.Background(), executor.ExecRequest{Cmd: argv, Cwd: DefaultCwd, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	return r
}

// sh runs a shell script and returns its stdout, failing on a non-zero exit.
func sh(t *testing.T, m backend.Machine, script string) string {
	t.Helper()
	r := run(t, m, "sh", "-c", script)
	if r.Code != 0 {
		t.Fatalf("sh -c %q: exit %d, stderr %q", script, r.Code, r.Stderr)
	}
	return string(r.Stdout)
}

func fileMount(dir, guest string, ro bool) protocol.Mount {
	return protocol.Mount{URL: "file://" + dir, GuestPath: guest, ReadOnly: ro}
}

func TestAdmit(t *testing.T) {
	b := New(WithCacheDir(t.TempDir()))
	yes, no := true, false
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	tw.Write([]byte("x"))
	tw.Close()
	for _, c := range []struct {
		name string
		spec backend.Spec
		want error // nil: admitted
	}{
		{"default", backend.Spec{Network: true}, nil},
		{"network off", backend.Spec{}, nil},
		{"gpu false", backend.Spec{GPU: &no}, nil},
		{"small disk", backend.Spec{DiskGiB: 1}, nil},
		{"empty snapshot", backend.Spec{Snapshot: []byte{}}, nil},
		{"a layer", backend.Spec{Snapshot: layer.Bytes()}, nil},
		{"tree", backend.Spec{Mounts: []protocol.Mount{fileMount("/srv", "/work/srv", true)}}, nil},
		// A digest the (empty) store lacks: nothing is pulled. Rootless, images are refused.
		{"unknown image", backend.Spec{Image: &protocol.ImageSource{Type: protocol.ImageDigest, Digest: "sha256:" + strings.Repeat("0", 64)}}, unknownImageKind()},
		{"vcpus", backend.Spec{VCPUs: 1}, limitsRefused()},
		{"memory", backend.Spec{MemoryMiB: 512}, limitsRefused()},
		{"vcpus beyond the host", backend.Spec{VCPUs: 1 << 16}, backend.ErrUnsupportedMachine},
		{"memory beyond the host", backend.Spec{MemoryMiB: 1 << 30}, backend.ErrUnsupportedMachine},
		{"gpu", backend.Spec{GPU: &yes}, backend.ErrUnsupportedMachine},
		{"gpu memory", backend.Spec{GPU: &yes, GPUMemoryMiB: 1024}, backend.ErrUnsupportedMachine},
		{"disk beyond memory", backend.Spec{DiskGiB: 1 << 20}, backend.ErrUnsupportedMachine},
		{"other scheme", backend.Spec{Mounts: []protocol.Mount{{URL: "s3://bucket/x", GuestPath: "/data"}}}, backend.ErrUnsupportedMount},
		{"relative file url", backend.Spec{Mounts: []protocol.Mount{{URL: "file://host/x", GuestPath: "/data"}}}, backend.ErrUnsupportedMount},
		{"tree over /proc", backend.Spec{Mounts: []protocol.Mount{fileMount("/srv", "/proc/x", false)}}, backend.ErrInvalidSpec},
		{"tree at /dev", backend.Spec{Mounts: []protocol.Mount{fileMount("/srv", "/dev", false)}}, backend.ErrInvalidSpec},
		{"not a tar", backend.Spec{Snapshot: []byte("not a tar at all, no")}, backend.ErrInvalidSpec},
		{"snapshot beyond disk", backend.Spec{DiskGiB: 1, Snapshot: bigLayer(t, 1<<30+1)}, backend.ErrInvalidSpec},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := c.spec
			cwd, err := b.Admit(context.Background(), &spec)
			if c.want == nil {
				if err != nil || cwd != DefaultCwd {
					t.Fatalf("got %q, %v; want %q admitted", cwd, err, DefaultCwd)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
}

// limitsRefused is what Admit answers a session asking for vcpus or memory_mib: nil
// where this process can enforce cgroup limits, else UNSUPPORTED_MACHINE.
func limitsRefused() error {
	if i := cgroup.Detect(); i.Version == 0 || !i.Writable || i.Reason != "" {
		return backend.ErrUnsupportedMachine
	}
	return nil
}

// bigLayer is a layer tar whose one file claims size bytes (its header alone: Admit reads
// headers, and the body is never there).
func bigLayer(t *testing.T, size int64) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: size, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestBootBasics(t *testing.T) {
	b := newBackend(t)
	m := boot(t, b, &backend.Spec{})
	if got := sh(t, m, "hostname; id -u; pwd"); got != Hostname+"\n0\n/root\n" {
		t.Fatalf("pid/hostname/uid/cwd: %q", got)
	}
	// Only the sandbox's own processes: PID 1 (init) and what runs now.
	if got := sh(t, m, "ls /proc | grep -c '^[0-9]'"); mustInt(t, got) > 4 {
		t.Fatalf("the sandbox sees %s processes:\n%s", strings.TrimSpace(got), sh(t, m, "ps -e 2>/dev/null || ls /proc"))
	}
	if got := sh(t, m, "ls /sys/class/net"); got != "lo\n" {
		t.Fatalf("interfaces: %q", got)
	}
	if got := sh(t, m, "cat /sys/class/net/lo/operstate; cat /sys/class/net/lo/flags"); !strings.HasSuffix(got, "0x9\n") {
		t.Fatalf("lo is not up: %q", got)
	}
	if got := sh(t, m, "grep CapBnd /proc/self/status"); got != "CapBnd:\t00000000a80425fb\n" {
		t.Fatalf("bounding set %q, want Docker's default set", got)
	}
	if got := sh(t, m, "grep NoNewPrivs /proc/self/status"); got != "NoNewPrivs:\t1\n" {
		t.Fatalf("%q", got)
	}
	// No descriptor of init's reaches a command.
	if got := sh(t, m, "ls /proc/self/fd"); got != "0\n1\n2\n3\n" {
		t.Fatalf("a command's descriptors: %q", got)
	}
	for _, dev := range devices {
		if r := run(t, m, "test", "-c", "/dev/"+dev); r.Code != 0 {
			t.Errorf("/dev/%s is not a character device", dev)
		}
	}
	if got := sh(t, m, "head -c 4 /dev/zero | od -An -tx1; echo x > /dev/null; ls /dev/pts/ptmx /dev/shm /dev/fd/ >/dev/null && echo ok"); got != " 00 00 00 00\nok\n" {
		t.Fatalf("/dev: %q", got)
	}
}

// writableSystemDir is a directory of the host image a session may write below: /usr/local
// as root; rootless, /usr belongs to host root, which no user namespace maps, so /var.
func writableSystemDir() string {
	if os.Geteuid() == 0 {
		return "/usr/local"
	}
	return "/var"
}

// TestRootlessUsrIsReadOnly pins down what the package documentation says of rootless
// sessions: /usr shows host root's files as nobody's, and writing below it fails.
func TestRootlessUsrIsReadOnly(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("as root, /usr is writable (TestWritesOutliveStop); TestRootless runs this rootless")
	}
	m := boot(t, newBackend(t), &backend.Spec{})
	if got := sh(t, m, "stat -c %U /usr/bin/env"); got != "nobody\n" {
		t.Errorf("/usr/bin/env belongs to %q inside", got)
	}
	r := run(t, m, "sh", "-c", "mkdir /usr/local/x")
	if r.Code == 0 || !strings.Contains(string(r.Stderr), "Permission denied") {
		t.Fatalf("mkdir under /usr: %+v", r)
	}
	if got := sh(t, m, "mkdir /var/x /etc/x /x && echo ok"); got != "ok\n" {
		t.Fatalf("%q", got)
	}
}

func mustInt(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// TestWritesOutliveStop: a stop frees the boundary, the session's files stay for its next
// boot, and a new session (a new spec) starts clean.
func TestWritesOutliveStop(t *testing.T) {
	b := newBackend(t)
	spec := &backend.Spec{}
	m := boot(t, b, spec)
	sh(t, m, "echo kept > /root/f; mkdir -p "+writableSystemDir()+"/new && echo u > "+writableSystemDir()+"/new/g; rm /etc/hostname")
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r, err := m.Exec(context.Background(), executor.ExecRequest{Cmd: []string{"true"}, Cwd: "/"}); err == nil && r.Code != 137 {
		t.Fatalf("exec on a machine that was shut down: %+v", r)
	}
	m = boot(t, b, spec)
	if got := sh(t, m, "cat /root/f "+writableSystemDir()+"/new/g; test -e /etc/hostname || echo gone"); got != "kept\nu\ngone\n" {
		t.Fatalf("after stop and boot: %q", got)
	}
	m.Shutdown(context.Background())
	m = boot(t, b, &backend.Spec{})
	if got := sh(t, m, "ls /root; cat /etc/hostname"); got != Hostname+"\n" {
		t.Fatalf("a new session sees %q", got)
	}
}

func TestTrees(t *testing.T) {
	b := newBackend(t)
	outer, inner, ro := t.TempDir(), t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(outer, "o"), []byte("outer"), 0o644)
	os.WriteFile(filepath.Join(inner, "i"), []byte("inner"), 0o644)
	os.WriteFile(filepath.Join(ro, "keep"), []byte("original"), 0o644)
	m := boot(t, b, &backend.Spec{Mounts: []protocol.Mount{
		fileMount(outer, "/work", false),
		fileMount(inner, "/work/in/deep", false), // inside the first: its mount point is made there
		fileMount(ro, "/srv/ro", true),
	}})
	if got := sh(t, m, "cat /work/o /work/in/deep/i /srv/ro/keep; echo new > /work/in/deep/n"); got != "outerinneroriginal" {
		t.Fatalf("%q", got)
	}
	if b, err := os.ReadFile(filepath.Join(inner, "n")); err != nil || string(b) != "new\n" {
		t.Fatalf("a write in a tree is not on the host: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(outer, "in", "deep")); err != nil {
		t.Fatalf("the nested tree's mount point: %v", err)
	}
	r := run(t, m, "sh", "-c", "echo x > /srv/ro/keep")
	if r.Code == 0 || !strings.Contains(string(r.Stderr), "Read-only") {
		t.Fatalf("a command wrote to an ro tree: %+v", r)
	}
	_, err := m.Write(context.Background(), "/srv/ro/keep", []byte("x"), 0, false)
	if err == nil || fault.ToProtocol(err).Code != protocol.CodeIOFailed {
		t.Fatalf("write to an ro tree: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(ro, "keep")); string(b) != "original" {
		t.Fatalf("the ro tree changed: %q", b)
	}
	// A tree's directory that is not there is MOUNT_FAILED, at boot.
	_, err = b.Boot(context.Background(), &backend.Spec{Mounts: []protocol.Mount{fileMount(filepath.Join(outer, "missing"), "/x", false)}})
	if !errors.Is(err, backend.ErrMountFailed) {
		t.Fatalf("missing tree: %v", err)
	}
}

// TestSnapshotRoundTrip: snapshot → a new session from it → snapshot again gives an
// equivalent layer, whiteouts and opaque directories included.
func TestSnapshotRoundTrip(t *testing.T) {
	b := newBackend(t)
	m := boot(t, b, &backend.Spec{})
	sh(t, m, `set -e
mkdir -p /root/snap/sub && echo kept > /root/snap/file && echo deep > /root/snap/sub/x
ln -s file /root/snap/link && ln /root/snap/file /root/snap/hard && chmod 600 /root/snap/sub/x
rm /etc/issue                               # a whiteout
rm -rf /etc/profile.d && mkdir /etc/profile.d && echo 'x=1' > /etc/profile.d/only.sh   # opaque
mkdir -p `+writableSystemDir()+`/lib/virtx && printf '\000\001' > `+writableSystemDir()+`/lib/virtx/bin`)
	first, err := m.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m.Shutdown(context.Background())
	entries := layerEntries(t, first)
	for _, want := range []string{"etc/.wh.issue", "etc/profile.d/.wh..wh..opq", "root/snap/file", writableSystemDir()[1:] + "/lib/virtx/bin"} {
		if _, ok := entries[want]; !ok {
			t.Errorf("first snapshot lacks %s; it has %v", want, keys(entries))
		}
	}

	spec := &backend.Spec{Snapshot: first}
	m = boot(t, b, spec)
	if got := sh(t, m, "cat /root/snap/file /root/snap/sub/x /root/snap/link; ls /etc/profile.d; test -e /etc/issue || echo no-issue; stat -c %a /root/snap/sub/x"); got != "kept\ndeep\nkept\nonly.sh\nno-issue\n600\n" {
		t.Fatalf("the resumed session sees %q", got)
	}
	second, err := m.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(entries, layerEntries(t, second)); diff != "" {
		t.Fatalf("the second snapshot differs (-first +second):\n%s", diff)
	}
}

// layerEntry is what a layer says of one path, as equivalence sees it.
type layerEntry struct {
	Type     byte
	Mode     int64
	Uid, Gid int
	Link     string
	Sum      string
	Mtime    int64
}

func layerEntries(t *testing.T, blob []byte) map[string]layerEntry {
	t.Helper()
	out := map[string]layerEntry{}
	tr := tar.NewReader(bytes.NewReader(blob))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		e := layerEntry{Type: h.Typeflag, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid, Link: h.Linkname, Sum: fmt.Sprintf("%x", sha256.Sum256(body))}
		if h.Typeflag != tar.TypeDir {
			e.Mtime = h.ModTime.Unix() // a directory's changes when anything below it is made
		}
		out[h.Name] = e
	}
}

func keys(m map[string]layerEntry) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestDialPort(t *testing.T) {
	b := newBackend(t)
	m := boot(t, b, &backend.Spec{Network: true})
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("needs python3 for a listener inside the sandbox (Debian: python3)")
	}
	script := `import socket
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", 7777)); s.listen(1)
c,_=s.accept(); c.sendall(b"pong:"+c.recv(100)); c.close()`
	run(t, m, "sh", "-c", "python3 -c '"+script+"' >/dev/null 2>&1 &")
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := m.DialPort(context.Background(), 7777)
		if err == nil {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write([]byte("ping"))
			got, _ := io.ReadAll(c)
			c.Close()
			if string(got) != "pong:ping" {
				t.Fatalf("%q", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := m.DialPort(context.Background(), 7778); err == nil {
		t.Fatal("dialed a port nothing listens on")
	}
	// The host's loopback is another network: a host listener is not reachable inside.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	r := run(t, m, "python3", "-c", fmt.Sprintf("import socket; socket.create_connection(('127.0.0.1', %d), timeout=2)", port))
	if r.Code == 0 {
		t.Fatal("a command reached a listener on the host's 127.0.0.1")
	}
}

// TestShutdownKillsEverything: nothing of a sandbox outlives its Shutdown, daemonised
// processes included.
func TestShutdownKillsEverything(t *testing.T) {
	b := newBackend(t)
	m := boot(t, b, &backend.Spec{})
	marker := "4242.0" + strconv.Itoa(os.Getpid())
	sh(t, m, "setsid sh -c 'sleep "+marker+" & sleep "+marker+"' >/dev/null 2>&1 < /dev/null &")
	time.Sleep(100 * time.Millisecond)
	if n := countProcs(marker); n != 3 { // sh and its two sleeps
		t.Fatalf("%d marked processes running before the shutdown, want 3", n)
	}
	m.Shutdown(context.Background())
	if n := countProcs(marker); n != 0 {
		t.Fatalf("%d marked processes left after the shutdown", n)
	}
}

// countProcs counts this host's processes whose command line holds marker.
func countProcs(marker string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.Contains(b, []byte(marker)) {
			n++
		}
	}
	return n
}

// TestDiskLimit: a session's writes stop at disk_gib with ENOSPC, and the session goes on.
func TestDiskLimit(t *testing.T) {
	b := newBackend(t)
	m := boot(t, b, &backend.Spec{DiskGiB: 1})
	r := run(t, m, "sh", "-c", "dd if=/dev/zero of=/root/fill bs=1M count=1100 2>&1")
	if r.Code == 0 || !strings.Contains(string(r.Stdout), "No space left on device") {
		t.Fatalf("filling past disk_gib: %+v", r)
	}
	if got := sh(t, m, "rm /root/fill && echo ok > /root/after && cat /root/after"); got != "ok\n" {
		t.Fatalf("after the disk was full: %q", got)
	}
}

// rootlessChild marks the run of this test binary that TestRootless starts.
const rootlessChild = "VIRTX_SANDBOX_ROOTLESS_CHILD"

// TestRootless runs this package's tests again as an ordinary user (uid and gid 65534,
// switched to with setpriv from util-linux): the same sandboxes, in user namespaces.
func TestRootless(t *testing.T) {
	if os.Getenv(rootlessChild) != "" {
		t.Skip("this is the rootless run")
	}
	requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("already rootless")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("prerequisite missing in CI: setpriv (Debian: util-linux)")
		}
		t.Skip("prerequisite missing: setpriv (Debian: util-linux)")
	}
	dir, err := os.MkdirTemp("", "virtx-sandbox-rootless-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]os.FileMode{dir: 0o755, tmp: 0o1777} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "sandbox.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	argv := []string{setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.count=1", "-test.v"}
	if st, err := os.Stat("/dev/net/tun"); err == nil && st.Mode().Perm()&0o006 != 0o006 {
		// /dev/net/tun is root's only here (a container's default; Debian's is 0666), and
		// network true needs it: the run gets one everyone may open, in a mount namespace
		// of its own, so the host's stays as it is.
		tun := filepath.Join(dir, "tun")
		if err := os.Mkdir(tun, 0o755); err != nil {
			t.Fatal(err)
		}
		script := `mount -t tmpfs -o size=4k,mode=0755 tmpfs "$1" && mknod -m 0666 "$1/tun" c 10 200 && mount --bind "$1/tun" /dev/net/tun && shift && exec "$@"`
		argv = append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", tun}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = tmp
	// This user gets no cgroup limits on a cgroup v1 host: sessions that ask for none run
	// without (NoLimitsEnv).
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR=" + tmp, "HOME=" + tmp, rootlessChild + "=1", "CI=" + os.Getenv("CI"), NoLimitsEnv + "=1"}
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nPASS\n")) {
		t.Fatalf("the rootless run failed (%v):\n%s", err, out)
	}
	if bytes.Contains(out, []byte("--- SKIP: TestRootlessUsrIsReadOnly")) {
		t.Fatalf("the rootless run skipped its own test:\n%s", out)
	}
}

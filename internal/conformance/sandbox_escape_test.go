package conformance

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"virtx.dev/virtx/protocol"
)

// TestSandboxEscape is the sandbox's escape suite: each case would fail if the boundary
// leaked, driven through the real `virtx serve --backend sandbox` as a client drives it.
func TestSandboxEscape(t *testing.T) {
	requireSandbox(t)
	cache := t.TempDir()
	marker := filepath.Join(cache, "virtx-cache-marker")
	if err := os.WriteFile(marker, []byte("cache"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIRTX_HOME", cache)
	e := &env{t: t, target: targets["sandbox"]}

	t.Run("host processes invisible", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		mine := strconv.Itoa(os.Getpid())
		got := p.sh(`for d in /proc/[0-9]*; do echo "${d#/proc/}"; done`)
		pids := strings.Fields(got)
		if len(pids) > 4 {
			t.Fatalf("the sandbox sees %d processes: %v", len(pids), pids)
		}
		// The pattern does not match its own command line ("[.]" is not ".").
		if r := p.exec("sh", "-c", "grep -l 'conformance[.]test\\|[v]irtx serve' /proc/[0-9]*/cmdline"); r.Code == 0 {
			t.Fatalf("a host process is visible: %s", r.Stdout)
		}
		if r := p.exec("kill", "-0", mine); r.Code == 0 && mine != "1" {
			t.Fatalf("the test's own pid %s is reachable from inside", mine)
		}
	})

	t.Run("host files invisible", func(t *testing.T) {
		secret := filepath.Join("/root", fmt.Sprintf(".virtx-escape-%d", os.Getpid()))
		if err := os.WriteFile(secret, []byte("host secret"), 0o600); err == nil {
			defer os.Remove(secret)
		}
		p := startPeer(t, "sandbox")
		for _, path := range []string{"/etc/shadow", "/etc/gshadow", "/etc/ssh/ssh_host_rsa_key", "/etc/ssl/private", secret, marker, cache} {
			if r := p.exec("test", "-e", path); r.Code == 0 {
				t.Errorf("%s is visible in the sandbox", path)
			}
			p.fails(protocol.CodeNotFound, protocol.MethodRead, &protocol.ReadParams{Path: path})
		}
		if got := p.sh("ls -A /root /home | grep -v :$ | grep -v '^$' || true"); got != "" {
			t.Errorf("/root or /home of the sandbox holds %q", got)
		}
	})

	t.Run("ro tree unwritable", func(t *testing.T) {
		hostDir, guest, m := e.tree("ro", true, map[string]string{"keep": "original"})
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		for _, script := range []string{"echo x > " + guest + "/keep", "touch " + guest + "/new", "rm " + guest + "/keep", "mkdir " + guest + "/d"} {
			r := p.exec("sh", "-c", script)
			if r.Code == 0 || !strings.Contains(string(r.Stderr), "Read-only") {
				t.Errorf("%s: %+v", script, r)
			}
		}
		// Not even root inside may make it writable again.
		if r := p.exec("mount", "-o", "remount,rw", guest); r.Code == 0 {
			t.Errorf("remount rw succeeded")
		}
		p.fails(protocol.CodeIOFailed, protocol.MethodWrite, &protocol.WriteParams{Path: guest + "/keep", Data: []byte("x")})
		p.fails(protocol.CodeIOFailed, protocol.MethodWrite, &protocol.WriteParams{Path: guest + "/new", Data: []byte("x")})
		if b, _ := os.ReadFile(filepath.Join(hostDir, "keep")); string(b) != "original" {
			t.Fatalf("the host's file changed: %q", b)
		}
		if _, err := os.Stat(filepath.Join(hostDir, "new")); err == nil {
			t.Fatal("a file appeared in the host's ro directory")
		}
	})

	t.Run("symlink out of a tree stays inside", func(t *testing.T) {
		outside := t.TempDir()
		if err := os.WriteFile(filepath.Join(outside, "host-only"), []byte("host data"), 0o644); err != nil {
			t.Fatal(err)
		}
		hostDir, guest, m := e.tree("links", false, nil)
		for name, target := range map[string]string{
			"abs":      filepath.Join(outside, "host-only"),
			"rel":      "../../../../../../../../.." + filepath.Join(outside, "host-only"),
			"absdir":   outside,
			"dangling": filepath.Join(outside, "made-through-a-link"),
			"shadow":   "/etc/shadow",
		} {
			if err := os.Symlink(target, filepath.Join(hostDir, name)); err != nil {
				t.Fatal(err)
			}
		}
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		for _, name := range []string{"abs", "rel", "shadow"} {
			m := p.call(protocol.MethodRead, &protocol.ReadParams{Path: guest + "/" + name})
			if m.Err == nil {
				t.Errorf("read through %s gave %q", name, m.Result.(*protocol.ReadResult).Data)
			}
			if r := p.exec("cat", guest+"/"+name); r.Code == 0 {
				t.Errorf("cat through %s gave %q", name, r.Stdout)
			}
		}
		// Writes through a link land inside the sandbox, never on the host.
		p.call(protocol.MethodWrite, &protocol.WriteParams{Path: guest + "/dangling", Data: []byte("x")})
		p.call(protocol.MethodWrite, &protocol.WriteParams{Path: guest + "/abs", Data: []byte("x")})
		p.exec("sh", "-c", "echo y > "+guest+"/absdir/made-by-command")
		if _, err := os.Stat(filepath.Join(outside, "made-through-a-link")); err == nil {
			t.Error("write through a dangling link made a file on the host")
		}
		if _, err := os.Stat(filepath.Join(outside, "made-by-command")); err == nil {
			t.Error("a command wrote through a link to the host")
		}
		if b, _ := os.ReadFile(filepath.Join(outside, "host-only")); string(b) != "host data" {
			t.Errorf("the host file became %q", b)
		}
	})

	t.Run("no capability to mount, load modules or rename the host", func(t *testing.T) {
		host, _ := os.Hostname()
		p := startPeer(t, "sandbox")
		for _, script := range []string{
			"mount -t tmpfs none /mnt",
			"mount --bind /usr /mnt",
			"umount /proc",
			"hostname escaped",
			"echo 1 > /proc/sys/kernel/panic",
			"echo b > /proc/sysrq-trigger",
		} {
			if r := p.exec("sh", "-c", script); r.Code == 0 {
				t.Errorf("%q succeeded inside the sandbox", script)
			}
		}
		// Module loading is CAP_SYS_MODULE (bit 16), and mounting CAP_SYS_ADMIN (21):
		// neither is in the bounding set, so no program can gain them.
		bnd := strings.TrimSpace(strings.TrimPrefix(p.sh("grep CapBnd /proc/self/status"), "CapBnd:"))
		caps, err := strconv.ParseUint(bnd, 16, 64)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []uint{16, 21, 19, 17, 25} { // SYS_MODULE, SYS_ADMIN, SYS_PTRACE, SYS_RAWIO, SYS_TIME
			if caps&(1<<c) != 0 {
				t.Errorf("capability %d is in the bounding set %s", c, bnd)
			}
		}
		if r := p.exec("sh", "-c", "grep NoNewPrivs /proc/self/status"); !strings.Contains(string(r.Stdout), "1") {
			t.Errorf("no_new_privs is not set: %q", r.Stdout)
		}
		if now, _ := os.Hostname(); now != host {
			t.Fatalf("the host's name changed to %q", now)
		}
		if got := trimNL(p.sh("hostname")); got == host {
			t.Errorf("the sandbox shares the host's name %q", got)
		}
	})

	t.Run("host loopback unreachable", func(t *testing.T) {
		port, _ := hostService(t, "host service\n")
		probe := fmt.Sprintf("import socket; s=socket.create_connection(('127.0.0.1', %d), timeout=2); print(s.recv(64))", port)
		for _, network := range []bool{false, true} {
			p := startPeer(t, "sandbox")
			p.init(&protocol.InitParams{Network: boolp(network)})
			if r := p.exec("python3", "-c", probe); r.Code == 0 {
				t.Errorf("network %v: a command reached the host's 127.0.0.1:%d: %s", network, port, r.Stdout)
			}
		}
	})
}

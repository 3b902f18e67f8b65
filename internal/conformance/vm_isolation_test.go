package conformance

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// TestVMIsolation checks what the VM keeps from the session: the host's processes and
// files, writes to ro trees however they are tried, the network when off, the host's
// loopback when on; and that bombs end inside the guest.
func TestVMIsolation(t *testing.T) {
	requireVM(t)

	t.Run("host-processes-and-files-invisible", func(t *testing.T) {
		marker := "virtx-host-marker-" + strconv.Itoa(os.Getpid())
		secret := filepath.Join(t.TempDir(), marker)
		if err := os.WriteFile(secret, []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
		sleeper := exec.Command("sleep", "1000.0"+strconv.Itoa(os.Getpid()))
		if err := sleeper.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
		p := startPeer(t, "vm")
		out := p.sh(`for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f 2>/dev/null; echo; done | grep -c "sleep 1000[.]0` + strconv.Itoa(os.Getpid()) + `" || true`)
		if trimNL(out) != "0" {
			t.Fatalf("the guest sees %s host processes of this test", trimNL(out))
		}
		r := p.exec("test", "-e", secret)
		if r.Code == 0 {
			t.Fatalf("the host file %s is visible in the guest", secret)
		}
		for _, f := range []string{"/etc/shadow", "/etc/ssh", "/etc/gshadow"} {
			if r := p.exec("test", "-e", f); r.Code == 0 {
				t.Errorf("%s is in the guest", f)
			}
		}
		if got := p.sh("ls -A /root /home | grep -v '^/\\|^$' | wc -l"); trimNL(got) != "0" {
			t.Errorf("/root or /home not empty in the guest: %q", p.sh("ls -A /root /home"))
		}
		if got := p.sh("ls /usr/bin | wc -l"); atoi(t, got) < 50 {
			t.Errorf("the host image has %s programs in /usr/bin", trimNL(got))
		}
	})

	t.Run("ro-tree-unwritable-even-by-root", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "ro")
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "keep"), []byte("original"), 0o644)
		p := startPeer(t, "vm")
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{{URL: "file://" + dir, GuestPath: "/data", ReadOnly: true}}})
		p.fails(protocol.CodeIOFailed, protocol.MethodWrite, &protocol.WriteParams{Path: "/data/keep", Data: []byte("x")})
		if r := p.exec("sh", "-c", "echo x > /data/keep"); r.Code == 0 {
			t.Fatal("a command wrote in an ro tree")
		}
		// The guest is root in its own kernel: it can remount the bind rw, or mount the
		// share again. The host side refuses all the same.
		r := p.exec("sh", "-c", "mount -o remount,rw,bind /data; echo y > /data/keep; echo y > /data/new; "+
			"mkdir -p /mnt/again && mount -t virtiofs virtx /mnt/again; echo z > /mnt/again/trees/0/keep; echo z > /mnt/again/base/usr/virtx-poke; true")
		if b, _ := os.ReadFile(filepath.Join(dir, "keep")); string(b) != "original" {
			t.Fatalf("ro tree changed on the host: %q (%s)", b, r.Stderr)
		}
		if _, err := os.Stat(filepath.Join(dir, "new")); err == nil {
			t.Fatal("a file was created in an ro tree on the host")
		}
		if _, err := os.Stat("/usr/virtx-poke"); err == nil {
			os.Remove("/usr/virtx-poke")
			t.Fatal("the guest wrote into the host's /usr")
		}
		if !strings.Contains(string(r.Stderr), "Read-only") {
			t.Fatalf("expected EROFS from the host side, stderr: %s", r.Stderr)
		}
	})

	t.Run("network-off-only-lo", func(t *testing.T) {
		p := startPeer(t, "vm")
		p.init(&protocol.InitParams{Network: boolp(false)})
		if got := strings.TrimSpace(p.sh("ls /sys/class/net")); got != "lo" {
			t.Fatalf("network off, interfaces: %q", got)
		}
	})

	t.Run("host-loopback-unreachable", func(t *testing.T) {
		port, accepted := hostService(t, "host-secret\n")
		p := startPeer(t, "vm")
		p.init(&protocol.InitParams{Network: boolp(true)})
		if got := p.sh("ls /sys/class/net | tr '\\n' ' '"); !strings.Contains(got, "eth0") {
			t.Fatalf("network on, interfaces: %q", got)
		}
		for _, addr := range []string{"10.0.2.2", "10.0.2.3", "10.0.2.255", "127.0.0.1"} {
			script := fmt.Sprintf(`import socket
s=socket.socket(); s.settimeout(3)
try:
    s.connect((%q,%d)); print("connected", s.recv(100))
except Exception as e:
    print("refused", e)`, addr, port)
			out := p.sh("python3 -c '" + script + "'")
			if strings.Contains(out, "host-secret") || strings.HasPrefix(out, "connected") {
				t.Errorf("%s:%d from the guest reached the host: %s", addr, port, out)
			}
		}
		if n := accepted.Load(); n != 0 {
			t.Fatalf("the host's loopback listener accepted %d connections from the guest", n)
		}
	})

	t.Run("fork-bomb-ends-inside", func(t *testing.T) {
		p := startPeer(t, "vm")
		p.exec("true")
		m := p.call(protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"sh", "-c", "b(){ b | b & }; b; sleep 60"}, TimeoutMS: u64(5000)})
		if m.Err != nil && m.Err.Code != protocol.CodeTimedOut {
			if m.Err.Code != protocol.CodeBootFailed {
				t.Fatalf("fork bomb: %v", m.Err)
			}
			t.Logf("the fork bomb took the guest down: %v", m.Err)
		}
		deadline := time.Now().Add(90 * time.Second)
		for {
			m := p.call(protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"echo", "alive"}})
			if m.Err == nil && string(m.Result.(*protocol.ExecResult).Stdout) == "alive\n" {
				break
			}
			if m.Err != nil && m.Err.Code == protocol.CodeBootFailed {
				t.Logf("after the fork bomb: %v (a clean BOOT_FAILED)", m.Err)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the session does not answer after a fork bomb: %v", m.Err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	})

	t.Run("memory-bomb-ends-inside", func(t *testing.T) {
		p := startPeer(t, "vm")
		p.init(&protocol.InitParams{MemoryMiB: u64(512)})
		r := p.exec("python3", "-c", "a=[]\nwhile True: a.append(bytearray(1<<24))")
		if r.Code != 137 {
			t.Fatalf("memory bomb: code %d stderr %s", r.Code, r.Stderr)
		}
		if got := p.sh("echo alive"); got != "alive\n" {
			t.Fatalf("after a memory bomb: %q", got)
		}
	})

	t.Run("output-flood-truncated", func(t *testing.T) {
		p := startPeer(t, "vm")
		r := p.exec("sh", "-c", "head -c 100000000 /dev/zero; echo done >&2")
		if !r.Truncated || len(r.Stdout) != 16<<20 || string(r.Stderr) != "done\n" {
			t.Fatalf("truncated=%v len=%d stderr=%q", r.Truncated, len(r.Stdout), r.Stderr)
		}
	})

	t.Run("disk-survives-stop", func(t *testing.T) {
		p := startPeer(t, "vm")
		p.init(&protocol.InitParams{DiskGiB: u64(2)})
		p.write("/root/kept", []byte("across stop"), nil)
		p.sh("echo by-command > /var/tmp/kept2")
		p.notify(protocol.MethodStop)
		if got := string(p.read("/root/kept", nil, nil).Data); got != "across stop" {
			t.Fatalf("after stop/boot: %q", got)
		}
		if got := p.sh("cat /var/tmp/kept2; df -k / | tail -1 | awk '{print $2}'"); !strings.HasPrefix(got, "by-command\n") {
			t.Fatalf("after stop/boot: %q", got)
		}
		// A new init is a new session: a new disk.
		p.init(&protocol.InitParams{})
		p.fails(protocol.CodeNotFound, protocol.MethodRead, &protocol.ReadParams{Path: "/root/kept"})
	})

	t.Run("machine-shape", func(t *testing.T) {
		p := startPeer(t, "vm")
		p.init(&protocol.InitParams{VCPUs: u64(1), MemoryMiB: u64(768)})
		if got := p.sh("nproc"); got != "1\n" {
			t.Errorf("nproc %q, want 1", got)
		}
		if kb := atoi(t, p.sh("awk '/MemTotal/{print $2}' /proc/meminfo")); kb < 600<<10 || kb > 768<<10 {
			t.Errorf("MemTotal %d kB for 768 MiB", kb)
		}
		p.fails(protocol.CodeUnsupportedMachine, protocol.MethodInit, &protocol.InitParams{GPU: boolp(true)})
		p.fails(protocol.CodeUnsupportedMachine, protocol.MethodInit, &protocol.InitParams{MemoryMiB: u64(1 << 30)})
	})
}

func atoi(t testing.TB, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}

// TestVMMissingQEMU checks that a host without QEMU gets a BOOT_FAILED naming the
// package to install, at the first call that needs a boot, and that init still works.
func TestVMMissingQEMU(t *testing.T) {
	requireVM(t)
	t.Setenv("PATH", t.TempDir())
	p := startPeer(t, "vm")
	p.init(&protocol.InitParams{})
	err := p.fails(protocol.CodeBootFailed, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"true"}})
	if !strings.Contains(err.Message, "apt-get install qemu-system-x86") {
		t.Fatalf("the message does not name the fix: %q", err.Message)
	}
}

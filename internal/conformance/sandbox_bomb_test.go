package conformance

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// TestSandboxBombs: what a hostile command does to the machine stays inside the session's
// limits, and the session answers the next command.
func TestSandboxBombs(t *testing.T) {
	requireSandbox(t)
	requireLimits(t)
	t.Setenv("VIRTX_HOME", t.TempDir())

	t.Run("fork bomb", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{})
		p.exec("true") // booted
		pids := sessionGroup(t, p, "pids")
		// Forks (and execs a sleeper) until fork fails, then holds on: bounded by the
		// pids limit, and by the timeout.
		bomb := `import os, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep", "60"])
        finally:
            os._exit(0)
    n += 1
time.sleep(60)`
		ms := uint64(10000)
		done := make(chan *protocol.Message, 1)
		go func() {
			done <- p.call(protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"python3", "-c", bomb}, TimeoutMS: &ms})
		}()
		// Wait for the limit to be hit (pids.events "max"), then fork on the host.
		hit := false
		deadline := time.Now().Add(9 * time.Second)
		for !hit && time.Now().Before(deadline) {
			b, _ := os.ReadFile(filepath.Join(pids, "pids.events"))
			f := strings.Fields(string(b))
			hit = len(f) == 2 && f[1] != "0"
			time.Sleep(50 * time.Millisecond)
		}
		if !hit {
			t.Fatal("the fork bomb never reached the pids limit")
		}
		cur, _ := os.ReadFile(filepath.Join(pids, "pids.current"))
		if n, _ := strconv.Atoi(strings.TrimSpace(string(cur))); n > 4096 {
			t.Errorf("pids.current %d above the limit", n)
		}
		for i := range 20 {
			if err := exec.Command("true").Run(); err != nil {
				t.Fatalf("the host cannot fork during the bomb (try %d): %v", i, err)
			}
		}
		m := <-done
		if m.Err == nil || m.Err.Code != protocol.CodeTimedOut {
			t.Fatalf("the bomb's exec: %+v, want TIMED_OUT", m)
		}
		if r := p.exec("true"); r.Code != 0 {
			t.Fatalf("after the fork bomb: exit %d", r.Code)
		}
		if got := groupProcs(t, pids); len(got) > 1 {
			t.Errorf("the bomb left %d processes in the session's cgroup", len(got)-1)
		}
	})

	t.Run("memory bomb", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{MemoryMiB: u64(256)})
		r := p.exec("python3", "-c", "a = []\nwhile True: a.append(bytearray(16 << 20))")
		if r.Code != 137 {
			t.Fatalf("memory bomb: exit %d, want 137 (OOM-killed); stderr %q", r.Code, r.Stderr)
		}
		if r := p.exec("echo", "alive"); r.Code != 0 || string(r.Stdout) != "alive\n" {
			t.Fatalf("after the memory bomb: %+v", r)
		}
		mem := sessionGroup(t, p, "memory")
		if got := cgFile(t, mem, "memory.oom_control", "memory.events"); !strings.Contains(got, "oom_kill 1") && !strings.Contains(got, "oom_kill ") {
			t.Errorf("no OOM kill counted: %s", got)
		}
	})

	t.Run("disk fill", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{DiskGiB: u64(1)})
		r := p.exec("sh", "-c", "dd if=/dev/zero of=/root/fill bs=1M 2>&1; stat -c %s /root/fill")
		out := string(r.Stdout)
		if r.Code != 0 || !strings.Contains(out, "No space left on device") {
			t.Fatalf("disk fill: exit %d, %q", r.Code, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		size, _ := strconv.ParseInt(lines[len(lines)-1], 10, 64)
		if size > 1<<30 || size < 1<<29 {
			t.Errorf("filled %d bytes, want about 1 GiB", size)
		}
		p.sh("rm /root/fill")
		if r := p.exec("sh", "-c", "echo ok > /root/after && cat /root/after"); string(r.Stdout) != "ok\n" {
			t.Fatalf("after the fill: %+v", r)
		}
	})

	t.Run("output flood", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{})
		p.exec("true")
		base := vmHWM(t, p.cmd.Process.Pid)
		r := p.exec("sh", "-c", "head -c 104857600 /dev/zero; head -c 104857600 /dev/zero >&2")
		if !r.Truncated || len(r.Stdout) >= 100<<20 || len(r.Stderr) >= 100<<20 {
			t.Fatalf("truncated=%v stdout %d stderr %d", r.Truncated, len(r.Stdout), len(r.Stderr))
		}
		hwm := vmHWM(t, p.cmd.Process.Pid)
		t.Logf("server VmHWM %d KiB before, %d KiB after 2×100 MiB of output (kept %d+%d bytes)", base, hwm, len(r.Stdout), len(r.Stderr))
		// What is kept (two 16 MiB streams) is held and encoded a few times over; the
		// 200 MiB written is never held.
		if grow := hwm - base; grow > 160<<10 {
			t.Errorf("the server's peak RSS grew by %d KiB", grow)
		}
	})
}

// vmHWM is a process's peak resident set in KiB (/proc/PID/status VmHWM).
func vmHWM(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

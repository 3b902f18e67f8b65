package conformance

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"virtx.dev/virtx/internal/linux/cgroup"
	"virtx.dev/virtx/protocol"
)

// sandboxNoLimitsEnv is the sandbox's NoLimitsEnv: set to 1 in the server's environment,
// a session that asks for no limits runs without any where none can be enforced.
const sandboxNoLimitsEnv = "VIRTX_SANDBOX_NO_LIMITS"

// The sandbox enforces vcpus and memory_mib with cgroups; where this process cannot make
// them (rootless on a cgroup v1 host, rootless without a delegated v2 cgroup) the sandbox
// refuses a machine shape with -32013, and the suite's target says so.
func init() {
	if sandboxLimits() {
		return
	}
	tg := targets["sandbox"]
	tg.unsupported["init/machine-shape"] = "this host cannot enforce cgroup limits for this user (" + cgroup.Detect().Reason + "): the sandbox answers -32013"
	tg.codes["machine-shape"] = protocol.CodeUnsupportedMachine
}

func sandboxLimits() bool {
	i := cgroup.Detect()
	return i.Version != 0 && i.Writable && i.Reason == ""
}

// requireLimits skips (fails in CI as root) where cgroup limits cannot be enforced.
func requireLimits(t *testing.T) {
	t.Helper()
	if sandboxLimits() {
		return
	}
	if os.Geteuid() == 0 && os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing in CI: cgroup limits: %s", cgroup.Detect().Reason)
	}
	t.Skipf("cgroup limits cannot be enforced here: %s", cgroup.Detect().Reason)
}

// sessionGroup is the directory of the cgroup of the one session p's server runs, in the
// hierarchy that holds ctrl's files (v1), or the group's only one (v2).
func sessionGroup(t *testing.T, p *peer, ctrl string) string {
	t.Helper()
	info := cgroup.Detect()
	root := info.Root
	if info.Version == 1 {
		root = filepath.Join(filepath.Dir(filepath.Dir(root)), ctrl, filepath.Base(root))
	}
	pattern := filepath.Join(root, "sandbox-*@"+strconv.Itoa(p.cmd.Process.Pid)+"-*")
	for range 100 {
		m, _ := filepath.Glob(pattern)
		if len(m) == 1 {
			return m[0]
		}
		if len(m) > 1 {
			t.Fatalf("%d groups for one session: %v", len(m), m)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no cgroup %s", pattern)
	return ""
}

// cgFile reads a group's interface file: v1 name, else v2 name.
func cgFile(t *testing.T, dir, v1, v2 string) string {
	t.Helper()
	name := v1
	if cgroup.Detect().Version == 2 {
		name = v2
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// groupProcs lists the processes in a session's group.
func groupProcs(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// TestSandboxMachineShape: vcpus and memory_mib become the session's cgroup limits (CPU
// quota, cpuset, memory), with a pids limit; the defaults when unset; a shape the host
// cannot give is refused, never made smaller; the group goes with the session.
func TestSandboxMachineShape(t *testing.T) {
	requireSandbox(t)
	requireLimits(t)
	t.Setenv("VIRTX_HOME", t.TempDir())
	ncpu := len(hostCPUList())

	t.Run("asked", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{VCPUs: u64(1), MemoryMiB: u64(512)})
		if got := trimNL(p.sh("nproc")); got != "1" {
			t.Errorf("nproc %s, want 1", got)
		}
		if got := cgFile(t, sessionGroup(t, p, "memory"), "memory.limit_in_bytes", "memory.max"); got != strconv.Itoa(512<<20) {
			t.Errorf("memory limit %s", got)
		}
		cpu := sessionGroup(t, p, "cpu")
		if got := cgFile(t, cpu, "cpu.cfs_quota_us", "cpu.max"); !strings.HasPrefix(got, "100000") {
			t.Errorf("cpu quota %s", got)
		}
		if got := cgFile(t, sessionGroup(t, p, "pids"), "pids.max", "pids.max"); got != "4096" {
			t.Errorf("pids.max %s", got)
		}
		dir := sessionGroup(t, p, "memory")
		p.notify(protocol.MethodStop)
		if !gone(dir) {
			t.Errorf("stop left the session's cgroup %s", dir)
		}
		p.exec("true") // boots again, in a new group
		dir = sessionGroup(t, p, "memory")
		p.notify(protocol.MethodQuit)
		<-p.done
		if !gone(dir) {
			t.Errorf("quit left the session's cgroup %s", dir)
		}
	})

	t.Run("defaults", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		want := min(2, ncpu)
		if got := trimNL(p.sh("nproc")); got != strconv.Itoa(want) {
			t.Errorf("nproc %s, want %d", got, want)
		}
		if got := cgFile(t, sessionGroup(t, p, "memory"), "memory.limit_in_bytes", "memory.max"); got != strconv.Itoa(2048<<20) {
			t.Errorf("default memory limit %s, want 2048 MiB", got)
		}
	})

	t.Run("refused", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		for _, ip := range []*protocol.InitParams{
			{VCPUs: u64(uint64(ncpu) + 1)},
			{MemoryMiB: u64(1 << 30)},
			{GPU: boolp(true), GPUMemoryMiB: u64(1024)},
		} {
			p.fails(protocol.CodeUnsupportedMachine, protocol.MethodInit, ip)
		}
		if m, _ := filepath.Glob("/dev/nvidia[0-9]*"); len(m) == 0 {
			e := p.fails(protocol.CodeUnsupportedMachine, protocol.MethodInit, &protocol.InitParams{GPU: boolp(true)})
			if !strings.Contains(e.Message, "NVIDIA") {
				t.Errorf("gpu refusal does not say why: %s", e.Message)
			}
		}
		p.exec("true")
	})
}

func hostCPUList() []int {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			var out []int
			for _, r := range strings.Split(strings.TrimSpace(v), ",") {
				a, bb, found := strings.Cut(r, "-")
				lo, _ := strconv.Atoi(a)
				hi := lo
				if found {
					hi, _ = strconv.Atoi(bb)
				}
				for i := lo; i <= hi; i++ {
					out = append(out, i)
				}
			}
			return out
		}
	}
	return nil
}

// TestSandboxTimeoutKillsDaemons: a command that times out takes what it daemonised with
// it (found through the session's cgroup), while what an earlier command left running
// stays.
func TestSandboxTimeoutKillsDaemons(t *testing.T) {
	requireSandbox(t)
	requireLimits(t)
	t.Setenv("VIRTX_HOME", t.TempDir())
	p := startPeer(t, "sandbox")
	p.init(&protocol.InitParams{})
	p.sh(`setsid sh -c "sleep 1001 >/dev/null 2>&1 &"`) // an earlier daemon: it stays
	dir := sessionGroup(t, p, "pids")
	before := len(groupProcs(t, dir))
	ms := uint64(500)
	p.fails(protocol.CodeTimedOut, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"sh", "-c", `setsid sh -c "sleep 1000 &" ; sleep 1000`}, TimeoutMS: &ms})
	if got := groupProcs(t, dir); len(got) != before {
		t.Errorf("after the timeout the session's cgroup holds %d processes (before the command: %d): %v", len(got), before, got)
	}
	if got := p.sh(`ps -eo args | grep -c '^sleep 100[01]' || true`); trimNL(got) != "1" {
		t.Errorf("sleepers left: %s (want only the earlier daemon)", got)
	}
}

// TestSandboxRootlessLimits runs in TestSandboxRootless's run as an ordinary user: on a
// host where that user cannot get cgroup limits, every session is refused with -32013
// naming the fix — the default machine is a limit too — unless the server is told to run
// sessions that ask nothing without limits; a session that asks for vcpus or memory_mib
// is refused either way.
func TestSandboxRootlessLimits(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("runs rootless (TestSandboxRootless runs it)")
	}
	requireSandbox(t)
	if sandboxLimits() {
		t.Skip("this user can enforce cgroup limits here")
	}
	t.Setenv("VIRTX_HOME", t.TempDir())
	t.Setenv(sandboxNoLimitsEnv, "")
	p := startPeer(t, "sandbox")
	e := p.fails(protocol.CodeUnsupportedMachine, protocol.MethodInit, &protocol.InitParams{})
	for _, fix := range []string{"root", sandboxNoLimitsEnv} {
		if !strings.Contains(e.Message, fix) {
			t.Errorf("the refusal does not name %q: %s", fix, e.Message)
		}
	}
	t.Setenv(sandboxNoLimitsEnv, "1")
	p = startPeer(t, "sandbox")
	p.fails(protocol.CodeUnsupportedMachine, protocol.MethodInit, &protocol.InitParams{VCPUs: u64(1)})
	p.fails(protocol.CodeUnsupportedMachine, protocol.MethodInit, &protocol.InitParams{MemoryMiB: u64(512)})
	p.init(&protocol.InitParams{})
	p.exec("true")
}

// gone waits up to 5 s for path to disappear.
func gone(path string) bool {
	for range 500 {
		if _, err := os.Stat(path); err != nil {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// TestSandboxKilledServerLeavesNoCgroup: a SIGKILLed server's session cgroups are gone
// shortly after, in every hierarchy, with no other server started to reap them.
func TestSandboxKilledServerLeavesNoCgroup(t *testing.T) {
	requireSandbox(t)
	requireLimits(t)
	t.Setenv("VIRTX_HOME", t.TempDir())
	p := startPeer(t, "sandbox")
	p.init(&protocol.InitParams{})
	p.sh("setsid sh -c 'sleep 1002' >/dev/null 2>&1 </dev/null &")
	p.sendDoc(protocol.AppendRequest(nil, p.nextID, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"sleep", "1003"}}))
	p.nextID++
	info := cgroup.Detect()
	pattern := "*@" + strconv.Itoa(p.cmd.Process.Pid) + "-*"
	dirs, _ := filepath.Glob(filepath.Join(info.Root, pattern))
	more, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(info.Root)), "*", filepath.Base(info.Root), pattern))
	dirs = append(dirs, more...)
	if len(dirs) == 0 {
		t.Fatal("no session cgroup found")
	}
	time.Sleep(100 * time.Millisecond)
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	for _, d := range dirs {
		if !gone(d) {
			t.Errorf("the killed server's cgroup %s is still there", d)
		}
	}
}

// TestSandboxSessionsLeaveNoCgroup: sessions opened and closed in a loop (quit, or the
// client's stdin closed) leave no cgroup behind, in any hierarchy.
func TestSandboxSessionsLeaveNoCgroup(t *testing.T) {
	requireSandbox(t)
	requireLimits(t)
	t.Setenv("VIRTX_HOME", t.TempDir())
	info := cgroup.Detect()
	var patterns []string
	for i := range 30 {
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{Network: boolp(i%3 != 0)})
		p.sh("(sleep 1004 >/dev/null 2>&1 &)")
		pattern := "*@" + strconv.Itoa(p.cmd.Process.Pid) + "-*"
		patterns = append(patterns, filepath.Join(info.Root, pattern),
			filepath.Join(filepath.Dir(filepath.Dir(info.Root)), "*", filepath.Base(info.Root), pattern))
		if i%2 == 0 {
			p.notify(protocol.MethodQuit)
		} else {
			p.stdin.Close()
		}
		p.expectEOF()
	}
	for _, pat := range patterns {
		for range 100 {
			if m, _ := filepath.Glob(pat); len(m) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if m, _ := filepath.Glob(pat); len(m) > 0 {
			t.Errorf("left behind: %v", m)
		}
	}
}

// TestSandboxRealTimeServer: a server run under a real-time policy (chrt) still boots
// sandboxes, and their commands run under the normal policy: a session never inherits
// the server's priority (it could starve the host, and on a v1 host with RT group
// scheduling a real-time task cannot join the session's cpu cgroup at all).
func TestSandboxRealTimeServer(t *testing.T) {
	requireSandbox(t)
	requireLimits(t)
	if os.Geteuid() != 0 {
		t.Skip("setting a real-time policy needs root")
	}
	cmd := exec.Command("chrt", "-f", "10", virtxBin, "run", "--backend", "sandbox", "--network=false", "--",
		"sh", "-c", "cat /proc/self/sched | grep '^policy'")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("under chrt -f 10: %v: %s%s", err, out, stderr.String())
	}
	if f := strings.Fields(string(out)); len(f) != 3 || f[2] != "0" {
		t.Fatalf("the session's policy: %q, want 0 (SCHED_NORMAL)", out)
	}
}

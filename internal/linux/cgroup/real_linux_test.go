package cgroup

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Tests against this machine's kernel. They need root and the controllers they use; a
// missing prerequisite skips locally and fails with CI=true. Every group is destroyed and
// every process killed in t.Cleanup, also when a test fails.

// helperEnv makes the test binary a helper process instead of running tests.
const helperEnv = "VIRTX_CGROUP_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "detect":
		json.NewEncoder(os.Stdout).Encode(Detect())
		os.Exit(0)
	case "delegated":
		json.NewEncoder(os.Stdout).Encode(delegatedHelper())
		os.Exit(0)
	case "mainthread":
		json.NewEncoder(os.Stdout).Encode(mainThreadHelper())
		os.Exit(0)
	case "alloc":
		// Wait to be told (after joining the group), then touch MiB after MiB forever.
		io.ReadFull(os.Stdin, make([]byte, 1))
		var keep [][]byte
		for {
			b := make([]byte, 1<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			keep = append(keep, b)
		}
	}
	os.Exit(2)
}

// need fails the test under CI=true and skips it otherwise, naming what is missing.
func need(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("missing prerequisite: %s", what)
	}
	t.Skipf("missing prerequisite: %s", what)
}

// needHost checks this process can make groups with ctrls here and returns the host system.
func needHost(t *testing.T, ctrls ...string) *system {
	t.Helper()
	need(t, os.Geteuid() == 0, "root (cgroup limits need it on this host)")
	info := Detect()
	need(t, info.Writable, "a writable cgroup hierarchy: "+info.Reason)
	for _, c := range ctrls {
		need(t, info.Has(c), "the "+c+" cgroup controller")
	}
	return host()
}

// testName is a group name unique to this test run, saying which test made it.
func testName(t *testing.T) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimPrefix(t.Name(), "Test")) {
		if b.Len() < 24 && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			b.WriteRune(r)
		}
	}
	return fmt.Sprintf("test-%s-%08x", b.String(), rand.Uint32())
}

// newGroup creates a group and destroys it when the test ends.
func newGroup(t *testing.T, s *system, lim Limits) *Group {
	t.Helper()
	g, err := s.create(testName(t), lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Destroy(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, d := range g.dirs {
			if _, err := os.Stat(d); err == nil {
				t.Errorf("cleanup left %s", d)
			}
		}
	})
	return g
}

// gated starts a command that waits for a byte on stdin before it does anything, so it can
// be added to a group first; go releases it. The process is killed and reaped at the end.
func gated(t *testing.T, cmd *exec.Cmd) (release func()) {
	t.Helper()
	w, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return func() { w.Write([]byte("go\n")); w.Close() }
}

// shell is sh -c script, gated: the script runs after `read`.
func shell(script string) *exec.Cmd {
	return exec.Command("/bin/sh", "-c", "read _ && "+script)
}

func TestRealDetectMatchesThisHost(t *testing.T) {
	need(t, os.Geteuid() == 0, "root")
	info := Detect()
	t.Logf("Detect() = %+v", info)
	var st unix.Statfs_t
	must(t, unix.Statfs("/sys/fs/cgroup", &st))
	var mem unix.Statfs_t
	memErr := unix.Statfs("/sys/fs/cgroup/memory", &mem)
	switch {
	case memErr == nil && mem.Type == unix.CGROUP_SUPER_MAGIC:
		if info.Version != 1 || info.Root != "/sys/fs/cgroup/memory/virtx" {
			t.Errorf("memory is a v1 hierarchy here, Detect = %+v", info)
		}
	case st.Type == unix.CGROUP2_SUPER_MAGIC:
		if info.Version != 2 || info.Root != "/sys/fs/cgroup/virtx" {
			t.Errorf("a v2-only host, Detect = %+v", info)
		}
	}
	if !info.Writable || info.Reason != "" {
		t.Errorf("as root on a host with memory, pids and cpu: Writable=%v Reason=%q", info.Writable, info.Reason)
	}
}

func TestRealMemoryLimitOOMKills(t *testing.T) {
	s := needHost(t, "memory")
	g := newGroup(t, s, Limits{MemoryBytes: 64 << 20})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=alloc", "GOMEMLIMIT=off", "GOGC=off")
	release := gated(t, cmd)
	must(t, g.Add(cmd.Process.Pid))
	release()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("allocating past the limit ended with %v, want killed", err)
		}
		ws := ee.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("allocating past the limit: %v, want killed by SIGKILL", ws)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a process allocating without end was not killed in 60 s: the memory limit is not enforced")
	}
	n, err := g.OOMKills()
	if err != nil || n < 1 {
		t.Errorf("OOMKills = %d, %v; want at least 1", n, err)
	}
}

func TestRealPidsLimitStopsForkBomb(t *testing.T) {
	s := needHost(t, "pids")
	const limit = 32
	g := newGroup(t, s, Limits{Pids: limit, MemoryBytes: 256 << 20})
	// The classic bomb, only ever inside the group: each f starts two more, in the background.
	bomb := shell(`f() { f | f & }; f; sleep 30`)
	bomb.Stderr = io.Discard
	release := gated(t, bomb)
	must(t, g.Add(bomb.Process.Pid))
	release()
	// Let it run into the limit.
	pidsDir := g.Path()
	if g.v2limits {
		pidsDir = g.v2
	} else {
		pidsDir = filepath.Join(s.layout().v1["pids"], parentName, g.dirName)
	}
	waitPidsMax(t, pidsDir)
	// The host can still fork while the bomb presses against its limit.
	for i := range 5 {
		if out, err := exec.Command("/bin/true").CombinedOutput(); err != nil {
			t.Fatalf("the host could not fork (try %d) during the bomb: %v %s", i, err, out)
		}
	}
	cur, err := readFile(filepath.Join(pidsDir, "pids.current"))
	must(t, err)
	if n, _ := strconv.Atoi(strings.TrimSpace(cur)); n > limit {
		t.Errorf("pids.current = %d, over the limit %d", n, limit)
	}
	start := time.Now()
	must(t, g.Kill())
	t.Logf("killed the bomb in %v", time.Since(start))
	if pids, err := g.Procs(); err != nil || len(pids) != 0 {
		t.Errorf("after Kill: %v, %v", pids, err)
	}
}

func TestRealCPUQuotaAndCPUSetWritten(t *testing.T) {
	s := needHost(t, "cpu", "cpuset")
	g := newGroup(t, s, Limits{CPUs: 1.5, CPUSet: "0"})
	l := s.layout()
	var checks map[string]string
	if g.v2limits {
		checks = map[string]string{filepath.Join(g.v2, "cpu.max"): "150000 100000", filepath.Join(g.v2, "cpuset.cpus"): "0"}
	} else {
		cpu := filepath.Join(l.v1["cpu"], parentName, g.dirName)
		cs := filepath.Join(l.v1["cpuset"], parentName, g.dirName)
		mems, err := readFile(filepath.Join(l.v1["cpuset"], "cpuset.mems"))
		must(t, err)
		checks = map[string]string{
			filepath.Join(cpu, "cpu.cfs_quota_us"):  "150000",
			filepath.Join(cpu, "cpu.cfs_period_us"): "100000",
			filepath.Join(cs, "cpuset.cpus"):        "0",
			filepath.Join(cs, "cpuset.mems"):        strings.TrimSpace(mems),
		}
	}
	for f, want := range checks {
		got, err := readFile(f)
		if err != nil || strings.TrimSpace(got) != want {
			t.Errorf("%s = %q, %v; want %q", f, got, err, want)
		}
	}
	// A process joins the cpuset and is pinned.
	cmd := exec.Command("/bin/sleep", "30")
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	must(t, g.Add(cmd.Process.Pid))
	var set unix.CPUSet
	must(t, unix.SchedGetaffinity(cmd.Process.Pid, &set))
	if set.Count() != 1 || !set.IsSet(0) {
		t.Errorf("affinity after joining cpuset 0: %d CPUs, cpu0=%v", set.Count(), set.IsSet(0))
	}
}

func TestRealKillDoubleForkedDaemon(t *testing.T) {
	s := needHost(t)
	g := newGroup(t, s, Limits{Pids: 64})
	testKillDaemon(t, g)
}

// testKillDaemon starts a shell that double-forks a daemon (setsid, parent gone), has the
// group kill it, and checks that the daemon is dead and the group empty.
func testKillDaemon(t *testing.T, g *Group) {
	t.Helper()
	cmd := shell(`(setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!) ; exit 0`)
	out, err := cmd.StdoutPipe()
	must(t, err)
	release := gated(t, cmd)
	must(t, g.Add(cmd.Process.Pid))
	release()
	line, err := bufio.NewReader(out).ReadString('\n')
	must(t, err)
	daemon, err := strconv.Atoi(strings.TrimSpace(line))
	must(t, err)
	cmd.Wait() // the shell is gone; the daemon's parent is not us
	t.Cleanup(func() { unix.Kill(daemon, unix.SIGKILL) })
	pids, err := g.Procs()
	must(t, err)
	if len(pids) != 1 || pids[0] != daemon {
		t.Fatalf("Procs = %v, want the daemon %d alone", pids, daemon)
	}
	must(t, g.Kill())
	if pids, err := g.Procs(); err != nil || len(pids) != 0 {
		t.Errorf("Procs after Kill = %v, %v", pids, err)
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", daemon)); err == nil {
		if i := strings.LastIndexByte(string(st), ')'); i < 0 || !strings.ContainsAny(string(st[i+2]), "ZX") {
			t.Errorf("daemon %d still alive: %s", daemon, st)
		}
	}
}

func TestRealDestroyLeavesNothing(t *testing.T) {
	s := needHost(t, "memory", "pids")
	g, err := s.create(testName(t), Limits{MemoryBytes: 128 << 20, Pids: 100, CPUs: 1})
	must(t, err)
	t.Cleanup(func() { g.Destroy() })
	cmd := exec.Command("/bin/sleep", "300")
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	must(t, g.Add(cmd.Process.Pid))
	// A child group made inside (as a session with its own cgroup namespace might).
	inner := filepath.Join(g.Path(), "inner")
	must(t, s.mkdir(inner))
	must(t, g.Destroy())
	if err := cmd.Wait(); err == nil {
		t.Error("the process in the group was not killed")
	}
	must(t, g.Destroy()) // idempotent
	matches, _ := filepath.Glob("/sys/fs/cgroup/*/" + parentName + "/" + g.dirName)
	more, _ := filepath.Glob("/sys/fs/cgroup/" + parentName + "/" + g.dirName)
	if len(matches)+len(more) != 0 || len(g.dirs) == 0 {
		t.Errorf("left behind: %v %v (group had %v)", matches, more, g.dirs)
	}
}

func TestRealReapStale(t *testing.T) {
	s := needHost(t)
	// A "server" that made a group and died: a child process stands in for it.
	srv := exec.Command("/bin/sleep", "300")
	must(t, srv.Start())
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	st, err := startTime("/proc", srv.Process.Pid)
	must(t, err)
	dead := newHostSystem()
	dead.self = owner{srv.Process.Pid, st}
	stale := newGroup(t, dead, Limits{Pids: 10})
	orphan := exec.Command("/bin/sleep", "300") // left running in it
	must(t, orphan.Start())
	t.Cleanup(func() { orphan.Process.Kill(); orphan.Wait() })
	must(t, stale.Add(orphan.Process.Pid))
	live := newGroup(t, s, Limits{Pids: 10}) // ours: we live

	// While the owner lives nothing of it is reaped.
	if _, err := s.reapStale(); err != nil {
		t.Fatal(err)
	}
	if !exists(stale.Path()) {
		t.Fatal("reaped the group of a live owner")
	}
	must(t, srv.Process.Kill())
	srv.Wait()
	n, err := s.reapStale()
	if err != nil || n < 1 {
		t.Fatalf("reapStale = %d, %v; want at least the dead owner's group", n, err)
	}
	for _, d := range stale.dirs {
		if exists(d) {
			t.Errorf("stale %s still there", d)
		}
	}
	if err := orphan.Wait(); err == nil {
		t.Error("the process left in the stale group was not killed")
	}
	for _, d := range live.dirs {
		if !exists(d) {
			t.Errorf("live %s was removed", d)
		}
	}
}

// newHostSystem is a fresh system looking at the real host (host() is the shared one).
func newHostSystem() *system {
	s := &system{mountinfo: "/proc/self/mountinfo", selfCgroup: "/proc/self/cgroup", proc: "/proc",
		euid: os.Geteuid(), write: writeFile, mkdir: realMkdir, rmdir: realRmdir, sigkill: realSigkill}
	s.self = host().self
	return s
}

// TestRealRootlessDetect runs Detect as an unprivileged user on this kernel: on a v1 (or
// hybrid) host it must say limits cannot be enforced and why; on a v2 host, that the
// user's cgroup is not delegated (nothing here delegates one to nobody).
func TestRealRootlessDetect(t *testing.T) {
	need(t, os.Geteuid() == 0, "root (to run the check as another user)")
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755)) // t.TempDir's own parent is private too
	bin := filepath.Join(dir, "cgroup.test")
	b, err := os.ReadFile(os.Args[0])
	must(t, err)
	must(t, os.WriteFile(bin, b, 0o755))
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=detect")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("running Detect as uid 65534: %v", err)
	}
	var info Info
	must(t, json.Unmarshal(out, &info))
	t.Logf("as uid 65534: %+v", info)
	if info.Writable {
		t.Fatalf("uid 65534 may write cgroups here? %+v", info)
	}
	switch info.Version {
	case 1:
		if !strings.Contains(info.Reason, "run virtx as root") {
			t.Errorf("Reason = %q, want the v1 fix", info.Reason)
		}
	case 2:
		if !strings.Contains(info.Reason, "systemd-run --user --scope -p Delegate=yes") {
			t.Errorf("Reason = %q, want the delegation fix", info.Reason)
		}
	default:
		t.Errorf("Version = %d", info.Version)
	}
}

// waitPidsMax waits (5 s at most) until the pids group in dir has refused a fork.
func waitPidsMax(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; {
		n, err := keyed(filepath.Join(dir, "pids.events"), "max")
		must(t, err)
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the bomb never hit the pids limit in 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

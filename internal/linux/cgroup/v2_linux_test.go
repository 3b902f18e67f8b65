package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The v2 driver against the fake kernel: what a v2-only host (most users' machines) is asked.

func TestFakeV2RootWritesLimits(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/system.slice/virtx.service", false)
	info := s.layout().info
	if info.Version != 2 || !info.Writable || info.Reason != "" {
		t.Fatalf("Detect = %+v, want a writable v2 with no reason", info)
	}
	if want := []string{"cpu", "cpuset", "memory", "pids"}; strings.Join(info.Controllers, ",") != strings.Join(want, ",") {
		t.Errorf("Controllers = %v, want %v", info.Controllers, want)
	}
	if info.Root != fk.path("virtx") {
		t.Errorf("Root = %q, want %q (root's groups go under the hierarchy's root)", info.Root, fk.path("virtx"))
	}
	g, err := s.create("sess-1", Limits{MemoryBytes: 256 << 20, CPUs: 1.5, CPUSet: "0-1", Pids: 4096})
	if err != nil {
		t.Fatal(err)
	}
	rel := "virtx/" + groupDir("sess-1", s.self)
	if g.Path() != fk.path(rel) {
		t.Errorf("Path = %q, want %q", g.Path(), fk.path(rel))
	}
	for _, c := range []struct{ rel, file, want string }{
		{"", "cgroup.subtree_control", "cpuset cpu memory pids"},
		{"virtx", "cgroup.subtree_control", "cpuset cpu memory pids"},
		{rel, "memory.max", "268435456"},
		{rel, "memory.swap.max", "0"},
		{rel, "cpu.max", "150000 100000"},
		{rel, "cpuset.cpus", "0-1"},
		{rel, "pids.max", "4096"},
	} {
		if got := strings.TrimSpace(fk.get(c.rel, c.file)); got != c.want {
			t.Errorf("%s/%s = %q, want %q", c.rel, c.file, got, c.want)
		}
	}
	if _, err := os.Stat(fk.path("virtx-server")); err == nil {
		t.Error("root moved processes to a leaf; the hierarchy's root holds processes legitimately")
	}
}

func TestFakeV2UnlimitedGroupStillTracks(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/", false)
	g, err := s.create("plain", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rel := "virtx/" + groupDir("plain", s.self)
	// memory and pids are enabled (OOM and task counts) but no limit is written.
	if got := strings.TrimSpace(fk.get(rel, "memory.max")); got != "max" {
		t.Errorf("memory.max = %q, want max", got)
	}
	if got := strings.TrimSpace(fk.get(rel, "pids.max")); got != "max" {
		t.Errorf("pids.max = %q, want max", got)
	}
	if _, err := os.Stat(filepath.Join(g.Path(), "cpu.max")); err == nil {
		t.Error("cpu enabled without a CPU limit")
	}
}

func TestFakeV2AddProcsKillDestroy(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/", false)
	g, err := s.create("k", Limits{Pids: 10})
	if err != nil {
		t.Fatal(err)
	}
	rel := "virtx/" + groupDir("k", s.self)
	if err := g.Add(4242); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(fk.get(rel, "cgroup.procs")); got != "4242" {
		t.Errorf("cgroup.procs after Add = %q, want 4242", got)
	}
	// A group made inside it (the session's own cgroup namespace doing so) counts too.
	fk.cg(rel+"/inner", 0, "", "4343\n")
	pids, err := g.Procs()
	if err != nil || len(pids) != 2 || pids[0] != 4242 || pids[1] != 4343 {
		t.Fatalf("Procs = %v, %v; want [4242 4343]", pids, err)
	}
	if pop, _ := v2populated(g.Path()); !pop {
		t.Error("cgroup.events not populated with processes in it")
	}
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	if got := fk.get(rel, "cgroup.kill"); got != "1" {
		t.Errorf("cgroup.kill = %q, want 1 written", got)
	}
	if pids, _ := g.Procs(); len(pids) != 0 {
		t.Errorf("Procs after Kill = %v", pids)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("group still there after Destroy: %v", err)
	}
	if err := g.Destroy(); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
}

func TestFakeV2KillWithoutCgroupKill(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/", false)
	fk.noKil = true // a kernel before 5.14
	g, err := s.create("old", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rel := "virtx/" + groupDir("old", s.self)
	must(t, g.Add(11))
	must(t, g.Add(12))
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	if len(fk.killed) != 2 || fk.killed[0] != 11 || fk.killed[1] != 12 {
		t.Errorf("signalled %v, want [11 12]", fk.killed)
	}
	if got := strings.TrimSpace(fk.get(rel, "cgroup.freeze")); got != "0" {
		t.Errorf("cgroup.freeze = %q after Kill, want 0 (thawed, so the group can be used again)", got)
	}
}

func TestFakeV2OOMKills(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/", false)
	g, err := s.create("oom", Limits{MemoryBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	fk.put("virtx/"+groupDir("oom", s.self), "memory.events", "low 0\nhigh 0\nmax 7\noom 3\noom_kill 3\noom_group_kill 0\n")
	if n, err := g.OOMKills(); err != nil || n != 3 {
		t.Errorf("OOMKills = %d, %v; want 3", n, err)
	}
}

func TestFakeV2DelegatedRootless(t *testing.T) {
	const scope = "user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope"
	s, fk := newFakeV2(t, 1000, "/"+scope, false)
	fk.put("", "cgroup.subtree_control", "cpu memory pids")
	fk.cg("user.slice", 0, "cpu memory pids", "")
	fk.put("user.slice", "cgroup.subtree_control", "cpu memory pids")
	fk.cg("user.slice/user-1000.slice", 0, "cpu memory pids", "")
	fk.put("user.slice/user-1000.slice", "cgroup.subtree_control", "cpu memory pids")
	fk.cg("user.slice/user-1000.slice/user@1000.service", 1000, "cpu memory pids", "")
	fk.put("user.slice/user-1000.slice/user@1000.service", "cgroup.subtree_control", "cpu memory pids")
	fk.cg("user.slice/user-1000.slice/user@1000.service/app.slice", 1000, "cpu memory pids", "")
	fk.put("user.slice/user-1000.slice/user@1000.service/app.slice", "cgroup.subtree_control", "cpu memory pids")
	fk.cg(scope, 1000, "cpu memory pids", "4242\n4343\n") // the server and a child of it

	info := s.layout().info
	if info.Version != 2 || !info.Writable || info.Reason != "" || info.Root != fk.path(scope+"/virtx") {
		t.Fatalf("Detect = %+v, want writable v2 rooted in the delegated scope", info)
	}
	if !info.Has("memory") || info.Has("cpuset") {
		t.Errorf("Controllers = %v, want what the scope is offered (no cpuset)", info.Controllers)
	}
	g, err := s.create("r", Limits{MemoryBytes: 1 << 30, CPUs: 2, Pids: 100})
	if err != nil {
		t.Fatal(err)
	}
	// The scope's processes moved to a leaf so that it could give controllers to children.
	if got := strings.Fields(fk.get(scope+"/virtx-server", "cgroup.procs")); strings.Join(got, ",") != "4242,4343" {
		t.Errorf("leaf holds %v, want the scope's processes 4242,4343", got)
	}
	if got := strings.TrimSpace(fk.get(scope, "cgroup.procs")); got != "" {
		t.Errorf("scope still holds %q", got)
	}
	if got := strings.TrimSpace(fk.get(scope, "cgroup.subtree_control")); got != "cpu memory pids" {
		t.Errorf("scope subtree_control = %q", got)
	}
	rel := scope + "/virtx/" + groupDir("r", s.self)
	if got := strings.TrimSpace(fk.get(rel, "cpu.max")); got != "200000 100000" {
		t.Errorf("cpu.max = %q", got)
	}
	if g.Path() != fk.path(rel) {
		t.Errorf("Path = %q", g.Path())
	}
	// cpuset is not delegated here: asking for it is refused, naming the fix.
	_, err = s.create("pinned", Limits{CPUSet: "0"})
	if !errors.Is(err, ErrCannotEnforce) || !strings.Contains(err.Error(), "Delegate=") {
		t.Errorf("cpuset without delegation: %v, want ErrCannotEnforce naming Delegate=", err)
	}
}

func TestFakeV2RootlessNotDelegated(t *testing.T) {
	const session = "user.slice/user-1000.slice/session-3.scope"
	s, fk := newFakeV2(t, 1000, "/"+session, false)
	fk.cg("user.slice", 0, "cpu memory pids", "")
	fk.cg("user.slice/user-1000.slice", 0, "cpu memory pids", "")
	fk.cg(session, 0, "cpu memory pids", "4242\n") // systemd's, not the user's
	info := s.layout().info
	if info.Version != 2 || info.Writable {
		t.Fatalf("Detect = %+v, want v2 not writable", info)
	}
	if !strings.Contains(info.Reason, "systemd-run --user --scope -p Delegate=yes") {
		t.Errorf("Reason = %q, want the systemd-run fix", info.Reason)
	}
	_, err := s.create("x", Limits{MemoryBytes: 1 << 30})
	if !errors.Is(err, ErrCannotEnforce) || !strings.Contains(err.Error(), "systemd-run") {
		t.Errorf("Create = %v, want ErrCannotEnforce naming systemd-run", err)
	}
	// Not even an unlimited group: there is nowhere to make it.
	if _, err := s.create("y", Limits{}); !errors.Is(err, ErrCannotEnforce) {
		t.Errorf("Create without limits = %v, want ErrCannotEnforce", err)
	}
}

func TestFakeV2ControllersNotDelegated(t *testing.T) {
	const scope = "user.slice/user-1000.slice/user@1000.service/app.slice/run-r2.scope"
	s, fk := newFakeV2(t, 1000, "/"+scope, false)
	for _, d := range []string{"user.slice", "user.slice/user-1000.slice", "user.slice/user-1000.slice/user@1000.service",
		"user.slice/user-1000.slice/user@1000.service/app.slice"} {
		fk.cg(d, 1000, "pids", "")
	}
	fk.cg(scope, 1000, "pids", "") // systemd's default before it delegated memory and cpu
	info := s.layout().info
	if !info.Writable || !strings.Contains(info.Reason, "memory") || !strings.Contains(info.Reason, "Delegate=") {
		t.Fatalf("Detect = %+v, want writable with a reason naming memory and Delegate=", info)
	}
	if _, err := s.create("m", Limits{MemoryBytes: 1 << 30}); !errors.Is(err, ErrCannotEnforce) {
		t.Errorf("memory limit without the memory controller: %v, want ErrCannotEnforce", err)
	}
	if _, err := os.Stat(fk.path(scope + "/virtx/" + groupDir("m", s.self))); err == nil {
		t.Error("a refused group was left behind")
	}
	g, err := s.create("p", Limits{Pids: 64})
	if err != nil {
		t.Fatalf("pids alone should work: %v", err)
	}
	if got := strings.TrimSpace(fk.get(scope+"/virtx/"+groupDir("p", s.self), "pids.max")); got != "64" {
		t.Errorf("pids.max = %q", got)
	}
	must(t, g.Destroy())
}

func TestFakeV2ReadOnlyMount(t *testing.T) {
	s, _ := newFakeV2(t, 0, "/", true)
	info := s.layout().info
	if info.Writable || !strings.Contains(info.Reason, "read-only") {
		t.Errorf("Detect = %+v, want not writable, saying read-only", info)
	}
	if _, err := s.create("x", Limits{Pids: 1}); !errors.Is(err, ErrCannotEnforce) {
		t.Errorf("Create = %v, want ErrCannotEnforce", err)
	}
}

func TestFakeV2RefusesWhatTheKernelRefuses(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/", false)
	fk.put("", "cgroup.controllers", "cpu pids") // memory disabled (cgroup_disable=memory)
	info := s.layout().info
	if !strings.Contains(info.Reason, "memory") {
		t.Errorf("Reason = %q, want it to name memory", info.Reason)
	}
	if _, err := s.create("m", Limits{MemoryBytes: 1 << 20}); !errors.Is(err, ErrCannotEnforce) {
		t.Errorf("Create = %v, want ErrCannotEnforce", err)
	}
	if _, err := s.create("bad name", Limits{}); err == nil || errors.Is(err, ErrCannotEnforce) {
		t.Errorf("a bad name: %v, want a plain error", err)
	}
	if _, err := s.create("neg", Limits{Pids: -1}); err == nil {
		t.Error("negative pids accepted")
	}
	g, err := s.create("twice", Limits{})
	must(t, err)
	if _, err := s.create("twice", Limits{}); !errors.Is(err, unix.EEXIST) {
		t.Errorf("the same name twice: %v, want EEXIST", err)
	}
	must(t, g.Destroy())
}

func TestFakeReapStale(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/", false)
	must(t, s.mkdirOK(fk.path("virtx")))
	dead := owner{pid: deadPid(t), start: 1}
	recycled := owner{pid: s.self.pid, start: s.self.start + 1} // our pid, another start time
	for _, d := range []string{groupDir("a", dead), groupDir("b", recycled), groupDir("mine", s.self), "not-ours"} {
		must(t, fk.mkdirAs(fk.path("virtx/"+d), 0))
	}
	fk.put("virtx/"+groupDir("a", dead), "cgroup.procs", "777\n")
	n, err := s.reapStale()
	if err != nil || n != 2 {
		t.Fatalf("reapStale = %d, %v; want 2", n, err)
	}
	for d, want := range map[string]bool{groupDir("a", dead): false, groupDir("b", recycled): false,
		groupDir("mine", s.self): true, "not-ours": true} {
		if _, err := os.Stat(fk.path("virtx/" + d)); (err == nil) != want {
			t.Errorf("%s there = %v, want %v", d, err == nil, want)
		}
	}
	if len(fk.killed) != 1 || fk.killed[0] != 777 {
		t.Errorf("killed %v, want the stale group's 777", fk.killed)
	}
}

// deadPid returns the pid of a process that has exited and been reaped.
func deadPid(t *testing.T) int {
	t.Helper()
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	must(t, err)
	_, err = p.Wait()
	must(t, err)
	return p.Pid
}

// TestFakeV2StartProcessFallsBack: a kernel that refuses CLONE_INTO_CGROUP (EINVAL before
// Linux 5.7) gets the start again without it, the process is moved in before StartProcess
// returns, and later starts do not ask again. Another error is the caller's, returned as is.
func TestFakeV2StartProcessFallsBack(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/", false)
	g, err := s.create("start", Limits{Pids: 10})
	must(t, err)
	rel := "virtx/" + groupDir("start", s.self)
	var asked []bool // UseCgroupFD of each call
	start := func(attr *syscall.SysProcAttr) (int, error) {
		asked = append(asked, attr.UseCgroupFD)
		if attr.UseCgroupFD {
			return 0, &os.PathError{Op: "fork/exec", Path: "/bin/x", Err: syscall.EINVAL}
		}
		return 4242, nil
	}
	pid, err := g.StartProcess(&syscall.SysProcAttr{Setsid: true}, start)
	if err != nil || pid != 4242 {
		t.Fatalf("StartProcess = %d, %v", pid, err)
	}
	if len(asked) != 2 || !asked[0] || asked[1] {
		t.Errorf("start called with UseCgroupFD %v, want [true false]", asked)
	}
	if got := strings.TrimSpace(fk.get(rel, "cgroup.procs")); got != "4242" {
		t.Errorf("cgroup.procs = %q, want the process moved in", got)
	}
	asked = nil
	if _, err := g.StartProcess(nil, start); err != nil || len(asked) != 1 || asked[0] {
		t.Errorf("after a refusal: %v, UseCgroupFD %v; want one call without", err, asked)
	}

	s2, _ := newFakeV2(t, 0, "/", false)
	g2, err := s2.create("fail", Limits{})
	must(t, err)
	calls := 0
	_, err = g2.StartProcess(nil, func(*syscall.SysProcAttr) (int, error) {
		calls++
		return 0, &os.PathError{Op: "fork/exec", Path: "/bin/x", Err: syscall.ENOENT}
	})
	if !errors.Is(err, syscall.ENOENT) || calls != 1 {
		t.Errorf("a start failing with ENOENT: %v after %d calls, want ENOENT after 1", err, calls)
	}
	if s2.noCloneInto.Load() {
		t.Error("ENOENT taken for a kernel without CLONE_INTO_CGROUP")
	}
}

// TestFakeV2StartProcessCannotJoin: a process started (without CLONE_INTO_CGROUP) that
// cannot be moved into its group is killed, and its pid returned with the error.
func TestFakeV2StartProcessCannotJoin(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/", false)
	s.noCloneInto.Store(true)
	g, err := s.create("nojoin", Limits{})
	must(t, err)
	must(t, os.RemoveAll(g.Path())) // gone under it: cgroup.procs cannot be written
	pid, err := g.StartProcess(nil, func(*syscall.SysProcAttr) (int, error) { return 4343, nil })
	if err == nil || pid != 4343 {
		t.Fatalf("StartProcess = %d, %v; want 4343 and an error", pid, err)
	}
	if len(fk.killed) != 1 || fk.killed[0] != 4343 {
		t.Errorf("killed %v, want [4343]", fk.killed)
	}
}

// TestFakeV2SetLimits: a group made for one shape enforces another; what the new limits
// leave out is unlimited again; a limit whose controller the group lacks is ErrCannotEnforce.
func TestFakeV2SetLimits(t *testing.T) {
	s, fk := newFakeV2(t, 0, "/", false)
	g, err := s.create("reshape", Limits{MemoryBytes: 2 << 30, CPUs: 2, CPUSet: "0-1", Pids: 4096})
	must(t, err)
	rel := "virtx/" + groupDir("reshape", s.self)
	must(t, g.SetLimits(Limits{MemoryBytes: 512 << 20, CPUs: 1, CPUSet: "1", Pids: 100}))
	for file, want := range map[string]string{
		"memory.max": "536870912", "memory.swap.max": "0", "cpu.max": "100000 100000",
		"cpuset.cpus": "1", "pids.max": "100",
	} {
		if got := strings.TrimSpace(fk.get(rel, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	must(t, g.SetLimits(Limits{Pids: 10}))
	for file, want := range map[string]string{
		"memory.max": "max", "memory.swap.max": "max", "cpu.max": "max 100000", "cpuset.cpus": "", "pids.max": "10",
	} {
		if got := strings.TrimSpace(fk.get(rel, file)); got != want {
			t.Errorf("after unsetting: %s = %q, want %q", file, got, want)
		}
	}

	s2, _ := newFakeV2(t, 0, "/", false)
	plain, err := s2.create("plain", Limits{}) // memory and pids enabled, not cpu
	must(t, err)
	if err := plain.SetLimits(Limits{CPUs: 1}); !errors.Is(err, ErrCannotEnforce) {
		t.Errorf("a CPU limit on a group made without cpu: %v, want ErrCannotEnforce", err)
	}
	if err := g.SetLimits(Limits{Pids: -1}); err == nil {
		t.Error("a negative pids limit was taken")
	}
}

package cgroup

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// StartProcess on this machine's kernel: the process is born inside the group in every
// hierarchy, and the thread that started it is back in its own cgroups afterwards.

func init() {
	// The main-thread helper (TestRealStartProcessOnMainThread): locking the thread in an
	// init function makes main, and TestMain, run on the process's main thread.
	if os.Getenv(helperEnv) == "mainthread" {
		runtime.LockOSThread()
	}
}

// startCmd starts cmd with g.StartProcess from the calling goroutine and returns what
// /proc/thread-self/cgroup said while the process was being started.
func startCmd(g *Group, cmd func() *exec.Cmd) (started *exec.Cmd, during string, err error) {
	_, err = g.StartProcess(nil, func(attr *syscall.SysProcAttr) (int, error) {
		b, _ := os.ReadFile("/proc/thread-self/cgroup")
		during = string(b)
		started = cmd()
		started.SysProcAttr = attr
		if err := started.Start(); err != nil {
			return 0, err
		}
		return started.Process.Pid, nil
	})
	return started, during, err
}

// inGroupLines counts the lines of a /proc/PID/cgroup text that name g (its path in the
// hierarchy: the processes here are in the root cgroup namespace, and the mounts are whole).
func inGroupLines(g *Group, cgroupFile string) int {
	n := 0
	for _, line := range strings.Split(cgroupFile, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && f[2] == "/"+parentName+"/"+g.dirName {
			n++
		}
	}
	return n
}

// threadsInside lists the threads of this process that are in g, in any hierarchy.
func threadsInside(t *testing.T, g *Group) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	must(t, err)
	var in []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", e.Name(), "cgroup"))
		if err != nil {
			continue // a thread that just ended
		}
		if inGroupLines(g, string(b)) > 0 {
			in = append(in, e.Name())
		}
	}
	return in
}

// removable checks that g, whose processes have ended, can be removed as it is — nothing
// of this process left in it — without killing anything.
func removable(t *testing.T, g *Group) {
	t.Helper()
	for _, d := range g.v1dirs() {
		if b, _ := os.ReadFile(filepath.Join(d, "tasks")); len(bytes.TrimSpace(b)) != 0 {
			t.Errorf("%s/tasks still lists %q after the process ended", d, b)
		}
	}
	if err := g.remove(time.Now().Add(time.Second)); err != nil {
		t.Errorf("removing the group after its process ended: %v", err)
	}
}

// firstCPU is a CPU this process may run on.
func firstCPU(t *testing.T) string {
	var set unix.CPUSet
	must(t, unix.SchedGetaffinity(0, &set))
	for i := 0; i < len(set)*64; i++ {
		if set.IsSet(i) {
			return strconv.Itoa(i)
		}
	}
	t.Fatal("no CPU in this process's affinity")
	return ""
}

// testBornInside starts cat /proc/self/cgroup inside g: what cat read as it ran must name
// g in every hierarchy g uses, the starting thread must have been inside g in exactly its
// v1 hierarchies while it forked, and be back where it was, with its CPU affinity, after.
func testBornInside(t *testing.T, g *Group) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := os.ReadFile("/proc/thread-self/cgroup")
	must(t, err)
	var affBefore, affAfter unix.CPUSet
	must(t, unix.SchedGetaffinity(0, &affBefore))
	var out bytes.Buffer
	cmd, during, err := startCmd(g, func() *exec.Cmd {
		c := exec.Command("/bin/cat", "/proc/self/cgroup")
		c.Stdout = &out
		return c
	})
	must(t, err)
	after, err := os.ReadFile("/proc/thread-self/cgroup")
	must(t, err)
	must(t, unix.SchedGetaffinity(0, &affAfter))
	must(t, cmd.Wait())
	if n := inGroupLines(g, out.String()); n != len(g.dirs) {
		t.Errorf("the process saw itself in the group in %d hierarchies, want all %d (%v):\n%s", n, len(g.dirs), g.dirs, out.String())
	}
	if n := inGroupLines(g, during); n != len(g.v1dirs()) {
		t.Errorf("while starting, the thread was in the group in %d hierarchies, want the %d v1 ones:\n%s", n, len(g.v1dirs()), during)
	}
	if string(after) != string(before) {
		t.Errorf("the starting thread's cgroups changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if affAfter != affBefore {
		t.Errorf("the starting thread's CPU affinity changed: %d CPUs before, %d after", affBefore.Count(), affAfter.Count())
	}
	removable(t, g)
}

func TestRealStartProcessBornInside(t *testing.T) {
	s := needHost(t, "memory", "pids", "cpu")
	lim := Limits{MemoryBytes: 64 << 20, Pids: 64, CPUs: 1}
	if s.layout().info.Has("cpuset") {
		lim.CPUSet = firstCPU(t)
	}
	g := newGroup(t, s, lim)
	testBornInside(t, g)
}

// TestRealStartProcessWithoutCloneInto acts as a kernel without CLONE_INTO_CGROUP: the
// process is moved into its v2 (or, on a hybrid host, unified) group right after it
// started, and is in the group everywhere when StartProcess returns.
func TestRealStartProcessWithoutCloneInto(t *testing.T) {
	needHost(t)
	s := newHostSystem()
	s.noCloneInto.Store(true)
	g := newGroup(t, s, Limits{Pids: 64})
	cmd, _, err := startCmd(g, func() *exec.Cmd { return exec.Command("/bin/sleep", "300") })
	must(t, err)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	must(t, err)
	if n := inGroupLines(g, string(b)); n != len(g.dirs) {
		t.Errorf("in the group in %d hierarchies, want %d:\n%s", n, len(g.dirs), b)
	}
	must(t, g.Kill())
	cmd.Wait()
	removable(t, g)
}

// TestRealStartProcessLeavesNoThreadInside starts processes from goroutines that end right
// after, while the runtime is made to start new threads (goroutines blocked in system calls,
// started from the thread that is inside the group), and then checks every thread of this
// process: none may be in the group. A thread left there, or one the runtime made from the
// thread inside, would be; and the group could not be removed.
func TestRealStartProcessLeavesNoThreadInside(t *testing.T) {
	s := needHost(t)
	g := newGroup(t, s, Limits{Pids: 256})
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(16)) // idle Ps: go statements wake new threads
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd, _, err := startCmd(g, func() *exec.Cmd {
				var blocked sync.WaitGroup
				for range 8 {
					blocked.Add(1)
					go func() { // holds its thread in a system call
						defer blocked.Done()
						unix.Nanosleep(&unix.Timespec{Nsec: 2e6}, nil)
					}()
				}
				blocked.Wait()
				return exec.Command("/bin/true")
			})
			if err == nil {
				err = cmd.Wait()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}
	if in := threadsInside(t, g); len(in) > 0 {
		t.Fatalf("threads of this process left in the group: %v", in)
	}
	removable(t, g)
}

// TestRealStartProcessFailedStart: a start that fails leaves the thread where it was and the
// group empty and removable.
func TestRealStartProcessFailedStart(t *testing.T) {
	s := needHost(t)
	g := newGroup(t, s, Limits{Pids: 16})
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := os.ReadFile("/proc/thread-self/cgroup")
	must(t, err)
	_, _, err = startCmd(g, func() *exec.Cmd { return exec.Command("/nonexistent/virtx-test") })
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("starting a missing program: %v, want not found", err)
	}
	after, err := os.ReadFile("/proc/thread-self/cgroup")
	must(t, err)
	if string(after) != string(before) {
		t.Errorf("the thread's cgroups changed:\n%s\nthen\n%s", before, after)
	}
	removable(t, g)
}

// TestRealStartProcessForkBomb: a bomb that forks as soon as it runs, started inside, never
// has a process outside the group (Add could only be this safe for a process that waits to be
// told to go): it stops at the pids limit, and Kill ends it.
func TestRealStartProcessForkBomb(t *testing.T) {
	s := needHost(t, "pids")
	const limit = 32
	g := newGroup(t, s, Limits{Pids: limit, MemoryBytes: 256 << 20})
	cmd, _, err := startCmd(g, func() *exec.Cmd {
		c := exec.Command("/bin/sh", "-c", `f() { f | f & }; f; sleep 30`)
		c.Stderr = io.Discard
		return c
	})
	must(t, err)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pidsDir := g.v2
	if !g.v2limits {
		pidsDir = filepath.Join(s.layout().v1["pids"], parentName, g.dirName)
	}
	waitPidsMax(t, pidsDir)
	cur, err := readFile(filepath.Join(pidsDir, "pids.current"))
	must(t, err)
	if n, _ := strconv.Atoi(strings.TrimSpace(cur)); n > limit {
		t.Errorf("pids.current = %d, over the limit %d", n, limit)
	}
	must(t, g.Kill())
	if pids, err := g.Procs(); err != nil || len(pids) != 0 {
		t.Errorf("after Kill: %v, %v", pids, err)
	}
	cmd.Wait()
	removable(t, g)
}

// TestRealV2StartProcess: on the unified hierarchy driven as a v2-only host, the process is
// cloned into the group (CLONE_INTO_CGROUP) and the thread never moves.
func TestRealV2StartProcess(t *testing.T) {
	s, _ := needUnified(t)
	g := newGroup(t, s, Limits{})
	testBornInside(t, g)
	if s.noCloneInto.Load() {
		t.Error("this kernel (Linux 5.7+ here) refused CLONE_INTO_CGROUP")
	}
}

// mainThreadReport is what mainThreadHelper found.
type mainThreadReport struct {
	OnMain    bool   // StartProcess ran on the process's main thread
	Same      bool   // and left it in its own cgroups
	StartErr  string // starting
	Inside    int    // hierarchies the process saw itself in the group
	Want      int
	Left      []string // threads in the group afterwards
	RemoveErr string
}

// mainThreadHelper starts a process inside a group from the main thread — which the Go
// runtime never ends: were it left in the group, the group could never be removed.
func mainThreadHelper() (r mainThreadReport) {
	r.OnMain = unix.Gettid() == os.Getpid()
	g, err := Create("mainthread", Limits{Pids: 16})
	if err != nil {
		r.StartErr = err.Error()
		return r
	}
	defer g.Destroy()
	before, _ := os.ReadFile("/proc/thread-self/cgroup")
	var out bytes.Buffer
	cmd, _, err := startCmd(g, func() *exec.Cmd {
		c := exec.Command("/bin/cat", "/proc/self/cgroup")
		c.Stdout = &out
		return c
	})
	if err != nil {
		r.StartErr = err.Error()
		return r
	}
	cmd.Wait()
	after, _ := os.ReadFile("/proc/thread-self/cgroup")
	r.Same = string(before) == string(after)
	r.Inside, r.Want = inGroupLines(g, out.String()), len(g.dirs)
	ents, _ := os.ReadDir("/proc/self/task")
	for _, e := range ents {
		if b, err := os.ReadFile(filepath.Join("/proc/self/task", e.Name(), "cgroup")); err == nil && inGroupLines(g, string(b)) > 0 {
			r.Left = append(r.Left, e.Name())
		}
	}
	if err := g.remove(time.Now().Add(time.Second)); err != nil {
		r.RemoveErr = err.Error()
	}
	return r
}

func TestRealStartProcessOnMainThread(t *testing.T) {
	needHost(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=mainthread")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	var r mainThreadReport
	must(t, json.Unmarshal(out, &r))
	t.Logf("%+v", r)
	switch {
	case !r.OnMain:
		t.Errorf("the helper did not run on its main thread")
	case r.StartErr != "":
		t.Errorf("start: %s", r.StartErr)
	case !r.Same || len(r.Left) > 0:
		t.Errorf("the main thread's cgroups changed (%v), threads left inside: %v", !r.Same, r.Left)
	case r.Inside != r.Want:
		t.Errorf("the process was inside in %d hierarchies, want %d", r.Inside, r.Want)
	case r.RemoveErr != "":
		t.Errorf("removing the group: %s", r.RemoveErr)
	}
}

// TestRealSetLimits: on this kernel, a group made for the default machine, with a process
// born inside, is given another shape in place: the files say so (v1 memory and memory+swap
// in either direction), and the process's CPU affinity follows the new cpuset.
func TestRealSetLimits(t *testing.T) {
	s := needHost(t, "memory", "pids", "cpu", "cpuset")
	var set unix.CPUSet
	must(t, unix.SchedGetaffinity(0, &set))
	need(t, set.Count() >= 2, "two CPUs")
	cpu := firstCPU(t)
	var two []string
	for i := 0; i < len(set)*64 && len(two) < 2; i++ {
		if set.IsSet(i) {
			two = append(two, strconv.Itoa(i))
		}
	}
	plain := newGroup(t, s, Limits{MemoryBytes: 2 << 30})
	if err := plain.SetLimits(Limits{MemoryBytes: 1 << 30, CPUSet: cpu}); !errors.Is(err, ErrCannotEnforce) {
		t.Errorf("a cpuset on a group made without one: %v, want ErrCannotEnforce", err)
	}
	g := newGroup(t, s, Limits{MemoryBytes: 2 << 30, CPUs: 2, CPUSet: strings.Join(two, ","), Pids: 4096})
	cmd, _, err := startCmd(g, func() *exec.Cmd { return exec.Command("/bin/sleep", "300") })
	must(t, err)
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	files := func(lim Limits) map[string]string {
		if g.v2limits {
			return map[string]string{"memory.max": strconv.FormatInt(lim.MemoryBytes, 10), "pids.max": strconv.FormatInt(lim.Pids, 10)}
		}
		l := s.layout()
		d := func(c, f string) string { return filepath.Join(l.v1[c], parentName, g.dirName, f) }
		m := map[string]string{
			d("memory", "memory.limit_in_bytes"): strconv.FormatInt(lim.MemoryBytes, 10),
			d("cpu", "cpu.cfs_quota_us"):         strconv.FormatInt(lim.cpuQuota(), 10),
			d("cpuset", "cpuset.cpus"):           lim.CPUSet,
			d("pids", "pids.max"):                strconv.FormatInt(lim.Pids, 10),
		}
		if exists(d("memory", "memory.memsw.limit_in_bytes")) {
			m[d("memory", "memory.memsw.limit_in_bytes")] = strconv.FormatInt(lim.MemoryBytes, 10)
		}
		return m
	}
	for _, lim := range []Limits{
		{MemoryBytes: 512 << 20, CPUs: 1, CPUSet: cpu, Pids: 100}, // smaller
		{MemoryBytes: 3 << 30, CPUs: 1.5, CPUSet: cpu, Pids: 200}, // larger
	} {
		must(t, g.SetLimits(lim))
		for f, want := range files(lim) {
			if got, err := readFile(f); err != nil || strings.TrimSpace(got) != want {
				t.Errorf("after SetLimits(%+v): %s = %q, %v; want %q", lim, f, got, err, want)
			}
		}
		var aff unix.CPUSet
		must(t, unix.SchedGetaffinity(cmd.Process.Pid, &aff))
		if n, _ := strconv.Atoi(cpu); aff.Count() != 1 || !aff.IsSet(n) {
			t.Errorf("the process's affinity: %d CPUs, want CPU %s alone", aff.Count(), cpu)
		}
	}
}

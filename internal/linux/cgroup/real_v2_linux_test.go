package cgroup

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The v2 driver on this machine's kernel. On a hybrid host (v1 limits, v2 at
// /sys/fs/cgroup/unified with no limit controllers) the unified hierarchy still does
// everything but limits: groups are made and removed, processes moved and listed, killed
// with cgroup.kill or by freezing, and cgroup.events says populated. These tests make the
// v2 driver do exactly that there, as if it were a v2-only host.

// needUnified returns a system that uses the host's cgroup2 mount as a v2-only host would.
func needUnified(t *testing.T) (*system, string) {
	t.Helper()
	need(t, os.Geteuid() == 0, "root")
	ms, err := newHostSystem().readMounts()
	must(t, err)
	var mnt string
	for _, m := range ms {
		if m.v2 && !m.ro && m.root == "/" {
			mnt = m.dir
			break
		}
	}
	need(t, mnt != "", "a writable cgroup2 mount (the unified hierarchy)")
	ctrls, err := readFile(filepath.Join(mnt, "cgroup.controllers"))
	must(t, err)
	l := layout{info: Info{Version: 2, Writable: true, Root: filepath.Join(mnt, parentName)}, v2: mnt, v2Ctrls: strings.Fields(ctrls)}
	for _, c := range l.v2Ctrls {
		if slices.Contains(limitControllers, c) {
			l.info.Controllers = append(l.info.Controllers, c)
		}
	}
	s := newHostSystem()
	s.layoutOnce.Do(func() { s.lay = l })
	return s, mnt
}

func TestRealV2GroupLifecycle(t *testing.T) {
	s, mnt := needUnified(t)
	g := newGroup(t, s, Limits{})
	if filepath.Dir(g.Path()) != filepath.Join(mnt, parentName) || !g.v2limits {
		t.Fatalf("Path = %q, want a v2 group under %s/%s", g.Path(), mnt, parentName)
	}
	cmd := exec.Command("/bin/sleep", "300")
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	must(t, g.Add(cmd.Process.Pid))
	if pids, err := g.Procs(); err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Errorf("Procs = %v, %v; want [%d]", pids, err, cmd.Process.Pid)
	}
	self, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cgroup")
	must(t, err)
	if want := "0::/" + parentName + "/" + g.dirName + "\n"; !strings.Contains(string(self), want) {
		t.Errorf("/proc/PID/cgroup = %q, want a line %q", self, want)
	}
	if pop, err := v2populated(g.Path()); err != nil || !pop {
		t.Errorf("populated = %v, %v; want true", pop, err)
	}
	must(t, g.Kill())
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("after Kill the process ended with %v, want killed", err)
	}
	if pop, err := v2populated(g.Path()); err != nil || pop {
		t.Errorf("populated after Kill = %v, %v; want false", pop, err)
	}
	must(t, g.Destroy())
	if exists(g.Path()) {
		t.Errorf("%s still there after Destroy", g.Path())
	}
}

func TestRealV2KillDaemonWithCgroupKill(t *testing.T) {
	s, _ := needUnified(t)
	g := newGroup(t, s, Limits{})
	need(t, exists(filepath.Join(g.Path(), "cgroup.kill")), "cgroup.kill (Linux 5.14+)")
	testKillDaemon(t, g)
}

func TestRealV2KillByFreezing(t *testing.T) {
	s, _ := needUnified(t)
	s.noCgroupKill = true
	g := newGroup(t, s, Limits{})
	testKillDaemon(t, g)
	// A busy forking loop too: frozen, listed, killed, until none is left.
	cmd := shell(`while :; do /bin/true; done`)
	release := gated(t, cmd)
	must(t, g.Add(cmd.Process.Pid))
	release()
	must(t, g.Kill())
	if pids, _ := g.Procs(); len(pids) != 0 {
		t.Errorf("Procs after Kill = %v", pids)
	}
	if got, _ := readFile(filepath.Join(g.Path(), "cgroup.freeze")); strings.TrimSpace(got) != "0" {
		t.Errorf("cgroup.freeze = %q after Kill, want 0", got)
	}
}

func TestRealV2RefusesControllerItLacks(t *testing.T) {
	s, mnt := needUnified(t)
	if s.layout().info.Has("pids") {
		t.Skipf("%s offers pids: nothing lacking to refuse here (the fake tree covers it)", mnt)
	}
	_, err := s.create(testName(t), Limits{Pids: 10})
	if !errors.Is(err, ErrCannotEnforce) {
		t.Errorf("Create with pids on a v2 hierarchy without pids: %v, want ErrCannotEnforce", err)
	}
}

func TestRealHybridTracksInUnified(t *testing.T) {
	s := needHost(t)
	l := s.layout()
	if l.info.Version != 1 || l.v2 == "" {
		t.Skip("not a hybrid host: no unified tracking group to check")
	}
	g := newGroup(t, s, Limits{Pids: 10})
	if g.v2 == "" || filepath.Dir(g.v2) != filepath.Join(l.v2, parentName) {
		t.Fatalf("hybrid group has no unified tracking group: %+v", g.dirs)
	}
	testKillDaemon(t, g)
}

func TestRealV1KillByFreezer(t *testing.T) {
	s := needHost(t, "freezer")
	if s.layout().info.Version != 1 {
		t.Skip("not a v1 host")
	}
	v1only := newHostSystem()
	l := s.layout()
	l.v2 = "" // no unified tracking: the v1 freezer kills
	v1only.layoutOnce.Do(func() { v1only.lay = l })
	g := newGroup(t, v1only, Limits{Pids: 64})
	if g.freezer == "" || g.v2 != "" {
		t.Fatalf("group dirs %v: want a freezer and no v2", g.dirs)
	}
	testKillDaemon(t, g)
	cmd := shell(`while :; do /bin/true; done`)
	release := gated(t, cmd)
	must(t, g.Add(cmd.Process.Pid))
	release()
	must(t, g.Kill())
	if got, _ := readFile(filepath.Join(g.freezer, "freezer.state")); strings.TrimSpace(got) != "THAWED" {
		t.Errorf("freezer.state = %q after Kill, want THAWED", got)
	}
}

// delegatedReport is what delegatedHelper found, running unprivileged in a delegated cgroup.
type delegatedReport struct {
	Uid       int
	Base      string
	Writable  bool
	MoveErr   string
	SelfAfter string // this process's v2 cgroup after moving to the leaf
	CreateErr string
	Path      string
	Procs     []int
	KillErr   string
	Killed    bool
	GoneErr   string
	Gone      bool
	StartErr  string // StartProcess, unprivileged, into a second group
	StartedIn string // the started process's v2 cgroup
	Want      string // that group's
}

// delegatedHelper runs as an unprivileged user inside a cgroup v2 directory that root
// delegated to it, and does what a rootless server does there.
func delegatedHelper() (r delegatedReport) {
	s := newHostSystem()
	r.Uid = s.euid
	s.self.pid = os.Getpid()
	s.self.start, _ = startTime("/proc", s.self.pid)
	ms, _ := s.readMounts()
	for _, m := range ms {
		if m.v2 && !m.ro {
			r.Base = m.selfDir()
			break
		}
	}
	r.Writable = s.writable(r.Base)
	s.layoutOnce.Do(func() {
		s.lay = layout{info: Info{Version: 2, Writable: true, Root: filepath.Join(r.Base, parentName)}, v2: r.Base, v2Delegated: true}
	})
	if err := s.v2moveToLeaf(r.Base); err != nil {
		r.MoveErr = err.Error()
	}
	b, _ := os.ReadFile("/proc/self/cgroup")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "0::") {
			r.SelfAfter = l[3:]
		}
	}
	g, err := s.create("deleg", Limits{})
	if err != nil {
		r.CreateErr = err.Error()
		return r
	}
	r.Path = g.Path()
	child := exec.Command("/bin/sleep", "100")
	if err := child.Start(); err != nil {
		r.CreateErr = err.Error()
		return r
	}
	defer child.Process.Kill()
	if err := g.Add(child.Process.Pid); err != nil {
		r.CreateErr = err.Error()
		return r
	}
	r.Procs, _ = g.Procs()
	if err := g.Kill(); err != nil {
		r.KillErr = err.Error()
	}
	r.Killed = child.Wait() != nil
	if err := g.Destroy(); err != nil {
		r.GoneErr = err.Error()
	}
	r.Gone = !exists(g.Path())

	// Born inside (CLONE_INTO_CGROUP), with the permissions a delegation gives, in new user
	// and cgroup namespaces as a rootless sandbox's init is.
	g2, err := s.create("deleg-start", Limits{})
	if err != nil {
		r.StartErr = err.Error()
		return r
	}
	defer g2.Destroy()
	userns := &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWCGROUP,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
	}
	var c *exec.Cmd
	pid, err := g2.StartProcess(userns, func(attr *syscall.SysProcAttr) (int, error) {
		c = exec.Command("/bin/sleep", "100")
		c.SysProcAttr = attr
		if err := c.Start(); err != nil {
			return 0, err
		}
		return c.Process.Pid, nil
	})
	if err != nil {
		r.StartErr = err.Error()
		return r
	}
	defer func() { c.Process.Kill(); c.Wait() }()
	r.Want = strings.TrimPrefix(g2.Path(), filepath.Dir(r.Base))
	b, _ = os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "0::") {
			r.StartedIn = l[3:]
		}
	}
	return r
}

// TestRealV2DelegatedRootless checks the rootless path on this kernel: root makes a v2
// cgroup and hands it to uid 65534 as systemd's Delegate=yes does (chown of the directory,
// cgroup.procs, cgroup.subtree_control, cgroup.threads); a helper started straight into it
// (CLONE_INTO_CGROUP) then, unprivileged, moves itself to the leaf, makes a group beside
// it, moves a child in, kills it and removes the group, and starts a process straight into
// a second group (StartProcess, in new user and cgroup namespaces, as a rootless sandbox's
// init). Enabling controllers below the
// delegated cgroup is not tried: on this hybrid host the unified hierarchy offers none
// without changing its root's cgroup.subtree_control (the fake tree covers that step).
func TestRealV2DelegatedRootless(t *testing.T) {
	_, mnt := needUnified(t)
	deleg := filepath.Join(mnt, "virtxtest-deleg-"+strconv.Itoa(os.Getpid()))
	must(t, realMkdir(deleg))
	cleanup := newHostSystem()
	t.Cleanup(func() {
		g := &Group{sys: cleanup, dirName: filepath.Base(deleg), dirs: []string{deleg}, v2: deleg}
		if err := g.Destroy(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
		must(t, os.Chown(filepath.Join(deleg, f), 65534, 65534))
	}
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o755))
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	bin := filepath.Join(dir, "cgroup.test")
	b, err := os.ReadFile(os.Args[0])
	must(t, err)
	must(t, os.WriteFile(bin, b, 0o755))
	fd, err := unix.Open(deleg, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(fd)
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=delegated")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: 65534, Gid: 65534},
		UseCgroupFD: true, CgroupFD: fd,
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	var r delegatedReport
	must(t, json.Unmarshal(out, &r))
	t.Logf("%+v", r)
	rel := strings.TrimPrefix(deleg, mnt)
	switch {
	case r.Uid != 65534 || r.Base != deleg || !r.Writable:
		t.Errorf("helper saw uid %d, base %q, writable %v; want 65534, %s, true", r.Uid, r.Base, r.Writable, deleg)
	case r.MoveErr != "" || r.SelfAfter != rel+"/"+leafName:
		t.Errorf("moving to the leaf: %q, now in %q; want %s/%s", r.MoveErr, r.SelfAfter, rel, leafName)
	case r.CreateErr != "" || filepath.Dir(r.Path) != filepath.Join(deleg, parentName):
		t.Errorf("create: %q at %q", r.CreateErr, r.Path)
	case len(r.Procs) != 1 || r.KillErr != "" || !r.Killed:
		t.Errorf("procs %v, kill %q, killed %v", r.Procs, r.KillErr, r.Killed)
	case r.GoneErr != "" || !r.Gone:
		t.Errorf("destroy: %q, gone %v", r.GoneErr, r.Gone)
	case r.StartErr != "" || r.StartedIn != r.Want || r.Want == "":
		t.Errorf("StartProcess: %q, the process in %q, want %q", r.StartErr, r.StartedIn, r.Want)
	}
}

func TestRealV1KillWithoutFreezer(t *testing.T) {
	s := needHost(t, "pids")
	if s.layout().info.Version != 1 {
		t.Skip("not a v1 host")
	}
	// No unified tracking and no freezer: pids are checked against /proc/PID/cgroup, then
	// signalled, until none is left.
	bare := newHostSystem()
	l := s.layout()
	l.v2 = ""
	l.v1 = map[string]string{}
	for c, d := range s.layout().v1 {
		if c != "freezer" {
			l.v1[c] = d
		}
	}
	bare.layoutOnce.Do(func() { bare.lay = l })
	g := newGroup(t, bare, Limits{Pids: 64})
	if g.freezer != "" || g.v2 != "" {
		t.Fatalf("group dirs %v: want neither freezer nor v2", g.dirs)
	}
	testKillDaemon(t, g)
	cmd := shell(`while :; do /bin/true; done`)
	release := gated(t, cmd)
	must(t, g.Add(cmd.Process.Pid))
	release()
	time.Sleep(20 * time.Millisecond)
	must(t, g.Kill())
	if pids, _ := g.Procs(); len(pids) != 0 {
		t.Errorf("Procs after Kill = %v", pids)
	}
}

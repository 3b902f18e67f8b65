package cgroup

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// StartProcess starts a process that is born inside the group, in every hierarchy the group
// uses, instead of being moved in after it started (Add): nothing it does, and nothing it
// forks, however early, ever runs outside the group, and the start costs no cgroup
// migration of a process (see the package doc, Starting a process inside a group).
//
// start must start the process from the calling thread, as os/exec and syscall.ForkExec do,
// with attr as its SysProcAttr, and return its pid. attr is the caller's own, with the
// group's v2 directory added (UseCgroupFD, CgroupFD: the caller must not set them). Where
// the kernel refuses CLONE_INTO_CGROUP (before Linux 5.7, or a seccomp filter refusing
// clone3) start is called a second time, with the caller's attr unchanged, and must then
// start the process anew; that process is moved into the group's v2 directory once it has
// started, before StartProcess returns, so it must not fork before then (a process told
// to go by its parent, as the sandbox's executor is, never does).
//
// StartProcess locks the calling goroutine to its thread while it runs and holds the
// group's lock (no Kill or Destroy meanwhile). If the process was started but could not be
// put in the group, it is killed (SIGKILL) and its pid is returned with the error: the
// caller still reaps it.
func (g *Group) StartProcess(attr *syscall.SysProcAttr, start func(attr *syscall.SysProcAttr) (pid int, err error)) (int, error) {
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()

	// The v1 hierarchies: this thread goes into the group, forks, and comes back. Locked,
	// so that no other goroutine runs on it meanwhile; the runtime makes no thread from a
	// locked one (it hands that to its template thread), so nothing else is born inside.
	runtime.LockOSThread()
	var later []string // directories the process joins after it started
	trip, err := g.planTrip()
	switch {
	case errors.Is(err, errNoWayBack):
		slog.Debug("cgroup: this thread's own cgroups are not all visible; the process is moved into the group after it starts", "err", err)
		later = append(later, g.v1dirs()...)
		err = nil
	case err == nil:
		err = trip.enter()
	}
	pid := 0
	var refused error // why the kernel would not clone into the v2 directory
	if err == nil {
		var into bool
		pid, into, refused, err = g.startV2(attr, start)
		if g.v2 != "" && !into {
			later = append(later, g.v2)
		}
	}
	if trip.leave() {
		runtime.UnlockOSThread()
	} else {
		// Still in the group somewhere: left locked, the thread ends with its goroutine
		// (or, the main thread, is wedged by the runtime) rather than serving other work.
		slog.Error("cgroup: a thread of this process could not leave a group it entered to start a process in it; it is kept out of use", "group", g.dirName, "tid", unix.Gettid())
	}
	if err != nil {
		return pid, err
	}
	p := strconv.Itoa(pid)
	for _, d := range later {
		if err := g.sys.write(filepath.Join(d, "cgroup.procs"), p); err != nil {
			g.sys.sigkill(pid, nil)
			return pid, err
		}
	}
	if refused != nil && !g.sys.noCloneInto.Swap(true) {
		slog.Debug("cgroup: the kernel refuses CLONE_INTO_CGROUP; processes join their v2 group right after they start", "err", refused)
	}
	return pid, nil
}

// v1dirs are the group's directories in v1 hierarchies.
func (g *Group) v1dirs() []string {
	var ds []string
	for _, d := range g.dirs {
		if d != g.v2 {
			ds = append(ds, d)
		}
	}
	return ds
}

// errNoWayBack: the calling thread's cgroup in some hierarchy is not visible through its
// mount, so it could not come back after entering the group.
var errNoWayBack = errors.New("cgroup: the thread's own cgroup is not visible under the mount")

// trip is the calling thread's move into the group's v1 directories and back.
type trip struct {
	sys     *system
	dirs    []string // the group's v1 directories
	home    []string // where the thread is in each hierarchy (and goes back to)
	entered int      // how many of dirs it is in
	aff     unix.CPUSet
	hasAff  bool
}

// planTrip reads where the calling (locked) thread is, in each hierarchy the group uses.
func (g *Group) planTrip() (*trip, error) {
	t := &trip{sys: g.sys, dirs: g.v1dirs()}
	if len(t.dirs) == 0 {
		return t, nil
	}
	b, err := os.ReadFile(filepath.Join(g.sys.proc, "thread-self", "cgroup"))
	if err != nil {
		return t, fmt.Errorf("cgroup: read this thread's cgroups: %w", err)
	}
	self, _ := parseProcCgroup(b)
	l := g.sys.layout()
	for _, d := range t.dirs {
		parent := filepath.Dir(d)
		mnt := filepath.Dir(parent)
		home := ""
		for c, m := range l.v1 {
			if m == mnt && self[c] != "" {
				root := l.v1Root[mnt]
				if root == "" {
					root = "/"
				}
				home = mount{dir: mnt, root: root, selfPath: self[c]}.selfDir()
				break
			}
		}
		switch {
		case home == "":
			return t, fmt.Errorf("%w: %s", errNoWayBack, mnt)
		case home == parent || strings.HasPrefix(home, parent+"/"):
			home = parent // never back into a group (left there by an earlier failure)
		}
		t.home = append(t.home, home)
	}
	t.hasAff = unix.SchedGetaffinity(0, &t.aff) == nil
	return t, nil
}

// enter moves the calling thread, alone, into each directory (pid 0 in v1's tasks: this
// thread). It stops at the first failure; leave brings the thread back from those it
// entered.
func (t *trip) enter() error {
	for _, d := range t.dirs {
		if err := t.sys.write(filepath.Join(d, "tasks"), "0"); err != nil {
			return err
		}
		t.entered++
	}
	return nil
}

// leave moves the thread back where it was in every directory it entered — to the virtx
// parent when that fails — and gives it back its CPU affinity (joining and leaving a v1
// cpuset resets it). It reports whether the thread is out of the group everywhere.
func (t *trip) leave() bool {
	if t == nil {
		return true
	}
	if t.entered == 0 {
		return true
	}
	out := true
	for i := t.entered - 1; i >= 0; i-- {
		err := t.sys.write(filepath.Join(t.home[i], "tasks"), "0")
		if err == nil {
			continue
		}
		perr := t.sys.write(filepath.Join(filepath.Dir(t.dirs[i]), "tasks"), "0")
		if perr != nil {
			slog.Error("cgroup: a thread cannot leave the group", "dir", t.dirs[i], "err", err, "parentErr", perr)
			out = false
			continue
		}
		slog.Warn("cgroup: a thread could not go back to its own cgroup; it was moved to the virtx parent", "home", t.home[i], "err", err)
	}
	t.entered = 0
	// Set only when the kernel did not keep it: setting makes it the thread's own choice,
	// which later cpuset changes no longer widen.
	var now unix.CPUSet
	if t.hasAff && unix.SchedGetaffinity(0, &now) == nil && now != t.aff {
		if err := unix.SchedSetaffinity(0, &t.aff); err != nil {
			slog.Debug("cgroup: restoring a thread's CPU affinity", "err", err)
		}
	}
	return out
}

// startV2 calls start so that the process is born in the group's v2 directory, with
// CLONE_INTO_CGROUP (into). Where the kernel refuses that (refused says how), start is
// called again without it, and the process must be moved there once it has started.
func (g *Group) startV2(attr *syscall.SysProcAttr, start func(*syscall.SysProcAttr) (int, error)) (pid int, into bool, refused, err error) {
	if g.v2 == "" || g.sys.noCloneInto.Load() {
		pid, err = start(attr)
		return pid, false, nil, err
	}
	fd, err := unix.Open(g.v2, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, false, nil, fmt.Errorf("cgroup: open %s: %w", g.v2, err)
	}
	defer unix.Close(fd)
	in := *attr
	in.UseCgroupFD, in.CgroupFD = true, fd
	pid, err = start(&in)
	if err == nil || !cloneIntoRefused(err) {
		return pid, err == nil, nil, err
	}
	pid, err2 := start(attr)
	if err2 != nil {
		return 0, false, nil, err2
	}
	return pid, false, err, nil
}

// cloneIntoRefused says whether a failed start looks like a kernel (or a seccomp filter)
// that does not take clone3 with CLONE_INTO_CGROUP: no clone3 (ENOSYS, before Linux 5.3),
// arguments too large or a flag unknown (E2BIG, EINVAL, before 5.7), or clone3 denied
// (EPERM). A start refused for another reason is tried again all the same, and fails again.
func cloneIntoRefused(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.E2BIG) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.EPERM)
}

package cgroup

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// killTimeout bounds one Kill (and the kill inside Destroy and ReapStale): processes that do
// not die in that time (uninterruptible sleep on a dead NFS server…) are reported, not waited
// for forever.
const killTimeout = 10 * time.Second

// host is the real machine, detected on first use.
var host = sync.OnceValue(func() *system {
	s := &system{
		mountinfo:  "/proc/self/mountinfo",
		selfCgroup: "/proc/self/cgroup",
		proc:       "/proc",
		euid:       os.Geteuid(),
		write:      writeFile,
		mkdir:      realMkdir,
		rmdir:      realRmdir,
		sigkill:    realSigkill,
	}
	s.self.pid = os.Getpid()
	s.self.start, _ = startTime(s.proc, s.self.pid)
	return s
})

// Detect says what this host's cgroups allow this process to do. It is worked out once per
// process and remembered.
func Detect() Info { return host().layout().info }

// Create makes the group name (unique among this process's live groups) under the per-host
// virtx parent and sets lim on it. It fails with an error wrapping ErrCannotEnforce, naming
// the fix, when any limit in lim cannot be enforced here; it never makes a group that
// silently enforces less. Processes join with Add.
func Create(name string, lim Limits) (*Group, error) { return host().create(name, lim) }

// ReapStale removes the virtx groups whose owner is dead — left by a server that was
// SIGKILLed — after killing whatever still runs in them, and says how many it removed.
// Groups of live servers (pid there with the recorded start time) are kept.
func ReapStale() (removed int, err error) { return host().reapStale() }

// Group is one cgroup made by Create: a directory per hierarchy it uses. Its methods are safe
// for concurrent use.
type Group struct {
	sys      *system
	dirName  string   // NAME@PID-START
	dirs     []string // every directory of the group: the v1 hierarchies, then the v2 one
	v2       string   // its unified-hierarchy directory ("": none)
	v2limits bool     // v2 holds the limits (a v2 host), not only the tracking (hybrid)
	memory   string   // the directory whose memory files it reads ("" none)
	freezer  string   // its v1 freezer directory ("" none)

	mu sync.Mutex // serialises Kill and Destroy
}

func cannot(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCannotEnforce}, a...)...)
}

// enforceErr turns a failed write of a limit into ErrCannotEnforce when it means "not
// allowed" or "not there", and names the file.
func enforceErr(err error) error {
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EROFS) ||
		errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("%w: %w", ErrCannotEnforce, err)
	}
	return err
}

func (s *system) create(name string, lim Limits) (g *Group, err error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if err := lim.validate(); err != nil {
		return nil, err
	}
	l := s.layout()
	if l.info.Version == 0 || !l.info.Writable {
		return nil, cannot("%s", l.info.Reason)
	}
	for _, c := range lim.controllers() {
		if !l.info.Has(c) {
			return nil, cannot("a %s limit was asked for and this host's cgroup v%d offers no %s controller here (%s)",
				c, l.info.Version, c, missingFix(l, c))
		}
	}
	g = &Group{sys: s, dirName: groupDir(name, s.self)}
	defer func() {
		if err != nil {
			if derr := g.Destroy(); derr != nil {
				slog.Warn("cgroup: cleaning up a group that failed to set up", "group", g.dirName, "err", derr)
			}
			g = nil
		}
	}()
	if l.info.Version == 1 {
		if err := s.createV1(g, l, lim); err != nil {
			return g, err
		}
		if l.v2 != "" { // hybrid: the unified hierarchy tracks and kills
			dir := filepath.Join(l.v2, parentName, g.dirName)
			if err := s.makeUnder(l.v2, nil, dir, false); err != nil {
				slog.Debug("cgroup: no unified tracking group; kills use the v1 freezer", "err", err)
			} else {
				g.v2 = dir
				g.dirs = append(g.dirs, dir)
			}
		}
		return g, nil
	}
	// v2: enable what the limits need, plus memory and pids (OOM counts, task counts) where
	// offered, at the base and at the virtx parent.
	ctrls := lim.controllers()
	for _, c := range []string{"memory", "pids"} {
		if l.info.Has(c) && !slices.Contains(ctrls, c) {
			ctrls = append(ctrls, c)
		}
	}
	dir := filepath.Join(l.v2, parentName, g.dirName)
	if err := s.makeUnder(l.v2, ctrls, dir, false); err != nil {
		return g, enforceErr(err)
	}
	g.v2, g.v2limits, g.dirs = dir, true, []string{dir}
	if l.info.Has("memory") {
		g.memory = dir
	}
	if err := s.v2apply(dir, lim); err != nil {
		return g, enforceErr(err)
	}
	return g, nil
}

// makeUnder makes dir, a group under base/virtx: the parent is set up once per process (made;
// on v2 ctrls enabled at base and at the parent; on v1 its cpuset filled), then the group is
// made. A parent removed under it (by hand) is set up again.
func (s *system) makeUnder(base string, ctrls []string, dir string, v1 bool) error {
	parent := filepath.Dir(dir)
	for attempt := 0; ; attempt++ {
		if err := s.ensureParent(base, parent, ctrls, v1, attempt > 0); err != nil {
			return err
		}
		err := s.mkdir(dir)
		if errors.Is(err, unix.ENOENT) && attempt == 0 {
			continue
		}
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("cgroup: group %s exists already: %w", dir, err)
		}
		return err
	}
}

func (s *system) ensureParent(base, parent string, ctrls []string, v1, again bool) error {
	key := parent + "\x00" + strings.Join(ctrls, ",")
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if s.ready[key] && !again {
		return nil
	}
	if len(ctrls) > 0 {
		if err := s.v2enable(base, ctrls); err != nil {
			return err
		}
	}
	if err := s.mkdirOK(parent); err != nil {
		return err
	}
	if len(ctrls) > 0 {
		if err := s.v2enable(parent, ctrls); err != nil {
			return err
		}
	}
	if v1 {
		if err := s.v1cpusetInit(parent, ""); err != nil {
			return err
		}
	}
	if s.ready == nil {
		s.ready = map[string]bool{}
	}
	s.ready[key] = true
	return nil
}

// createV1 makes the group in each v1 hierarchy it joins: those lim needs, and memory,
// pids (accounting, OOM counts) and freezer (kills) wherever mounted.
func (s *system) createV1(g *Group, l layout, lim Limits) error {
	want := lim.controllers()
	for _, c := range []string{"memory", "pids", "freezer"} {
		if l.v1[c] != "" && !slices.Contains(want, c) {
			want = append(want, c)
		}
	}
	for _, c := range want {
		mnt := l.v1[c]
		dir := filepath.Join(mnt, parentName, g.dirName)
		if !slices.Contains(g.dirs, dir) { // co-mounted controllers share a directory
			if err := s.makeUnder(mnt, nil, dir, true); err != nil {
				return enforceErr(err)
			}
			g.dirs = append(g.dirs, dir)
			if err := s.v1cpusetInit(dir, lim.CPUSet); err != nil {
				return enforceErr(err)
			}
			if err := s.v1apply(dir, lim); err != nil {
				return enforceErr(err)
			}
		}
		switch c {
		case "memory":
			g.memory = dir
		case "freezer":
			g.freezer = dir
		}
	}
	return nil
}

// missingFix says how to get a controller a limit needs.
func missingFix(l layout, c string) string {
	if l.info.Version == 1 {
		return fmt.Sprintf("mount it: mkdir -p /sys/fs/cgroup/%s && mount -t cgroup -o %s cgroup /sys/fs/cgroup/%s", c, c, c)
	}
	if l.v2Delegated {
		return fmt.Sprintf("delegate it: add %s to Delegate= in /etc/systemd/system/user@.service.d/delegate.conf, "+
			"systemctl daemon-reload, and log in again", c)
	}
	return fmt.Sprintf("enable it: echo +%s > %s/cgroup.subtree_control", c, l.v2)
}

// Path is the group's directory: on v2 its only one; on v1 the one in the memory hierarchy
// (the same name sits in each hierarchy the group joined).
func (g *Group) Path() string {
	switch {
	case g.v2limits:
		return g.v2
	case g.memory != "":
		return g.memory
	case len(g.dirs) > 0:
		return g.dirs[0]
	}
	return ""
}

// Add moves process pid (all its threads) into the group, in every hierarchy the group
// uses. Add a process before it forks (one that waits to be told to go), so that no child is
// left behind in the hierarchies written before it forked; better, start it inside with
// StartProcess, which is also much faster (each move of a process waits for an RCU grace
// period, see the package doc).
func (g *Group) Add(pid int) error {
	p := strconv.Itoa(pid)
	for _, d := range g.dirs {
		if err := g.sys.write(filepath.Join(d, "cgroup.procs"), p); err != nil {
			return err
		}
	}
	return nil
}

// Procs lists every process in the group and in groups below it, sorted. This process is
// never one of them: a thread of it is in the group only while it starts a process there
// (StartProcess), and lists its process's pid in a v1 cgroup.procs meanwhile — never to be
// killed with the group's.
func (g *Group) Procs() ([]int, error) {
	var all []int
	for _, d := range g.dirs {
		pids, err := readProcs(d)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return nil, err
		}
		for _, p := range pids {
			if p != g.sys.self.pid {
				all = append(all, p)
			}
		}
	}
	return dedupe(all), nil
}

// Kill kills every process in the group with SIGKILL and returns once none is left, or
// after 10 s with an error naming the survivors. v2 (on a hybrid host: the unified
// tracking group) uses cgroup.kill where the kernel has it (5.14+), which also stops new
// forks; otherwise the group is frozen (v2 cgroup.freeze, v1 freezer), the processes listed
// and signalled, and thawed, again until none is left — so nothing forks its way out.
func (g *Group) Kill() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.kill(time.Now().Add(killTimeout))
}

func (g *Group) kill(deadline time.Time) error {
	killFile := ""
	if g.v2 != "" && !g.sys.noCgroupKill && exists(filepath.Join(g.v2, "cgroup.kill")) {
		killFile = filepath.Join(g.v2, "cgroup.kill")
	}
	for round, delay := 0, 100*time.Microsecond; ; round, delay = round+1, min(2*delay, 20*time.Millisecond) {
		pids, err := g.Procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup: %d process(es) in %s survived SIGKILL for %v (uninterruptible sleep?): %v",
				len(pids), g.Path(), killTimeout, pids)
		}
		if killFile != "" && round%16 == 0 {
			if err := g.sys.write(killFile, "1"); err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		} else if killFile == "" || round >= 16 {
			// Signal them ourselves: no cgroup.kill, or something is left where cgroup.kill
			// does not reach (a v1 hierarchy it was moved out of the tracking group from).
			if err := g.signalAll(); err != nil {
				return err
			}
		}
		time.Sleep(delay)
	}
}

// signalAll freezes the group, SIGKILLs everything in it and thaws it.
func (g *Group) signalAll() error {
	var check func(int) bool
	switch {
	case g.v2 != "":
		g.sys.v2freeze(g.v2, true)
		defer g.sys.v2freeze(g.v2, false)
	case g.freezer != "":
		g.sys.v1freeze(g.freezer, true)
		defer g.sys.v1freeze(g.freezer, false)
	default:
		// Nothing to freeze with: a pid read from the group may be recycled by the time it is
		// signalled, so check it is still ours.
		check = func(pid int) bool { return g.sys.inGroup(pid, g.dirName) }
	}
	pids, err := g.Procs()
	if err != nil {
		return err
	}
	var errs []error
	for _, pid := range pids {
		if err := g.sys.sigkill(pid, check); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Destroy kills everything in the group and removes its directories (and any group made
// below them) in every hierarchy. Destroying a group already destroyed does nothing.
func (g *Group) Destroy() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	deadline := time.Now().Add(killTimeout)
	if err := g.kill(deadline); err != nil {
		return err
	}
	return g.remove(deadline)
}

// remove removes every directory, retrying EBUSY (a v1 group whose last task is still
// exiting) until deadline.
func (g *Group) remove(deadline time.Time) error {
	var errs []error
	for _, d := range g.dirs {
		for delay := 100 * time.Microsecond; ; delay = min(2*delay, 20*time.Millisecond) {
			err := g.sys.removeTree(d)
			if err == nil || !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				if err != nil {
					errs = append(errs, err)
				}
				break
			}
			time.Sleep(delay)
		}
	}
	return errors.Join(errs...)
}

// OOMKills says how many processes the kernel's OOM killer killed in the group (and below
// it) because of its memory limit: v2 memory.events oom_kill, v1 memory.oom_control oom_kill.
func (g *Group) OOMKills() (int64, error) {
	switch {
	case g.memory != "" && g.v2limits:
		return keyed(filepath.Join(g.memory, "memory.events"), "oom_kill")
	case g.memory != "":
		return keyed(filepath.Join(g.memory, "memory.oom_control"), "oom_kill")
	}
	return 0, fmt.Errorf("cgroup: %s has no memory controller to count OOM kills: %w", g.Path(), ErrCannotEnforce)
}

// reapStale removes every group under a virtx parent whose owner is dead.
func (s *system) reapStale() (int, error) {
	l := s.layout()
	if l.info.Version == 0 || !l.info.Writable {
		return 0, nil // nothing this process could have made, nor remove
	}
	var bases []string
	for _, mnt := range l.v1 {
		if !slices.Contains(bases, mnt) {
			bases = append(bases, mnt)
		}
	}
	if l.v2 != "" {
		bases = append(bases, l.v2)
	}
	stale := map[string]*Group{}
	var order []string
	for _, b := range bases {
		parent := filepath.Join(b, parentName)
		ents, err := os.ReadDir(parent)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("cgroup: list %s: %w", parent, err)
		}
		for _, e := range ents {
			_, o, ok := parseGroupDir(e.Name())
			if !e.IsDir() || !ok || s.alive(o) {
				continue
			}
			g := stale[e.Name()]
			if g == nil {
				g = &Group{sys: s, dirName: e.Name()}
				stale[e.Name()] = g
				order = append(order, e.Name())
			}
			dir := filepath.Join(parent, e.Name())
			g.dirs = append(g.dirs, dir)
			switch {
			case b == l.v2:
				g.v2, g.v2limits = dir, l.info.Version == 2
			case b == l.v1["freezer"]:
				g.freezer = dir
			}
			if b == l.v1["memory"] || (b == l.v2 && l.info.Version == 2) {
				g.memory = dir
			}
		}
	}
	removed := 0
	var errs []error
	for _, name := range order {
		if err := stale[name].Destroy(); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
		slog.Info("cgroup: removed a group left by a dead server", "group", name)
	}
	return removed, errors.Join(errs...)
}

// SetLimits makes the group enforce lim instead of what it was made with, as if it had been
// made with lim. It is meant for a group whose processes have not started anything yet (the
// sandbox's executor, born in a group made ahead for the default machine, when the session
// asks for another): unlike moving them to a new group, it waits for no RCU grace period.
// Memory already charged stays charged; a memory limit below it makes the kernel reclaim, or
// fails (EBUSY). A limit that needs a controller the group was made without fails with an
// error wrapping ErrCannotEnforce: make a new group for it.
func (g *Group) SetLimits(lim Limits) error {
	if err := lim.validate(); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.v2limits {
		return enforceErr(g.sys.v2set(g.v2, lim))
	}
	l := g.sys.layout()
	for _, c := range lim.controllers() {
		if l.v1[c] == "" || !slices.Contains(g.dirs, filepath.Join(l.v1[c], parentName, g.dirName)) {
			return cannot("the group %s was made without the %s controller; make a new one", g.dirName, c)
		}
	}
	for _, d := range g.v1dirs() {
		if err := g.sys.v1set(d, lim); err != nil {
			return enforceErr(err)
		}
	}
	return nil
}

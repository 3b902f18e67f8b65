//go:build linux

package executor

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Bounds on one process-tree kill. Freezing gives up waiting for processes
// to stop (one in uninterruptible sleep never does) and goes on to kill;
// killing gives up on processes that will not die (stuck in D state).
const (
	freezeLimit = 1 * time.Second
	killLimit   = 10 * time.Second
)

// procStat is what the executor reads from /proc/PID/stat.
type procStat struct {
	procID
	ppid  int
	pgrp  int
	state byte // R, S, D, T, t, Z, X, ...
}

func (p procStat) dead() bool { return p.state == 'Z' || p.state == 'X' || p.state == 'x' }

// readStat reads /proc/PID/stat.
func readStat(pid int) (procStat, error) {
	var buf [1024]byte
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return procStat{}, err
	}
	n, err := unix.Read(fd, buf[:])
	unix.Close(fd)
	if err != nil {
		return procStat{}, err
	}
	return parseStat(pid, buf[:n])
}

// parseStat parses the contents of /proc/PID/stat: "pid (comm) state ppid
// pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
// cutime cstime priority nice num_threads itrealvalue starttime ...". comm
// may contain spaces and parentheses, so fields are counted from the last
// ')'.
func parseStat(pid int, b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return procStat{}, unix.EINVAL
	}
	f := bytes.Fields(b[i+2:])
	if len(f) < 20 || len(f[0]) == 0 {
		return procStat{}, unix.EINVAL
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgrp, err2 := strconv.Atoi(string(f[2]))
	start, err3 := strconv.ParseUint(string(f[19]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return procStat{}, unix.EINVAL
	}
	return procStat{procID: procID{pid: pid, start: start}, ppid: ppid, pgrp: pgrp, state: f[0][0]}, nil
}

// scanProcs reads the stat of every process in /proc. Processes that vanish
// while it reads are left out.
func scanProcs() map[int]procStat {
	procs := map[int]procStat{}
	d, err := os.Open("/proc")
	if err != nil {
		return procs
	}
	defer d.Close()
	for {
		names, err := d.Readdirnames(512)
		for _, name := range names {
			pid, perr := strconv.Atoi(name)
			if perr != nil || pid <= 0 {
				continue
			}
			if st, serr := readStat(pid); serr == nil {
				procs[pid] = st
			}
		}
		if err != nil || len(names) == 0 {
			return procs
		}
	}
}

// selector says which processes belong to the trees being killed.
type selector struct {
	// groups are process groups started by the executor, keyed by group id,
	// with the identity of the group's leader (the command os/exec
	// started). The leader itself, every member of the group, and every
	// descendant of those belong. A group whose id is now the pid of a
	// different process (the leader was reaped and its pid reused, which
	// the kernel allows only once the group is empty) is ignored.
	groups map[int]procID
	// orphans adds every process re-parented to this one (a subreaper) that
	// is not in this process's own group, with its descendants.
	orphans bool
	// seen is every process found to belong in an earlier scan, so that one
	// orphaned meanwhile (re-parented, possibly into another group by
	// setsid) is still found. Filled in by collect.
	seen map[procID]bool
}

// collect returns the processes among procs that belong, dead ones
// included, and remembers them in s.seen.
func (s *selector) collect(procs map[int]procStat, self, selfPgrp int) []procStat {
	if s.seen == nil {
		s.seen = map[procID]bool{}
	}
	children := map[int][]int{}
	in := map[int]bool{}
	var queue []int
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
		if pid == self {
			continue
		}
		belongs := s.seen[p.procID]
		if l, ok := s.groups[pid]; ok && l == p.procID {
			belongs = true
		}
		if l, ok := s.groups[p.pgrp]; ok {
			if cur, exists := procs[p.pgrp]; !exists || cur.procID == l {
				belongs = true
			}
		}
		if s.orphans && p.ppid == self && p.pgrp != selfPgrp {
			belongs = true
		}
		if belongs {
			in[pid] = true
			queue = append(queue, pid)
		}
	}
	for len(queue) > 0 {
		pid := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		for _, c := range children[pid] {
			if c != self && !in[c] {
				in[c] = true
				queue = append(queue, c)
			}
		}
	}
	out := make([]procStat, 0, len(in))
	for pid := range in {
		p := procs[pid]
		s.seen[p.procID] = true
		out = append(out, p)
	}
	return out
}

// signalProc sends sig to the process p names, only if it is still that
// process: a pidfd pins it, and its start time is checked after.
func signalProc(p procID, sig unix.Signal) {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err == unix.ENOSYS {
		if cur, err := readStat(p.pid); err == nil && cur.procID == p {
			unix.Kill(p.pid, sig)
		}
		return
	}
	if err != nil {
		return // gone
	}
	defer unix.Close(fd)
	if cur, err := readStat(p.pid); err != nil || cur.procID != p {
		return
	}
	unix.PidfdSendSignal(fd, sig, nil, 0)
}

// killTree kills every process s selects with SIGKILL, and keeps at it until
// none is left alive (processes may fork meanwhile). It first stops them all
// with SIGSTOP, rescanning until nothing new appears and all have stopped,
// so that a process cannot escape by forking, or by having its parent
// killed before it was seen. Neither signal can be caught, so there is no
// grace period: this is a kill, not a request.
func (e *Executor) killTree(s *selector) {
	self, selfPgrp := os.Getpid(), unix.Getpgrp()
	begin := time.Now()
	pause := 50 * time.Microsecond
	sleep := func() {
		time.Sleep(pause)
		pause = min(2*pause, 5*time.Millisecond)
	}

	stopped := map[procID]bool{}
	for time.Since(begin) < freezeLimit {
		settled := true
		for _, p := range s.collect(scanProcs(), self, selfPgrp) {
			if p.dead() {
				continue
			}
			if !stopped[p.procID] {
				signalProc(p.procID, unix.SIGSTOP)
				stopped[p.procID] = true
				settled = false
			} else if p.state != 'T' && p.state != 't' {
				settled = false
			}
		}
		if settled {
			break
		}
		sleep()
	}

	pause = 50 * time.Microsecond
	for time.Since(begin) < killLimit {
		alive := 0
		for _, p := range s.collect(scanProcs(), self, selfPgrp) {
			if p.dead() {
				continue
			}
			alive++
			signalProc(p.procID, unix.SIGKILL)
		}
		if alive == 0 {
			return
		}
		sleep()
	}
}

// finished moves a command os/exec has reaped from the running ones to the
// groups KillAll will look in, if anything is left in its process group
// (background processes), and forgets groups that have emptied. Both
// happen in one critical section so KillAll never misses the group.
func (e *Executor) finished(leader procID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.running[leader.pid] == leader {
		delete(e.running, leader.pid)
	}
	e.groups[leader.pid] = leader
	for g, l := range e.groups {
		if unix.Kill(-g, 0) == unix.ESRCH {
			delete(e.groups, g)
			continue
		}
		if cur, err := readStat(g); err == nil && cur.procID != l {
			delete(e.groups, g) // the id is another process's now
		}
	}
}

// KillAll kills every process tree this executor started that is still
// alive, finished commands' background processes included, and (with
// Subreaper) every orphan re-parented to this process outside its own
// process group. Commands still running end as killed by SIGKILL (code
// 137). A process that left its command's process group and whose parent
// died before it was seen cannot be attributed without Subreaper.
func (e *Executor) KillAll() {
	s := &selector{groups: map[int]procID{}, orphans: e.cfg.Subreaper}
	e.mu.Lock()
	for g, l := range e.running {
		s.groups[g] = l
	}
	for g, l := range e.groups {
		s.groups[g] = l
	}
	clear(e.groups)
	e.mu.Unlock()
	e.killTree(s)
	e.reap()
}

// reap waits for zombie orphans re-parented to this process (Subreaper
// only). It takes only zombies whose parent is this process, that are
// outside this process's own process group (children the rest of the
// program started without Setpgid are left to whoever started them), and
// that are not a command os/exec is waiting on.
func (e *Executor) reap() {
	if !e.cfg.Subreaper || !zombieChild() {
		return
	}
	self, selfPgrp := os.Getpid(), unix.Getpgrp()
	for _, pid := range childPids(self) {
		st, err := readStat(pid)
		if err != nil || st.state != 'Z' || st.ppid != self || st.pgrp == selfPgrp {
			continue
		}
		e.mu.Lock()
		if _, busy := e.running[pid]; !busy {
			var ws unix.WaitStatus
			unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		}
		e.mu.Unlock()
	}
}

// zombieChild says whether any child of this process has ended and waits to be reaped,
// without reaping it (WNOWAIT): one system call, where finding which child it is and
// whether it is ours to reap reads /proc — most calls of reap find nothing, and that scan
// was half of what an exec of /bin/true cost PID 1 of a sandbox.
func zombieChild() bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	// With WNOHANG and no child ready, Linux answers 0 with si_signo 0; with no child at
	// all, ECHILD. Any other error: look, as before.
	return !(err == nil && info.Signo == 0) && !errors.Is(err, unix.ECHILD)
}

// childPids lists the children of this process, from
// /proc/self/task/*/children when the kernel has it, else by a scan of
// /proc.
func childPids(self int) []int {
	tasks, err := os.ReadDir("/proc/self/task")
	if err == nil {
		var pids []int
		ok := true
		for i, t := range tasks {
			b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/children")
			if err != nil {
				if os.IsNotExist(err) && i == 0 {
					ok = false // no CONFIG_PROC_CHILDREN
					break
				}
				continue
			}
			for _, f := range bytes.Fields(b) {
				if pid, err := strconv.Atoi(string(f)); err == nil {
					pids = append(pids, pid)
				}
			}
		}
		if ok {
			return pids
		}
	}
	var pids []int
	for pid, p := range scanProcs() {
		if p.ppid == self {
			pids = append(pids, pid)
		}
	}
	return pids
}

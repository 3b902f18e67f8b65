package vm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Run directories. Every boot has one under <cache>/vm/run, named
// <server pid>.<server start time>.<n>; it holds the sockets, the console log, the
// share's mount point and a "pids" file of the processes the boot started, each as
// "<name> <pid> <start time>". Shutdown removes it. A server killed with SIGKILL cannot:
// its QEMU and virtiofsd die with it (parent-death signal), and the next server to boot
// a VM reaps what is left — directories whose owner is no longer alive, and any process
// their pids file names that is still alive with the start time written there (a pid
// reused by another process is never signalled). The session disks are unlinked files
// held open, so they need no reaping: they go when their last holder does.

func runRoot(cache string) string { return filepath.Join(cache, "vm", "run") }

var runSeq atomic.Int64

// procStart is a process's start time (clock ticks since boot, /proc/PID/stat field 22).
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no comm", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

var selfStart = sync.OnceValue(func() uint64 {
	st, _ := procStart(os.Getpid())
	return st
})

// newRunDir makes this boot's run directory.
func newRunDir(cache string) (string, error) {
	root := runRoot(cache)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", err
	}
	dir := filepath.Join(root, fmt.Sprintf("%d.%d.%d", os.Getpid(), selfStart(), runSeq.Add(1)))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// recordPid appends a started process to the run dir's pids file.
func recordPid(dir, name string, pid int) error {
	st, err := procStart(pid)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, "pids"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "%s %d %d\n", name, pid, st)
	return err
}

// killRecorded kills every process of a pids file that is still the one recorded.
func killRecorded(dir string) {
	b, _ := os.ReadFile(filepath.Join(dir, "pids"))
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		pid, err1 := strconv.Atoi(f[1])
		st, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		killIfSame(pid, st)
	}
}

// killIfSame sends SIGKILL to pid through a pidfd, after checking its start time, so a
// recycled pid is never signalled.
func killIfSame(pid int, start uint64) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if st, err := procStart(pid); err != nil || st != start {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// reap removes the run directories of servers that are gone, killing what they left.
func reap(cache string) (reaped int) {
	ents, err := os.ReadDir(runRoot(cache))
	if err != nil {
		return 0
	}
	for _, e := range ents {
		parts := strings.Split(e.Name(), ".")
		if len(parts) != 3 {
			continue
		}
		pid, err1 := strconv.Atoi(parts[0])
		st, err2 := strconv.ParseUint(parts[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if cur, err := procStart(pid); err == nil && cur == st {
			continue // its server is alive
		}
		dir := filepath.Join(runRoot(cache), e.Name())
		killRecorded(dir)
		if os.RemoveAll(dir) == nil {
			reaped++
		}
	}
	return reaped
}

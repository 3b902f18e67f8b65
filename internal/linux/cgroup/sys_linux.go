package cgroup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The few system calls the package makes, each wrapped once: errors carry the operation and
// the path, and still match errors.Is(err, unix.EXXX).

// writeFile writes data to a cgroup interface file in one write(2), as the kernel wants it
// (a partial write is an error, never retried piecewise). O_TRUNC is a no-op on cgroupfs and
// lets the same code write a fake tree's regular files.
func writeFile(path, data string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroup: open %s: %w", path, err)
	}
	defer unix.Close(fd)
	n, err := unix.Write(fd, []byte(data))
	if err != nil {
		return fmt.Errorf("cgroup: write %q to %s: %w", data, path, err)
	}
	if n != len(data) {
		return fmt.Errorf("cgroup: write %q to %s: short write (%d bytes): %w", data, path, n, unix.EIO)
	}
	return nil
}

// readFile reads a small interface file.
func readFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return "", fmt.Errorf("cgroup: read %s: %w", path, pe.Err)
		}
		return "", fmt.Errorf("cgroup: read %s: %w", path, err)
	}
	return string(b), nil
}

// exists reports whether path is there (an interface file the kernel offers, or a group).
func exists(path string) bool {
	return unix.Access(path, unix.F_OK) == nil
}

func realMkdir(path string) error {
	if err := unix.Mkdir(path, 0o755); err != nil {
		return fmt.Errorf("cgroup: mkdir %s: %w", path, err)
	}
	return nil
}

func realRmdir(path string) error {
	if err := unix.Rmdir(path); err != nil {
		return fmt.Errorf("cgroup: rmdir %s: %w", path, err)
	}
	return nil
}

// realSigkill sends SIGKILL to pid through a pidfd. With check set, it first makes sure the
// process the pidfd names is still in the group (check reads /proc/PID/cgroup), so a pid read
// from an unfrozen group and recycled since is never signalled. A process already gone is not
// an error.
func realSigkill(pid int, check func(pid int) bool) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if errors.Is(err, unix.ENOSYS) { // Linux before 5.3: no pidfds, a plain kill
		if check != nil && !check(pid) {
			return nil
		}
		if err := unix.Kill(pid, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("cgroup: kill SIGKILL %d: %w", pid, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("cgroup: pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if check != nil && !check(pid) {
		return nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("cgroup: pidfd_send_signal SIGKILL %d: %w", pid, err)
	}
	return nil
}

// readProcs returns the pids in dir's cgroup.procs and in every descendant group's.
func readProcs(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) && p != dir {
				return nil // a child group removed while walking
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("cgroup: read %s/cgroup.procs: %w", p, err)
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	if err != nil && !strings.HasPrefix(err.Error(), "cgroup:") {
		err = fmt.Errorf("cgroup: walk %s: %w", dir, err)
	}
	return pids, err
}

// removeTree removes the group at dir and every group below it, deepest first. A tree
// already gone is not an error.
func (s *system) removeTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cgroup: list %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := s.removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := s.rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

// keyed reads a "key value" interface file (memory.events, cgroup.events, memory.oom_control)
// and returns the value of key.
func keyed(path, key string) (int64, error) {
	s, err := readFile(path)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		if k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("cgroup: %s: bad %s %q: %w", path, key, v, unix.EINVAL)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("cgroup: %s has no %s: %w", path, key, unix.ENOENT)
}

// startTime reads a process's start time (field 22 of /proc/PID/stat, clock ticks after
// boot). comm may hold spaces and parentheses, so fields are counted after the last ')'.
func startTime(proc string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("cgroup: /proc/%d/stat: %w", pid, unix.EINVAL)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("cgroup: /proc/%d/stat: %w", pid, unix.EINVAL)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether the owner of a group still runs: its pid is there with the start
// time recorded. Anything else (gone, recycled, a zombie) is dead.
func (s *system) alive(o owner) bool {
	st, err := startTime(s.proc, o.pid)
	if err != nil || st != o.start {
		return false
	}
	b, err := os.ReadFile(filepath.Join(s.proc, strconv.Itoa(o.pid), "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// inGroup reports whether pid is still in a group whose directory is named dir (in any
// hierarchy), per /proc/PID/cgroup.
func (s *system) inGroup(pid int, dir string) bool {
	b, err := os.ReadFile(filepath.Join(s.proc, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return false
	}
	elem := "/" + parentName + "/" + dir
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && (strings.HasSuffix(f[2], elem) || strings.Contains(f[2], elem+"/")) {
			return true
		}
	}
	return false
}

// dedupe sorts pids and drops repeats.
func dedupe(pids []int) []int {
	slices.Sort(pids)
	return slices.Compact(pids)
}

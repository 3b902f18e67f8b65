package cgroup

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The v2 driver: the unified hierarchy, one directory per group.

// v2enable makes ctrls available to dir's children (dir/cgroup.subtree_control). The kernel
// refuses that with EBUSY while dir itself holds processes (no internal processes, except at
// the root): a delegated cgroup holds the server itself, so its processes are moved to the
// leaf dir/virtx-server first and the write is tried again.
func (s *system) v2enable(dir string, ctrls []string) error {
	file := filepath.Join(dir, "cgroup.subtree_control")
	cur, err := readFile(file)
	if err != nil {
		return err
	}
	have := strings.Fields(strings.ReplaceAll(cur, "+", ""))
	var add []string
	for _, c := range ctrls {
		if !slices.Contains(have, c) {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	err = s.write(file, strings.Join(add, " "))
	if errors.Is(err, unix.EBUSY) {
		if merr := s.v2moveToLeaf(dir); merr != nil {
			return fmt.Errorf("%w (and moving its processes out failed: %v)", err, merr)
		}
		err = s.write(file, strings.Join(add, " "))
	}
	return err
}

// v2moveToLeaf moves every process of dir into dir/virtx-server, repeating while new ones
// appear (a process forking as it is moved).
func (s *system) v2moveToLeaf(dir string) error {
	leaf := filepath.Join(dir, leafName)
	if err := s.mkdir(leaf); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	for range 100 {
		b, err := readFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			return err
		}
		pids := strings.Fields(b)
		if len(pids) == 0 {
			return nil
		}
		for _, p := range pids {
			if err := s.write(filepath.Join(leaf, "cgroup.procs"), p); err != nil && !errors.Is(err, unix.ESRCH) {
				return err
			}
		}
	}
	return fmt.Errorf("cgroup: %s keeps gaining processes while they are moved to %s: %w", dir, leaf, unix.EBUSY)
}

// v2apply writes lim into the group at dir, whose parent enabled the controllers lim needs.
func (s *system) v2apply(dir string, lim Limits) error {
	if lim.MemoryBytes > 0 {
		if err := s.write(filepath.Join(dir, "memory.max"), strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
			return err
		}
		// No swap beyond the limit; the file is there only with swap accounting.
		if sw := filepath.Join(dir, "memory.swap.max"); exists(sw) {
			if err := s.write(sw, "0"); err != nil {
				return err
			}
		}
	}
	if lim.CPUs > 0 {
		if err := s.write(filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", lim.cpuQuota(), cpuPeriod)); err != nil {
			return err
		}
	}
	if lim.CPUSet != "" {
		if err := s.write(filepath.Join(dir, "cpuset.cpus"), lim.CPUSet); err != nil {
			return err
		}
	}
	if lim.Pids > 0 {
		if err := s.write(filepath.Join(dir, "pids.max"), strconv.FormatInt(lim.Pids, 10)); err != nil {
			return err
		}
	}
	return nil
}

// v2freeze freezes (or thaws) the group at dir and, when freezing, waits up to a second for
// cgroup.events to say "frozen 1" (a task in uninterruptible sleep may never freeze; the
// kill goes on regardless). Kills do not depend on it: SIGKILL reaches frozen v2 tasks.
func (s *system) v2freeze(dir string, on bool) {
	v := "0"
	if on {
		v = "1"
	}
	if err := s.write(filepath.Join(dir, "cgroup.freeze"), v); err != nil || !on {
		return
	}
	end := time.Now().Add(time.Second)
	for d := 100 * time.Microsecond; time.Now().Before(end); d = min(2*d, 20*time.Millisecond) {
		if n, err := keyed(filepath.Join(dir, "cgroup.events"), "frozen"); err != nil || n == 1 {
			return
		}
		time.Sleep(d)
	}
}

// v2populated reads "populated" from cgroup.events: whether any process is in the group or
// below it.
func v2populated(dir string) (bool, error) {
	n, err := keyed(filepath.Join(dir, "cgroup.events"), "populated")
	return n != 0, err
}

// v2set rewrites every limit file of the group at dir to lim (SetLimits): what lim leaves out
// is unlimited again. A limit whose controller the group lacks is ENOENT (ErrCannotEnforce).
func (s *system) v2set(dir string, lim Limits) error {
	type file struct {
		name, v string
		need    bool // lim sets it: the file must be there
	}
	mem, swap, cpu, pids := "max", "max", fmt.Sprintf("max %d", cpuPeriod), "max"
	if lim.MemoryBytes > 0 {
		mem, swap = strconv.FormatInt(lim.MemoryBytes, 10), "0"
	}
	if lim.CPUs > 0 {
		cpu = fmt.Sprintf("%d %d", lim.cpuQuota(), cpuPeriod)
	}
	if lim.Pids > 0 {
		pids = strconv.FormatInt(lim.Pids, 10)
	}
	for _, f := range []file{
		{"memory.max", mem, lim.MemoryBytes > 0},
		{"memory.swap.max", swap, false}, // there only with swap accounting
		{"cpu.max", cpu, lim.CPUs > 0},
		{"cpuset.cpus", lim.CPUSet, lim.CPUSet != ""}, // "": the parent's
		{"pids.max", pids, lim.Pids > 0},
	} {
		p := filepath.Join(dir, f.name)
		if !f.need && !exists(p) {
			continue
		}
		if err := s.write(p, f.v); err != nil {
			return err
		}
	}
	return nil
}

package cgroup

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The v1 driver: one directory per group in each controller hierarchy it joins.

// v1cpusetInit fills cpuset.cpus and cpuset.mems of a new v1 cpuset group from its parent's:
// a v1 cpuset group starts with both empty, and a process cannot join it until they are set.
// cpus, when not "", is the group's own choice.
func (s *system) v1cpusetInit(dir, cpus string) error {
	if !exists(filepath.Join(dir, "cpuset.cpus")) {
		return nil // this hierarchy has no cpuset controller
	}
	parent := filepath.Dir(dir)
	for _, f := range []string{"cpuset.mems", "cpuset.cpus"} {
		v := cpus
		if f == "cpuset.mems" || v == "" {
			cur, err := readFile(filepath.Join(dir, f))
			if err != nil {
				return err
			}
			if strings.TrimSpace(cur) != "" {
				continue // set already (a parent made earlier, or clone_children)
			}
			p, err := readFile(filepath.Join(parent, f))
			if err != nil {
				return err
			}
			v = strings.TrimSpace(p)
		}
		if err := s.write(filepath.Join(dir, f), v); err != nil {
			return err
		}
	}
	return nil
}

// v1apply writes lim's part for the hierarchy at dir (it writes only the files that
// hierarchy has, so co-mounted hierarchies such as cpu,cpuacct need nothing special).
func (s *system) v1apply(dir string, lim Limits) error {
	w := func(file, v string) error { return s.write(filepath.Join(dir, file), v) }
	if lim.MemoryBytes > 0 && exists(filepath.Join(dir, "memory.limit_in_bytes")) {
		n := strconv.FormatInt(lim.MemoryBytes, 10)
		if err := w("memory.limit_in_bytes", n); err != nil {
			return err
		}
		// memory+swap at the same value: no swap at all beyond the limit. Without swap
		// accounting (no memsw files), swappiness 0 keeps the group's pages out of swap.
		switch {
		case exists(filepath.Join(dir, "memory.memsw.limit_in_bytes")):
			if err := w("memory.memsw.limit_in_bytes", n); err != nil {
				return err
			}
		case exists(filepath.Join(dir, "memory.swappiness")):
			if err := w("memory.swappiness", "0"); err != nil {
				return err
			}
		}
	}
	if lim.CPUs > 0 && exists(filepath.Join(dir, "cpu.cfs_quota_us")) {
		if err := w("cpu.cfs_period_us", strconv.Itoa(cpuPeriod)); err != nil {
			return err
		}
		if err := w("cpu.cfs_quota_us", strconv.FormatInt(lim.cpuQuota(), 10)); err != nil {
			return err
		}
	}
	if lim.Pids > 0 && exists(filepath.Join(dir, "pids.max")) {
		if err := w("pids.max", strconv.FormatInt(lim.Pids, 10)); err != nil {
			return err
		}
	}
	return nil
}

// v1freeze sets a v1 freezer group's state and, when freezing, waits up to a second for
// it to read FROZEN. v1 frozen tasks do not act on SIGKILL until thawed, so a kill freezes,
// signals, then thaws.
func (s *system) v1freeze(dir string, on bool) {
	state := filepath.Join(dir, "freezer.state")
	v := "THAWED"
	if on {
		v = "FROZEN"
	}
	if err := s.write(state, v); err != nil || !on {
		return
	}
	end := time.Now().Add(time.Second)
	for d := 100 * time.Microsecond; time.Now().Before(end); d = min(2*d, 20*time.Millisecond) {
		cur, err := readFile(state)
		if err != nil || strings.TrimSpace(cur) == "FROZEN" {
			return
		}
		time.Sleep(d)
	}
}

// mkdirOK is mkdir where an existing directory is fine.
func (s *system) mkdirOK(dir string) error {
	if err := s.mkdir(dir); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	return nil
}

// v1set rewrites every limit file of the group at dir to lim (SetLimits): what lim leaves out
// is unlimited again.
func (s *system) v1set(dir string, lim Limits) error {
	w := func(file, v string) error { return s.write(filepath.Join(dir, file), v) }
	if exists(filepath.Join(dir, "memory.limit_in_bytes")) {
		v := "-1"
		if lim.MemoryBytes > 0 {
			v = strconv.FormatInt(lim.MemoryBytes, 10)
		}
		files := []string{"memory.limit_in_bytes"}
		if exists(filepath.Join(dir, "memory.memsw.limit_in_bytes")) {
			// memory ≤ memory+swap at every step: raising, memsw first; lowering, memory.
			cur, err := readFile(filepath.Join(dir, "memory.limit_in_bytes"))
			if err != nil {
				return err
			}
			n, _ := strconv.ParseInt(strings.TrimSpace(cur), 10, 64)
			if lim.MemoryBytes <= 0 || lim.MemoryBytes > n {
				files = []string{"memory.memsw.limit_in_bytes", "memory.limit_in_bytes"}
			} else {
				files = append(files, "memory.memsw.limit_in_bytes")
			}
		} else if lim.MemoryBytes > 0 && exists(filepath.Join(dir, "memory.swappiness")) {
			files = append(files, "") // and swappiness 0, as v1apply
		}
		for _, f := range files {
			var err error
			if f == "" {
				err = w("memory.swappiness", "0")
			} else {
				err = w(f, v)
			}
			if err != nil {
				return err
			}
		}
	}
	if exists(filepath.Join(dir, "cpu.cfs_quota_us")) {
		q := "-1"
		if lim.CPUs > 0 {
			q = strconv.FormatInt(lim.cpuQuota(), 10)
		}
		if err := w("cpu.cfs_period_us", strconv.Itoa(cpuPeriod)); err != nil {
			return err
		}
		if err := w("cpu.cfs_quota_us", q); err != nil {
			return err
		}
	}
	if exists(filepath.Join(dir, "cpuset.cpus")) {
		cpus := lim.CPUSet
		if cpus == "" {
			p, err := readFile(filepath.Join(filepath.Dir(dir), "cpuset.cpus"))
			if err != nil {
				return err
			}
			cpus = strings.TrimSpace(p)
		}
		if err := w("cpuset.cpus", cpus); err != nil {
			return err
		}
	}
	if exists(filepath.Join(dir, "pids.max")) {
		v := "max"
		if lim.Pids > 0 {
			v = strconv.FormatInt(lim.Pids, 10)
		}
		if err := w("pids.max", v); err != nil {
			return err
		}
	}
	return nil
}

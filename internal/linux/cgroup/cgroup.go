package cgroup

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrCannotEnforce is wrapped by every error that means "a limit was asked for and this host
// cannot enforce it": no cgroup filesystem, a hierarchy this process may not write (rootless
// without delegation), a controller that is not there. The message names the fix. A session
// refused for it is -32013, never a silently unlimited one.
var ErrCannotEnforce = errors.New("cgroup limits cannot be enforced")

// Limits are what a group enforces. The zero value enforces nothing (the group still tracks
// and kills its processes).
type Limits struct {
	// MemoryBytes caps the memory charged to the group (process memory, page cache, tmpfs
	// pages it wrote); past it the kernel reclaims, then OOM-kills a process in the group with
	// SIGKILL. No swap is allowed beyond it where the kernel can say so (v2 memory.swap.max=0,
	// v1 memory.memsw.limit_in_bytes, else memory.swappiness=0). 0: no limit.
	MemoryBytes int64
	// CPUs is a CPU-time quota in CPUs: 1.5 is 150 ms of CPU time every 100 ms period
	// (v2 cpu.max "150000 100000"; v1 cpu.cfs_quota_us=150000, cpu.cfs_period_us=100000).
	// 0: no quota.
	CPUs float64
	// CPUSet pins the group to these CPUs ("0-1", "0,2"). Only where the cpuset controller is
	// available (see Info.Controllers); asking for it elsewhere is ErrCannotEnforce.
	// "": no pinning.
	CPUSet string
	// Pids caps the number of tasks (processes and threads) in the group: fork and clone
	// fail with EAGAIN past it. 0: no limit.
	Pids int64
}

// controllers names the controllers lim needs, in the order they are set up.
func (lim Limits) controllers() []string {
	var c []string
	if lim.MemoryBytes > 0 {
		c = append(c, "memory")
	}
	if lim.Pids > 0 {
		c = append(c, "pids")
	}
	if lim.CPUs > 0 {
		c = append(c, "cpu")
	}
	if lim.CPUSet != "" {
		c = append(c, "cpuset")
	}
	return c
}

func (lim Limits) validate() error {
	switch {
	case lim.MemoryBytes < 0:
		return fmt.Errorf("cgroup: negative memory limit %d", lim.MemoryBytes)
	case lim.CPUs < 0 || lim.CPUs != lim.CPUs || lim.CPUs > 1<<20:
		return fmt.Errorf("cgroup: bad CPU quota %v", lim.CPUs)
	case lim.Pids < 0:
		return fmt.Errorf("cgroup: negative pids limit %d", lim.Pids)
	case strings.Trim(lim.CPUSet, "0123456789,-") != "":
		return fmt.Errorf("cgroup: bad cpuset %q (want a list such as 0-1 or 0,2)", lim.CPUSet)
	}
	return nil
}

// cpuPeriod is the CFS period every quota is expressed in, in microseconds (the kernel's
// default; 1 ms is the smallest quota it takes).
const cpuPeriod = 100000

// cpuQuota is CPUs as microseconds per cpuPeriod.
func (lim Limits) cpuQuota() int64 {
	q := int64(lim.CPUs*cpuPeriod + 0.5)
	if q < 1000 {
		q = 1000
	}
	return q
}

// Info is what Detect found out about this host's cgroups.
type Info struct {
	// Version is where the limits live: 2 (the unified hierarchy), 1 (v1 controller
	// hierarchies; on a hybrid host also when v2 is mounted beside them), or 0: none usable.
	Version int
	// Controllers are the controllers groups can use, sorted: of memory, pids, cpu, cpuset
	// (limits) and freezer (v1 kills). On v2 that is what the parent offers to its children.
	Controllers []string
	// Writable says this process may create groups (root, or a delegated v2 subtree).
	Writable bool
	// Root is the virtx parent directory groups are made under: on v2 BASE/virtx, where BASE
	// is the hierarchy's root (as root) or this process's delegated cgroup (rootless); on v1
	// the parent in the memory hierarchy (the same name sits in every v1 hierarchy used).
	Root string
	// Reason says why limits cannot all be enforced, naming the fix; "" when memory, pids and
	// cpu limits all can be.
	Reason string
}

// Has reports whether ctrl is one of the controllers groups can use.
func (i Info) Has(ctrl string) bool {
	for _, c := range i.Controllers {
		if c == ctrl {
			return true
		}
	}
	return false
}

// owner identifies the server process that made a group: its pid and its start time (clock
// ticks after boot, field 22 of /proc/PID/stat), so a recycled pid is not mistaken for it.
type owner struct {
	pid   int
	start uint64
}

// groupDir is the directory name of group name made by o: NAME@PID-START.
func groupDir(name string, o owner) string {
	return name + "@" + strconv.Itoa(o.pid) + "-" + strconv.FormatUint(o.start, 10)
}

// parseGroupDir is groupDir's inverse; ok is false for names virtx did not make.
func parseGroupDir(dir string) (name string, o owner, ok bool) {
	at := strings.LastIndexByte(dir, '@')
	if at <= 0 {
		return "", owner{}, false
	}
	pidS, startS, found := strings.Cut(dir[at+1:], "-")
	if !found {
		return "", owner{}, false
	}
	pid, err1 := strconv.Atoi(pidS)
	start, err2 := strconv.ParseUint(startS, 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return "", owner{}, false
	}
	return dir[:at], owner{pid, start}, validName(dir[:at]) == nil
}

// validName accepts the group names Create takes: 1 to 64 of [A-Za-z0-9_.-], not starting
// with '.', so a name is one path element and cannot look like a cgroup interface file.
func validName(name string) error {
	if name == "" || len(name) > 64 || name[0] == '.' {
		return fmt.Errorf("cgroup: bad group name %q", name)
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.':
		default:
			return fmt.Errorf("cgroup: bad group name %q (want [A-Za-z0-9_.-])", name)
		}
	}
	return nil
}

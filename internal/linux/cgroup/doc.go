// Package cgroup puts a session's processes in a Linux control group ("cgroup"), so that
// the kernel enforces its machine shape (memory, CPU time, CPUs, number of tasks) and so that
// every process of the session can be found and killed, however it daemonised.
//
// # Cgroups, v1 and v2
//
// A cgroup is a directory in a cgroup filesystem. Making a directory makes a group; writing
// a pid into its cgroup.procs moves that process (and, from then on, every child it forks)
// into it; writing its interface files (memory.max, pids.max…) sets what the kernel enforces
// on the processes inside; an empty group is removed with rmdir. Each kind of limit belongs
// to a controller: memory, cpu (CPU-time quota), cpuset (which CPUs), pids (number of
// tasks), freezer.
//
//   - cgroup v1 mounts one hierarchy per controller (or per few), typically
//     /sys/fs/cgroup/memory, /sys/fs/cgroup/pids, /sys/fs/cgroup/cpu,cpuacct…: a group is
//     a directory of the same name in each hierarchy it uses, and a process is moved in each.
//   - cgroup v2 (the unified hierarchy) is one tree, usually at /sys/fs/cgroup, in which a
//     group's controllers are those its parent enabled in cgroup.subtree_control. v2 adds
//     cgroup.kill (kill everything inside, Linux 5.14+), cgroup.freeze and cgroup.events
//     (populated 0/1), and allows safe delegation of a subtree to an unprivileged user.
//   - A hybrid host (this project's CI machine, older systemd defaults) mounts v1
//     hierarchies for the controllers and a v2 tree without them at /sys/fs/cgroup/unified.
//
// Detect reads the mount table (/proc/self/mountinfo) and this process's cgroups
// (/proc/self/cgroup) and decides: if the memory, pids or cpu controller is mounted as a v1
// hierarchy, the limits live in v1 (Info.Version 1); else, with a cgroup2 mount, in v2
// (Version 2); else nothing is usable (Version 0). On a hybrid host a group also gets a
// directory in the unified tree, without limits, to be killed with cgroup.kill and watched
// through cgroup.events, as on v2.
//
// # Where groups go
//
// Every group lives under a per-host parent named "virtx" (in each hierarchy it uses):
//
//   - root: directly under the hierarchy's root, /sys/fs/cgroup/virtx (v2) or
//     /sys/fs/cgroup/memory/virtx, /sys/fs/cgroup/pids/virtx… (v1). The parent stays; it is
//     shared by every virtx server on the host.
//   - rootless, v2 only: under the cgroup systemd delegated to this process
//     (`systemd-run --user --scope -p Delegate=yes virtx serve`), whose files the user owns.
//     The kernel gives controllers to a group's children only when the group itself holds no
//     processes ("no internal processes"), so the server, found in its own delegated cgroup,
//     is first moved into a leaf beside the parent: DELEGATED/virtx-server. Without a
//     delegated cgroup, or on v1 (which cannot be delegated safely), nothing can be limited
//     and Create says so, naming the fix.
//
// A group's directory is NAME@PID-START: the name the caller gave, then the creating
// server's pid and start time (field 22 of /proc/PID/stat). ReapStale lists the parents and
// removes, after killing what is left inside, every group whose owner no longer runs with
// that start time — what a SIGKILLed server left. Owners are looked up in this process's
// /proc: servers in other pid namespaces sharing a cgroup tree would look dead.
//
// # Limits
//
// Limits map onto interface files; a limit that cannot be written is an error wrapping
// ErrCannotEnforce, and a group is never left half-made:
//
//	Limits        v2                                   v1
//	MemoryBytes   memory.max, memory.swap.max=0        memory.limit_in_bytes, memory.memsw.limit_in_bytes
//	                                                   (or memory.swappiness=0 without swap accounting)
//	CPUs          cpu.max "QUOTA 100000"               cpu.cfs_period_us=100000, cpu.cfs_quota_us=QUOTA
//	CPUSet        cpuset.cpus                          cpuset.cpus (+ cpuset.mems copied from the parent)
//	Pids          pids.max                             pids.max
//
// Memory charged to a group includes the page cache and tmpfs pages its processes write
// (so a session's tmpfs upper directory counts against its memory). Past the limit the
// kernel reclaims, then its OOM killer kills one process in the group with SIGKILL — one
// process, not the group (memory.oom.group is left off, so a session survives a memory bomb
// and answers the next command). OOMKills counts those kills. SetLimits gives a group other
// limits in place (what the new ones leave out is unlimited again), for a group made ahead
// whose process has not started anything yet.
//
// # Killing
//
// Kill kills everything in the group and below it with SIGKILL and waits until it is empty
// (10 s at most). On v2, and through the unified tree on a hybrid host, that is one write
// to cgroup.kill, which also makes every fork racing with it fail. Without cgroup.kill the
// group is frozen (v2 cgroup.freeze, v1 freezer.state), its processes listed and signalled,
// and thawed, repeatedly until none is left, so nothing can fork its way out; with nothing to
// freeze with, each pid is checked to still be in the group (through a pidfd and
// /proc/PID/cgroup) before it is signalled. Zombies leave their group when they exit, so a
// double-forked daemon whose parent never reaps it does not keep a group busy.
//
// # Starting a process inside a group
//
// Moving a process into a group (Add: its pid written to cgroup.procs) takes the kernel's
// global cgroup_threadgroup_rwsem for writing, so that no thread of any process forks or
// exits meanwhile. It is a per-CPU semaphore, cheap for its readers (every fork and exit on
// the machine) and dear for a writer, which waits for an RCU grace period when no other
// writer came in the last one: on this project's CI machine (2 CPUs, under load) the first
// of a group's six writes took 5–9 ms, the five after it tens of microseconds, and writes
// from parallel goroutines only queue on the same lock. (Mounting cgroupfs with
// favordynmods skips the wait, at a cost to every fork.) StartProcess moves no process:
//
//   - v1: the calling thread, locked to its goroutine, moves itself alone into each of the
//     group's v1 directories (0 written to tasks: a thread moving itself is the one move
//     for which the kernel skips the global lock; tens to hundreds of microseconds for five
//     hierarchies), forks — a child is born in the cgroups of the thread that forked it —
//     and moves itself back to where /proc/thread-self/cgroup said it was (or, failing
//     that, to the virtx parent), with its CPU affinity (a v1 cpuset resets it), before it
//     is unlocked. The Go runtime never makes a thread from a locked one (its template
//     thread does), so no other thread of the process is born inside. A thread that cannot
//     leave stays locked and is logged: it ends with its goroutine (the main thread, which
//     the runtime never ends, would stay) instead of running other goroutines in the group.
//     While it is inside, the group's v1 cgroup.procs lists this process: Procs never
//     counts it (a group never holds its own server), and Kill and Destroy wait for the
//     start to end.
//   - v2, and the unified tracking group of a hybrid host: clone3 with CLONE_INTO_CGROUP
//     (Linux 5.7+) makes the process in the group's directory. A v2 thread cannot join a
//     domain group alone, so where the kernel refuses clone3 or the flag (ENOSYS, E2BIG,
//     EINVAL, or EPERM from a seccomp filter) the process is started without it and moved
//     in, as Add would, before StartProcess returns; it must not fork before then.
//
// A process started so with a new cgroup namespace (CLONE_NEWCGROUP) has it rooted at the
// group in every hierarchy the group uses (the kernel roots it at the new process's own
// cgroups), so /proc/self/cgroup inside reads "/" there; moved in after it started, the
// process would see paths outside its namespace ("/../virtx/…").
//
// # What is written here rather than taken from a library
//
// The mount table and /proc/self/cgroup parsers, and the few cgroupfs file formats ("key
// value" lines), are small and read here: golang.org/x/sys/unix has no parser for them, and
// the cgroup libraries that do (containerd/cgroups, runc's libcontainer/cgroups) bring
// systemd D-Bus and far more than four limits. Every system call goes through
// golang.org/x/sys/unix and is wrapped once (sys_linux.go).
//
// # Testing
//
// A system (detect_linux.go) names where the package looks and how it writes, so the unit
// tests run the v2 driver against a fake cgroup tree in a temporary directory whose writes
// behave like the kernel's (fake_linux_test.go), including rootless delegation and its
// refusals; the rest of the tests run on the real kernel as root.
//
// Off Linux, Detect reports Version 0 and Create fails with an error wrapping
// ErrCannotEnforce.
package cgroup

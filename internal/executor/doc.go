// Package executor is virtx's one executor: it runs a session's commands
// and reads and writes its files. The same code runs in-process for the
// host backend, as PID 1 of a namespace sandbox, and as /init in a VM
// guest, so it keeps no global state but what is listed under "Process-wide
// effects" below. It works on Linux only; elsewhere New and every function
// return an "unsupported on GOOS" error.
//
// # The session's cwd and its spelling
//
// A session has a current directory, and the server keeps it: every
// ExecRequest carries it (Cwd) and every ExecResult gives it back. It is
// kept in the session's own spelling, the one the client used, which is not
// necessarily the physical path: a tree seen through a symlink keeps the
// symlink in its name. So:
//
//   - `cd` ([]string{"cd"} or []string{"cd", DIR}) is interpreted, not run.
//     DIR is joined onto the cwd logically (path.Join and path.Clean, as a
//     shell's default `cd -L` does) and never canonicalised; `cd -P DIR`
//     resolves symlinks when asked to. No DIR is $HOME from Config.Env, or
//     "/". A missing DIR, a file, or extra arguments are answered as a
//     shell answers them (code 1 and "cd: DIR: No such file or directory"
//     on stderr), not as errors, and leave the cwd where it was.
//   - `pwd` and `pwd -L` are answered from the cwd, so they print its
//     spelling; `pwd -P` runs the real program.
//   - Every command runs with its working directory at the cwd and PWD set
//     to the cwd's spelling, so `sh -c pwd` and $PWD agree with it too.
//   - Nothing else moves the session: `sh -c 'cd x && …'` moves only that
//     shell.
//
// # Commands
//
// Cmd is an argv, run without a shell. A program name without '/' is looked
// up in the PATH of Config.Env (relative entries against the cwd), not the
// executor's own; one with '/' is relative to the cwd. A program that is not
// there or will not start is an error matching ErrNotExecutable (and the
// errno, or exec.ErrNotFound), never an exit code. Stdin is /dev/null.
//
// The result carries the exit status, or 128+signal when a signal killed
// the command. Stdout and stderr are captured apart and byte exact, up to
// Config.OutputLimit bytes each; past that, output is still read (so the
// command is not blocked or killed for it) but dropped, and Truncated says
// so. Memory per command stays bounded by the limit whatever the command
// writes. Once the command itself has exited, its pipes are read for at
// most 200 ms more, for output from background processes it left: those
// keep running (agents start servers that way), and whatever they write
// later is read and discarded, so they are not killed by SIGPIPE.
//
// # Killing a process tree
//
// Every command runs in its own process group. When its Timeout expires or
// its context ends, its whole process tree is killed with SIGKILL, without
// a grace period, and Exec returns a *TimeoutError (or ctx.Err()) and no
// result. The tree is found by walking /proc: the command, every member of
// its process group, every descendant of those by parent pid, and every
// process seen in an earlier pass (so one whose parent was killed under it
// is still found). Everything found is first stopped with SIGSTOP, and
// /proc is walked again until nothing new appears, so nothing can fork its
// way out; then all are killed, and the walk repeats until none is left
// alive. Signals go through pidfds after checking the process's start
// time, so a recycled pid is never signalled.
//
// KillAll does the same for every command still running and for the
// process groups of finished commands that still have members. A process
// that left its command's process group (setsid) and whose parent then
// died is not attributable through /proc alone; with Config.Subreaper it is
// re-parented to the executor's process, and KillAll kills every such
// orphan outside the executor's own process group. In a namespace sandbox
// or a VM, the executor is PID 1 and everything is its descendant anyway.
//
// # Files
//
// Read and Write take absolute paths (a relative one is an error matching
// ErrInvalidArgument). Read returns at most Config.ReadLimit bytes, with the
// file's size so a caller can tell there is more. Write replaces a file, or
// with an offset overwrites part of it, and refuses targets whose real path
// (symlinks resolved, the target's own included, dangling or not) lies in a
// Config.ReadOnly tree, with an error matching ErrReadOnly. That check is
// the executor's own, for the host backend where nothing is mounted
// read-only; elsewhere the kernel's EROFS also matches ErrReadOnly. Missing
// paths match fs.ErrNotExist (ENOTDIR too), directories unix.EISDIR, and
// other failures keep their errno.
//
// # Layers
//
// A snapshot is the session's overlayfs upper directory as an OCI image
// layer tar. WriteLayer writes one: entries in sorted order with relative
// names (directories with a trailing '/'), so the same tree gives the same
// bytes; a whiteout (a 0/0 character device) becomes an empty regular file
// DIR/.wh.NAME; a directory marked opaque (trusted.overlay.opaque or, for a
// rootless overlay, user.overlay.opaque = "y") is followed by
// DIR/.wh..wh..opq; files with several links become hard-link entries to
// the first name (whiteouts, which overlayfs links together, never do);
// mode, owner, mtime (whole seconds) and xattrs are kept, the xattrs as PAX
// SCHILY.xattr records, except overlayfs's own (trusted.overlay.*,
// user.overlay.*), which are dropped. The upper must come from an overlay
// mounted with metacopy=off and redirect_dir=off (and index=off), since a
// metacopy file or a redirected directory is not whole in the upper.
//
// ApplyLayer is the inverse, for putting a snapshot back before the overlay
// is mounted. It refuses, with an error and without writing outside the
// directory, any entry with an absolute name, a ".." element, a parent path
// through a symlink (directories are opened one element at a time with
// O_NOFOLLOW), or a hard link whose target is any of those.
//
// # Process-wide effects
//
// With Config.Subreaper, New makes the process a child subreaper (prctl
// PR_SET_CHILD_SUBREAPER) for the rest of its life, and the executor reaps
// zombies re-parented to it, at the start and end of each Exec and in
// KillAll: only zombies whose parent is this process, that are outside this
// process's own process group, and that are not a command os/exec is
// waiting on. It looks first with one waitid(WNOWAIT), which says whether any
// child has ended without reaping it, and reads /proc to find which only when
// one has: the usual exec leaves nothing to reap, and the /proc walk was half
// of what an exec of /bin/true cost a sandbox's PID 1. A program that sets
// Subreaper should therefore run one
// Executor, and start any other children of its own without Setpgid (they
// stay in its group and are left alone). An executor running as PID 1
// (sandbox, VM) should set Subreaper too: orphans come to PID 1 anyway, and
// Subreaper is what makes the executor reap them. Without Subreaper, the
// executor affects nothing beyond the processes it starts. /proc must be
// mounted: it is how process trees are found. Besides error values, the
// package has no package-level variables.
package executor

package vm

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// spawner starts every QEMU and virtiofsd of this process from one OS thread that never
// exits. It exists for two reasons:
//
//   - Pdeathsig: the kernel sends a child its parent-death signal when the *thread*
//     that forked it exits, not the process. Go may end idle threads; this one is
//     locked and never unlocked, so the signal comes exactly when the server dies.
//   - virtiofsd's tree: the share a guest sees is a tmpfs with bind mounts (the host
//     image's dirs, the session's trees) built in a mount namespace of its own. The
//     thread unshares its mount namespace, builds the tree, starts virtiofsd (which
//     inherits that namespace, and with it is the only process that sees the tree) and
//     returns to the server's namespace. Nothing is mounted in the host's namespace, so
//     nothing is left mounted when the server is killed.
type spawner struct {
	once   sync.Once
	reqs   chan func()
	origNS int
	err    error
}

var theSpawner spawner

func (s *spawner) start() error {
	s.once.Do(func() {
		s.reqs = make(chan func())
		ready := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			fd, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				s.err = fmt.Errorf("open /proc/thread-self/ns/mnt: %w", err)
			}
			s.origNS = fd
			close(ready)
			for f := range s.reqs {
				f()
			}
		}()
		<-ready
	})
	return s.err
}

// do runs f on the spawner thread.
func (s *spawner) do(f func()) error {
	if err := s.start(); err != nil {
		return err
	}
	done := make(chan struct{})
	s.reqs <- func() { f(); close(done) }
	<-done
	return nil
}

// startCmd starts cmd from the spawner thread with SIGKILL as its parent-death signal.
func (s *spawner) startCmd(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &unix.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = unix.SIGKILL
	var err error
	if derr := s.do(func() { err = cmd.Start() }); derr != nil {
		return derr
	}
	return err
}

// inPrivateNS runs build in a fresh mount namespace of the spawner thread (mounts made
// there propagate nowhere) and then starts cmds, whose processes stay in that namespace;
// the thread then goes back to the process's own namespace.
func (s *spawner) inPrivateNS(build func() error, cmds ...*exec.Cmd) error {
	for _, cmd := range cmds {
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &unix.SysProcAttr{}
		}
		cmd.SysProcAttr.Pdeathsig = unix.SIGKILL
	}
	var err error
	derr := s.do(func() {
		if e := unix.Unshare(unix.CLONE_NEWNS); e != nil {
			err = &os.SyscallError{Syscall: "unshare(CLONE_NEWNS)", Err: e}
			return
		}
		defer func() {
			if e := unix.Setns(s.origNS, unix.CLONE_NEWNS); e != nil {
				// The thread cannot go back: keep it out of use rather than spawn
				// later children in a session's namespace.
				panic(fmt.Sprintf("vm: setns back to the server's mount namespace: %v", e))
			}
		}()
		if e := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); e != nil {
			err = fmt.Errorf("make / a slave in the share's namespace: %w", e)
			return
		}
		if err = build(); err != nil {
			return
		}
		for _, cmd := range cmds {
			if err = cmd.Start(); err != nil {
				return
			}
		}
	})
	if derr != nil {
		return derr
	}
	return err
}

package hostcheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/internal/linux/cgroup"
)

// Local is this machine.
func Local() *Host {
	var uts unix.Utsname
	release := ""
	if err := unix.Uname(&uts); err == nil {
		release = unix.ByteSliceToString(uts.Release[:])
	}
	return &Host{
		Proc:            "/proc",
		Dev:             "/dev",
		Sys:             "/sys",
		Modules:         filepath.Join("/lib/modules", release),
		Euid:            os.Geteuid(),
		Kernel:          release,
		GOARCH:          runtime.GOARCH,
		LookPath:        exec.LookPath,
		DetectCgroups:   cgroup.Detect,
		FindCacheDir:    console.CacheDir,
		Writable:        writable,
		FreeSpace:       freeSpace,
		ProbeNamespaces: probeNamespaces,
		ProbeKVM:        probeKVM,
	}
}

// probeNamespaces runs `true` in new mount, pid, uts, ipc, net and cgroup namespaces (and a
// user namespace mapping this process's uid and gid to root, when user is set).
func probeNamespaces(user bool) error {
	prog, err := exec.LookPath("true")
	if err != nil {
		return fmt.Errorf("hostcheck: find a probe program: %w", err)
	}
	cmd := exec.Command(prog)
	attr := &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
			unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP,
		Pdeathsig: syscall.SIGKILL,
	}
	if user {
		attr.Cloneflags |= unix.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}}
		attr.GidMappingsEnableSetgroups = false
	}
	cmd.SysProcAttr = attr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("hostcheck: clone into new namespaces: %w", err)
	}
	return nil
}

// KVM's ioctls (linux/kvm.h): _IO(KVMIO, n) with KVMIO 0xAE. golang.org/x/sys/unix does not
// define them.
const (
	kvmGetAPIVersion = 0xAE00
	kvmCreateVM      = 0xAE01
)

// probeKVM opens dev, reads KVM's API version and creates a VM (no memory, no vCPU: nothing
// runs), then closes it.
func probeKVM(dev string) (int, error) {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	api, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil {
		return 0, fmt.Errorf("ioctl KVM_GET_API_VERSION: %w", err)
	}
	vm, err := unix.IoctlRetInt(fd, kvmCreateVM)
	if err != nil {
		return api, fmt.Errorf("ioctl KVM_CREATE_VM: %w", err)
	}
	unix.Close(vm)
	return api, nil
}

// freeSpace is the room an unprivileged writer has in the filesystem holding path.
func freeSpace(path string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// writable reports whether this process (its effective ids) may create files in dir.
func writable(dir string) bool {
	return unix.Faccessat(unix.AT_FDCWD, dir, unix.W_OK|unix.X_OK, unix.AT_EACCESS) == nil
}

package linux

import (
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Capabilities, the bounding set and no_new_privs are attributes of a thread, not of a
// process: the calls below change the calling thread only, and what a thread changes is
// inherited by the processes it starts (and the threads it creates). A Go program that
// wants its children confined locks a goroutine to its thread (runtime.LockOSThread),
// confines that thread, and starts the children from that goroutine.

// LastCap is the highest capability number the running kernel knows.
func LastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return n
		}
	}
	return unix.CAP_LAST_CAP
}

// LimitThreadCaps confines what the calling thread's future children can hold to keep
// (capability numbers): every other capability leaves the bounding set (PR_CAPBSET_DROP)
// and the inheritable set, and the ambient set is cleared. The thread's own permitted and
// effective sets are unchanged; a program it executes as root starts with at most keep.
func LimitThreadCaps(keep []int) error {
	want := map[int]bool{}
	for _, c := range keep {
		want[c] = true
	}
	for c := 0; c <= LastCap(); c++ {
		if want[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return wrap("prctl PR_CAPBSET_DROP", "cap "+strconv.Itoa(c), err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return wrap("prctl PR_CAP_AMBIENT_CLEAR_ALL", "", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return wrap("capget", "", err)
	}
	var mask [2]uint32
	for c := range want {
		mask[c/32] |= 1 << (uint(c) % 32)
	}
	for i := range data {
		data[i].Inheritable &= mask[i]
	}
	return wrap("capset", "", unix.Capset(&hdr, &data[0]))
}

// SetNoNewPrivs sets no_new_privs on the calling thread, which its children inherit:
// execve never grants privileges again (set-user-ID bits and file capabilities are
// ignored). It cannot be unset.
func SetNoNewPrivs() error {
	return wrap("prctl PR_SET_NO_NEW_PRIVS", "", unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
}

// ThreadCaps returns the calling thread's effective capability set as a bit mask.
func ThreadCaps() (uint64, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, wrap("capget", "", err)
	}
	return uint64(data[0].Effective) | uint64(data[1].Effective)<<32, nil
}

// SetHostname sets the host name of the calling process's UTS namespace.
func SetHostname(name string) error {
	return wrap("sethostname", name, unix.Sethostname([]byte(name)))
}

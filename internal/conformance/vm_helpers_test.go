package conformance

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The vm_* tests are the vm backend's own: isolation, leaks, benchmarks. They boot
// QEMU microVMs (under TCG where the host has no usable KVM, a few seconds each), so
// they run only when VIRTX_CONFORMANCE_BACKENDS names vm, and then need QEMU
// (qemu-system-x86), virtiofsd (qemu-system-common), mkfs.ext4 (e2fsprogs) and either a
// provisioned kernel (`virtx setup vm`) or apt-get to fetch one. A missing prerequisite
// fails under CI=true and skips elsewhere, naming the package.

func vmSelected() bool { return backendSelected("vm") }

// requireVM skips (or, under CI, fails) a vm test whose prerequisites are missing.
func requireVM(t testing.TB) {
	t.Helper()
	if !vmSelected() {
		t.Skip("vm tests run when VIRTX_CONFORMANCE_BACKENDS names vm")
	}
	missing := func(what, pkg string) {
		t.Helper()
		msg := what + " is missing: apt-get install " + pkg
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		missing("qemu-system-x86_64", "qemu-system-x86")
	}
	if _, err := os.Stat("/usr/lib/qemu/virtiofsd"); err != nil {
		missing("/usr/lib/qemu/virtiofsd", "qemu-system-common")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		missing("mkfs.ext4", "e2fsprogs")
	}
	if _, err := exec.LookPath("apt-get"); err != nil && os.Getenv("VIRTX_KERNEL") == "" {
		if _, err := os.Stat(filepath.Join(vmCache(t), "vm", vmKernelDir, "current")); err != nil {
			missing("a guest kernel (virtx setup vm)", "linux-image-cloud-amd64 via `virtx setup vm`")
		}
	}
}

// vmCache is the cache directory the servers under test use.
func vmCache(t testing.TB) string {
	if d := os.Getenv("VIRTX_HOME"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "virtx")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(home, ".cache", "virtx")
}

// descendants are the live processes below pid (by parent pid), with their names.
func descendants(pid int) map[int]string {
	parent := map[int]int{}
	name := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		parent[p] = pp
		name[p] = s[strings.IndexByte(s, '(')+1 : i]
	}
	out := map[int]string{}
	for p := range parent {
		for q := parent[p]; q > 1; q = parent[q] {
			if q == pid {
				out[p] = name[p]
				break
			}
		}
	}
	return out
}

// alive says which of pids still run (zombies are not alive).
func alive(pids map[int]string) map[int]string {
	out := map[int]string{}
	for p, n := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 0 && f[0] != "Z" {
			out[p] = n
		}
	}
	return out
}

// runDirsOf lists the vm run directories a server with this pid made.
func runDirsOf(t testing.TB, pid int) []string {
	m, _ := filepath.Glob(filepath.Join(vmCache(t), "vm", "run", strconv.Itoa(pid)+".*"))
	return m
}

// waitGone waits until none of pids is alive.
func waitGone(t testing.TB, pids map[int]string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for len(alive(pids)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still alive after %v: %v", d, alive(pids))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// kvmCreateVM is the KVM_CREATE_VM ioctl (_IO(KVMIO, 0x01)).
const kvmCreateVM = 0xAE01

// KVMUsable says whether hardware acceleration can be used, and if not why: the CPU
// must show vmx or svm in /proc/cpuinfo (a host whose KVM is PVM, a paravirtualised
// KVM that stock guest kernels cannot run on, shows neither), /dev/kvm must answer
// KVM_CREATE_VM, and no earlier boot may have found KVM unable to run the guest (a
// marker in the cache, written when a KVM boot missed its deadline and TCG booted
// instead). $VIRTX_VM_ACCEL=tcg or kvm forces the choice.
func KVMUsable(cache string) error {
	switch os.Getenv("VIRTX_VM_ACCEL") {
	case "tcg":
		return fmt.Errorf("VIRTX_VM_ACCEL=tcg")
	case "kvm":
		return nil
	}
	info, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return err
	}
	hw := false
	for _, line := range strings.Split(string(info), "\n") {
		if strings.HasPrefix(line, "flags") {
			for _, f := range strings.Fields(line) {
				if f == "vmx" || f == "svm" {
					hw = true
				}
			}
			break
		}
	}
	if !hw {
		return fmt.Errorf("the CPU shows neither vmx nor svm (no hardware virtualisation, or a PVM-only KVM): guests run under TCG, software emulation")
	}
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/kvm: %w", err)
	}
	defer unix.Close(fd)
	vm, err := unix.IoctlRetInt(fd, kvmCreateVM)
	if err != nil {
		return fmt.Errorf("KVM_CREATE_VM: %w", err)
	}
	unix.Close(vm)
	if b, err := os.ReadFile(kvmBrokenMarker(cache)); err == nil {
		return fmt.Errorf("an earlier KVM boot did not come up (%s); remove %s to try again", strings.TrimSpace(string(b)), kvmBrokenMarker(cache))
	}
	return nil
}

func kvmBrokenMarker(cache string) string { return filepath.Join(cache, "vm", "kvm-broken") }

// acceleration is "kvm" or "tcg" for this process's boots.
func (b *Backend) acceleration() string {
	b.accelOnce.Do(func() {
		b.accel = "tcg"
		if err := KVMUsable(b.cacheDir); err != nil {
			b.accelWhy = err.Error()
			b.log.Info("vm: no hardware acceleration; using TCG", "why", err)
			return
		}
		b.accel = "kvm"
	})
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.accel
}

// kvmBroken records that KVM could not boot the guest, here and in the cache.
func (b *Backend) kvmBroken(err error) {
	b.mu.Lock()
	b.accel, b.accelWhy = "tcg", err.Error()
	b.mu.Unlock()
	b.log.Warn("vm: a KVM boot did not come up; using TCG from now on", "err", err)
	_ = os.MkdirAll(filepath.Dir(kvmBrokenMarker(b.cacheDir)), 0o755)
	_ = os.WriteFile(kvmBrokenMarker(b.cacheDir), []byte(err.Error()+"\n"), 0o644)
}

package hostcheck

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/linux/cgroup"
)

// fakeHost is a host where everything is there and works, in temporary trees; tests take
// things away.
type fakeHost struct {
	*Host
	t     *testing.T
	top   string
	paths map[string]string // programs on PATH
}

func newFakeHost(t *testing.T) *fakeHost {
	t.Helper()
	top := t.TempDir()
	fh := &fakeHost{t: t, top: top, paths: map[string]string{
		"pasta": "/usr/bin/pasta", "slirp4netns": "/usr/bin/slirp4netns", "fusermount3": "/usr/bin/fusermount3",
		"mkfs.erofs": "/usr/bin/mkfs.erofs", "bwrap": "/usr/bin/bwrap", "qemu-system-x86_64": "/usr/bin/qemu-system-x86_64",
	}}
	fh.Host = &Host{
		Proc: filepath.Join(top, "proc"), Dev: filepath.Join(top, "dev"), Sys: filepath.Join(top, "sys"),
		Modules: filepath.Join(top, "modules"), Euid: 0, Kernel: "6.1.0-18-amd64", GOARCH: "amd64",
		LookPath: func(f string) (string, error) {
			if p, ok := fh.paths[f]; ok {
				return p, nil
			}
			return "", exec.ErrNotFound
		},
		DetectCgroups: func() cgroup.Info {
			return cgroup.Info{Version: 2, Controllers: []string{"cpu", "cpuset", "memory", "pids"}, Writable: true, Root: "/sys/fs/cgroup/virtx"}
		},
		FindCacheDir:    func() (string, error) { return filepath.Join(top, "cache", "virtx"), nil },
		Writable:        func(string) bool { return true },
		FreeSpace:       func(string) (uint64, error) { return 50 << 30, nil },
		ProbeNamespaces: func(bool) error { return nil },
		ProbeKVM:        func(string) (int, error) { return 12, nil },
	}
	fh.file("proc/filesystems", "nodev\tsysfs\nnodev\ttmpfs\n\text4\nnodev\toverlay\n\terofs\n")
	fh.file("proc/sys/user/max_user_namespaces", "63479\n")
	fh.file("proc/sys/kernel/unprivileged_userns_clone", "1\n")
	fh.file("proc/cpuinfo", "processor\t: 0\nflags\t\t: fpu vme de pse tsc msr pae mce cx8 vmx sse2\n\nprocessor\t: 1\nflags\t\t: fpu\n")
	fh.file("dev/kvm", "")
	fh.file("dev/fuse", "")
	return fh
}

func (fh *fakeHost) file(rel, content string) {
	fh.t.Helper()
	p := filepath.Join(fh.top, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		fh.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		fh.t.Fatal(err)
	}
}

func (fh *fakeHost) rm(rel string) {
	fh.t.Helper()
	if err := os.Remove(filepath.Join(fh.top, rel)); err != nil {
		fh.t.Fatal(err)
	}
}

// expect checks a result's status, need, and that detail and fix contain the given words.
func expect(t *testing.T, r Result, st Status, need Need, detail, fix string) {
	t.Helper()
	if r.Status != st || r.Need != need || !strings.Contains(r.Detail, detail) || !strings.Contains(r.Fix, fix) {
		t.Errorf("%s = %+v\nwant status %s, need %s, detail containing %q, fix containing %q", r.Name, r, st, need, detail, fix)
	}
	if st == OK && r.Fix != "" {
		t.Errorf("%s is OK with a fix %q", r.Name, r.Fix)
	}
}

func TestEverythingThere(t *testing.T) {
	fh := newFakeHost(t)
	rs := fh.All()
	if len(rs) != 11 {
		t.Fatalf("%d results, want 11", len(rs))
	}
	for _, r := range rs {
		if r.Status != OK {
			t.Errorf("%+v, want OK", r)
		}
	}
	var b bytes.Buffer
	Write(&b, rs)
	for _, w := range []string{"OK       namespaces", "sandbox backend: everything it needs is here", "a probe boot decides"} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("output lacks %q:\n%s", w, b.String())
		}
	}
}

func TestNamespacesProbeFails(t *testing.T) {
	fh := newFakeHost(t)
	fh.ProbeNamespaces = func(user bool) error {
		if user {
			t.Error("root probed with a user namespace")
		}
		return unix.EPERM
	}
	expect(t, fh.Namespaces(), Missing, NeedSandbox, "mount, pid, uts, ipc, net and cgroup", "seccomp")
	fh.Euid = 1000
	fh.ProbeNamespaces = func(user bool) error {
		if !user {
			t.Error("rootless probed without a user namespace")
		}
		return unix.EPERM
	}
	expect(t, fh.Namespaces(), Missing, NeedSandbox, "user, mount", "enable unprivileged user namespaces")
	fh.ProbeNamespaces = func(bool) error { return unix.EINVAL }
	expect(t, fh.Namespaces(), Missing, NeedSandbox, "invalid argument", "CONFIG_NAMESPACES")
}

func TestUserNamespaces(t *testing.T) {
	fh := newFakeHost(t)
	expect(t, fh.UserNamespaces(), OK, NeedOptional, "running as root", "")
	fh.file("proc/sys/kernel/unprivileged_userns_clone", "0\n")
	fh.file("proc/sys/user/max_user_namespaces", "0\n")
	r := fh.UserNamespaces()
	expect(t, r, Missing, NeedOptional, "may not", "kernel.unprivileged_userns_clone=1")
	if !strings.Contains(r.Fix, "user.max_user_namespaces=15000") {
		t.Errorf("fix %q lacks the max_user_namespaces sysctl", r.Fix)
	}
	fh.Euid = 1000 // rootless: now the sandbox needs them
	expect(t, fh.UserNamespaces(), Missing, NeedSandbox, "may not", "sysctl")
	// Upstream kernels have no unprivileged_userns_clone; Ubuntu restricts with AppArmor.
	fh.rm("proc/sys/kernel/unprivileged_userns_clone")
	fh.file("proc/sys/user/max_user_namespaces", "100\n")
	expect(t, fh.UserNamespaces(), OK, NeedSandbox, "max_user_namespaces=100", "")
	fh.file("proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1\n")
	expect(t, fh.UserNamespaces(), Missing, NeedSandbox, "apparmor", "apparmor_restrict_unprivileged_userns=0")
	fh.rm("proc/sys/user/max_user_namespaces")
	expect(t, fh.UserNamespaces(), Missing, NeedSandbox, "CONFIG_USER_NS", "CONFIG_USER_NS=y")
}

func TestCgroups(t *testing.T) {
	fh := newFakeHost(t)
	expect(t, fh.Cgroups(), OK, NeedSandbox, "cgroup v2, controllers: cpu cpuset memory pids; groups under /sys/fs/cgroup/virtx", "")
	reason := "rootless cgroup v2 needs a delegated cgroup …: run under `systemd-run --user --scope -p Delegate=yes virtx serve …`"
	fh.Euid = 1000
	fh.DetectCgroups = func() cgroup.Info {
		return cgroup.Info{Version: 2, Controllers: nil, Writable: false, Reason: reason}
	}
	expect(t, fh.Cgroups(), Missing, NeedSandbox, "not writable by uid 1000", "systemd-run --user --scope -p Delegate=yes")
	fh.DetectCgroups = func() cgroup.Info {
		return cgroup.Info{Version: 2, Controllers: []string{"pids"}, Writable: true, Reason: "the memory cpu controller(s) are not delegated"}
	}
	expect(t, fh.Cgroups(), Missing, NeedSandbox, "controllers: pids", "not delegated")
	fh.DetectCgroups = func() cgroup.Info { return cgroup.Info{Reason: "no cgroup filesystem is mounted: mount -t cgroup2"} }
	expect(t, fh.Cgroups(), Missing, NeedSandbox, "no usable cgroup", "mount -t cgroup2")
}

func TestFilesystems(t *testing.T) {
	fh := newFakeHost(t)
	expect(t, fh.Overlay(), OK, NeedSandbox, "overlay in /proc/filesystems", "")
	expect(t, fh.EROFS(), OK, NeedOptional, "mkfs.erofs at", "")
	fh.file("proc/filesystems", "nodev\tsysfs\n\text4\n")
	fh.file("modules/kernel/fs/overlayfs/overlay.ko.xz", "")
	expect(t, fh.Overlay(), Missing, NeedSandbox, "module that is not loaded", "modprobe overlay")
	expect(t, fh.EROFS(), Missing, NeedOptional, "no module", "CONFIG_EROFS_FS")
	fh.rm("modules/kernel/fs/overlayfs/overlay.ko.xz")
	expect(t, fh.Overlay(), Missing, NeedSandbox, "no module", "CONFIG_OVERLAY_FS")
	// Rootless overlayfs needs 5.11.
	fh.file("proc/filesystems", "nodev\toverlay\n\terofs\n")
	fh.Euid, fh.Kernel = 1000, "5.10.0-28-amd64"
	expect(t, fh.Overlay(), Missing, NeedSandbox, "5.11", "upgrade the kernel")
	fh.Kernel = "5.11.0"
	expect(t, fh.Overlay(), OK, NeedSandbox, "overlay", "")
	delete(fh.paths, "mkfs.erofs")
	expect(t, fh.EROFS(), Missing, NeedOptional, "mkfs.erofs is not on PATH", "apt-get install erofs-utils")
}

func TestPrograms(t *testing.T) {
	fh := newFakeHost(t)
	delete(fh.paths, "pasta")
	expect(t, fh.UserNetwork(), OK, NeedSandbox, "slirp4netns at", "")
	delete(fh.paths, "slirp4netns")
	expect(t, fh.UserNetwork(), Missing, NeedSandbox, "neither", "apt-get install passt")
	delete(fh.paths, "bwrap")
	expect(t, fh.Bwrap(), Missing, NeedOptional, "not on PATH", "apt-get install bubblewrap")
	delete(fh.paths, "qemu-system-x86_64")
	expect(t, fh.QEMU(), Missing, NeedVM, "qemu-system-x86_64", "apt-get install qemu-system-x86")
	fh.GOARCH = "arm64"
	expect(t, fh.QEMU(), Missing, NeedVM, "qemu-system-aarch64", "apt-get install qemu-system-arm")
	delete(fh.paths, "fusermount3")
	expect(t, fh.FUSE(), Missing, NeedOptional, "fusermount3 is not on PATH", "apt-get install fuse3")
	fh.rm("dev/fuse")
	expect(t, fh.FUSE(), Missing, NeedOptional, "is not there", "modprobe fuse")
}

func TestCacheDir(t *testing.T) {
	fh := newFakeHost(t)
	dir := filepath.Join(fh.top, "cache", "virtx")
	expect(t, fh.CacheDir(), OK, NeedSandbox, dir+" (not made yet), 50.0 GiB free", "")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var asked string
	fh.FreeSpace = func(p string) (uint64, error) { asked = p; return 100 << 20, nil }
	expect(t, fh.CacheDir(), Missing, NeedSandbox, dir+", 100 MiB free", "export VIRTX_HOME=")
	if asked != dir {
		t.Errorf("free space asked of %q, want %q", asked, dir)
	}
	fh.Writable = func(p string) bool { return p != dir }
	expect(t, fh.CacheDir(), Missing, NeedSandbox, "not writable", "export VIRTX_HOME=")
	fh.FindCacheDir = func() (string, error) { return "", errors.New("no home directory") }
	expect(t, fh.CacheDir(), Missing, NeedSandbox, "no home directory", "export VIRTX_HOME=")
}

func TestKVM(t *testing.T) {
	fh := newFakeHost(t)
	expect(t, fh.KVM(), OK, NeedVM, "API 12, KVM_CREATE_VM works; CPU flag vmx", "")
	if r := fh.KVM(); !strings.Contains(r.Detail, "only confirmed by a probe boot") {
		t.Errorf("an OK kvm does not say a probe boot confirms it: %q", r.Detail)
	}
	fh.ProbeKVM = func(string) (int, error) { return 0, unix.EACCES }
	expect(t, fh.KVM(), Missing, NeedVM, "permission denied", "usermod -aG kvm")
	fh.ProbeKVM = func(string) (int, error) { return 12, errors.New("ioctl KVM_CREATE_VM: invalid argument") }
	expect(t, fh.KVM(), Missing, NeedVM, "KVM_CREATE_VM", "dmesg")
	fh.rm("dev/kvm")
	expect(t, fh.KVM(), Missing, NeedVM, "is not there", "modprobe kvm_intel")
	fh.file("proc/cpuinfo", "flags\t: fpu svm\n")
	expect(t, fh.KVM(), Missing, NeedVM, "svm", "modprobe kvm_amd")
	fh.file("proc/cpuinfo", "flags\t: fpu sse2\n")
	expect(t, fh.KVM(), Missing, NeedVM, "no vmx/svm", "no hardware virtualisation")
	// A paravirtual KVM (PVM): no flags, yet VMs can be made.
	fh.file("dev/kvm", "")
	fh.file("sys/module/kvm_pvm/initstate", "live\n")
	fh.ProbeKVM = func(string) (int, error) { return 12, nil }
	expect(t, fh.KVM(), OK, NeedVM, "no vmx/svm CPU flag, kvm_pvm loaded; acceleration is only confirmed by a probe boot", "")
}

func TestWriteShowsFixesAndVerdicts(t *testing.T) {
	rs := []Result{
		{Name: "cgroups", Status: Missing, Need: NeedSandbox, Detail: "not writable", Fix: "run as root"},
		{Name: "kvm", Status: Missing, Need: NeedVM, Detail: "no /dev/kvm", Fix: "modprobe kvm_intel"},
		{Name: "bwrap", Status: OK, Need: NeedOptional, Detail: "/usr/bin/bwrap"},
	}
	var b bytes.Buffer
	Write(&b, rs)
	want := "MISSING  cgroups            not writable\n" +
		"                            fix (needed by the sandbox backend): run as root\n" +
		"MISSING  kvm                no /dev/kvm\n" +
		"                            fix (needed by the vm backend): modprobe kvm_intel\n" +
		"OK       bwrap              /usr/bin/bwrap\n\n" +
		"sandbox backend: cannot run here until this is fixed: cgroups\n" +
		"vm backend: missing kvm (auto uses the sandbox)\n"
	if b.String() != want {
		t.Errorf("Write =\n%s\nwant\n%s", b.String(), want)
	}
	if m := MissingFor(rs, NeedSandbox); len(m) != 1 || m[0].Name != "cgroups" {
		t.Errorf("MissingFor(sandbox) = %v", m)
	}
}

func TestReady(t *testing.T) {
	fh := newFakeHost(t)
	if err := fh.Ready(NeedSandbox); err != nil {
		t.Errorf("Ready(sandbox) on a good host: %v", err)
	}
	if err := fh.Ready(NeedVM); err != nil {
		t.Errorf("Ready(vm) on a good host: %v", err)
	}
	delete(fh.paths, "bwrap") // optional: no one's readiness
	fh.ProbeKVM = func(string) (int, error) { return 0, unix.ENODEV }
	if err := fh.Ready(NeedSandbox); err != nil {
		t.Errorf("Ready(sandbox) without KVM or bwrap: %v", err)
	}
	if err := fh.Ready(NeedVM); err == nil || !strings.Contains(err.Error(), "kvm:") {
		t.Errorf("Ready(vm) without KVM: %v", err)
	}
	delete(fh.paths, "pasta")
	delete(fh.paths, "slirp4netns")
	fh.Euid = 1000
	fh.DetectCgroups = func() cgroup.Info { return cgroup.Info{Version: 1, Reason: "run virtx as root"} }
	err := fh.Ready(NeedSandbox)
	for _, w := range []string{"cgroups:", "run virtx as root", "pasta/slirp4netns:", "apt-get install passt"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Ready(sandbox) = %v, want it to say %q", err, w)
		}
	}
}

// Package hostcheck finds out what this host offers virtx's boundaries, each check a
// function returning a structured Result: what was found, whether it is enough, what needs
// it, and the exact command that fixes it. `virtx doctor` prints them; `virtx serve
// --backend auto` can call the same checks to choose a backend.
//
// # What each backend needs
//
// The sandbox backend (namespaces + overlayfs + cgroups, what auto picks on a host without
// working hardware virtualisation) needs: the namespaces themselves (checked by starting a
// process in new mount, pid, uts, ipc, net and cgroup namespaces — and a user namespace when
// not root); user namespaces enabled when not root; cgroups it can write with the memory,
// pids and cpu controllers (sessions get limits by default, and a limit that cannot be
// enforced refuses the session); overlayfs; pasta or slirp4netns for network:true (the
// protocol's default); a cache directory with room. The vm backend needs KVM and QEMU.
// FUSE, erofs and bwrap serve optional features (virtual trees, image forms, benchmarks).
//
// KVM is checked as far as it can be without booting anything: /dev/kvm, the CPU's vmx/svm
// flags, and whether KVM_CREATE_VM succeeds. A paravirtual KVM (such as PVM, on cloud VMs
// without nested virtualisation) can create VMs with neither flag, and a flag does not
// promise a guest boots fast: real acceleration is only confirmed by a probe boot, which is
// the vm backend's to do.
//
// Checks read files (/proc, /dev, /lib/modules) and run probes through a Host, so tests run
// them against fake trees; Local is this machine.
package hostcheck

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"virtx.dev/virtx/internal/linux/cgroup"
)

// Status is a check's verdict.
type Status string

const (
	OK      Status = "OK"
	Missing Status = "MISSING"
)

// Need says what needs the thing a check looks for.
type Need string

const (
	// NeedSandbox: the sandbox backend, the default wherever hardware virtualisation does
	// not work, cannot run (or cannot give its default session) without it.
	NeedSandbox Need = "sandbox"
	// NeedVM: the vm backend needs it.
	NeedVM Need = "vm"
	// NeedOptional: a feature or tool that neither default needs.
	NeedOptional Need = "optional"
)

// Result is one check's answer.
type Result struct {
	Name   string `json:"name"`   // what was checked: "namespaces", "cgroups", "kvm"…
	Status Status `json:"status"` // OK or MISSING
	Need   Need   `json:"need"`   // what needs it
	Detail string `json:"detail"` // what was found
	Fix    string `json:"fix,omitempty"`
}

// Host is where the checks look. Local fills it for this machine; tests point it at fake
// trees and fake probes.
type Host struct {
	Proc    string // procfs: /proc
	Dev     string // /dev
	Sys     string // sysfs: /sys
	Modules string // kernel modules: /lib/modules/RELEASE
	Euid    int
	Kernel  string // the kernel release, "6.1.0-18-amd64"
	GOARCH  string

	LookPath      func(file string) (string, error) // a program on PATH
	DetectCgroups func() cgroup.Info
	FindCacheDir  func() (string, error) // virtx's cache directory ($VIRTX_HOME…)
	Writable      func(path string) bool // this process may create files in path
	// FreeSpace is the room left for an unprivileged writer in the filesystem holding path.
	FreeSpace func(path string) (uint64, error)
	// ProbeNamespaces starts a process in new mount, pid, uts, ipc, net and cgroup
	// namespaces (and a user namespace when user is set) and waits for it.
	ProbeNamespaces func(user bool) error
	// ProbeKVM opens the KVM device, asks its API version and creates (and drops) a VM.
	ProbeKVM func(dev string) (api int, err error)
}

// MinFree is the free space under the cache directory below which it is reported MISSING.
const MinFree = 1 << 30

// All runs every check, in the order doctor prints them.
func (h *Host) All() []Result {
	return []Result{
		h.Namespaces(), h.UserNamespaces(), h.Cgroups(), h.Overlay(), h.UserNetwork(),
		h.CacheDir(), h.FUSE(), h.EROFS(), h.Bwrap(), h.KVM(), h.QEMU(),
	}
}

// Run runs every check on this machine.
func Run() []Result { return Local().All() }

// MissingFor lists the results that need is missing.
func MissingFor(rs []Result, need Need) []Result {
	var out []Result
	for _, r := range rs {
		if r.Status == Missing && r.Need == need {
			out = append(out, r)
		}
	}
	return out
}

// Ready runs the checks that need depends on (NeedSandbox: namespaces, user namespaces,
// cgroups, overlayfs, pasta/slirp4netns, cache dir; NeedVM: kvm, qemu) and returns nil, or
// an error naming each missing thing with its fix. It starts a probe process (and, for
// NeedVM, opens /dev/kvm), so it costs a few milliseconds: call it once per server.
func (h *Host) Ready(need Need) error {
	var rs []Result
	switch need {
	case NeedSandbox:
		rs = []Result{h.Namespaces(), h.UserNamespaces(), h.Cgroups(), h.Overlay(), h.UserNetwork(), h.CacheDir()}
	case NeedVM:
		rs = []Result{h.KVM(), h.QEMU()}
	default:
		rs = h.All()
	}
	var errs []error
	for _, r := range MissingFor(rs, need) {
		errs = append(errs, fmt.Errorf("%s: %s (fix: %s)", r.Name, r.Detail, r.Fix))
	}
	return errors.Join(errs...)
}

func result(name string, need Need, ok bool, detail, fix string) Result {
	r := Result{Name: name, Need: need, Status: OK, Detail: detail}
	if !ok {
		r.Status, r.Fix = Missing, fix
	}
	return r
}

// Namespaces checks that a process can be started in the namespaces a sandbox is made of.
func (h *Host) Namespaces() Result {
	kinds := "mount, pid, uts, ipc, net and cgroup"
	if h.Euid != 0 {
		kinds = "user, " + kinds
	}
	err := h.ProbeNamespaces(h.Euid != 0)
	if err == nil {
		return result("namespaces", NeedSandbox, true, "a probe process started in new "+kinds+" namespaces", "")
	}
	fix := "a kernel built with CONFIG_NAMESPACES, CONFIG_PID_NS, CONFIG_NET_NS, CONFIG_UTS_NS, CONFIG_IPC_NS and CONFIG_CGROUPS (any distribution kernel)"
	switch {
	case h.Euid != 0 && errors.Is(err, fs.ErrPermission):
		fix = "enable unprivileged user namespaces (see the user namespaces line), or run virtx as root"
	case errors.Is(err, fs.ErrPermission):
		fix = "run virtx outside a container that forbids unshare(2) (seccomp), or give it CAP_SYS_ADMIN"
	}
	return result("namespaces", NeedSandbox, false, fmt.Sprintf("cannot start a process in new %s namespaces: %v", kinds, err), fix)
}

// UserNamespaces checks whether unprivileged users may make user namespaces, which a
// rootless sandbox needs (root does not).
func (h *Host) UserNamespaces() Result {
	need := NeedOptional
	if h.Euid != 0 {
		need = NeedSandbox
	}
	var found, fixes []string
	ok := true
	if v, err := h.readTrim("sys/kernel/unprivileged_userns_clone"); err == nil {
		found = append(found, "kernel.unprivileged_userns_clone="+v)
		if v == "0" {
			ok = false
			fixes = append(fixes, "sysctl -w kernel.unprivileged_userns_clone=1 && echo kernel.unprivileged_userns_clone=1 > /etc/sysctl.d/90-userns.conf")
		}
	}
	if v, err := h.readTrim("sys/user/max_user_namespaces"); err == nil {
		found = append(found, "user.max_user_namespaces="+v)
		if v == "0" {
			ok = false
			fixes = append(fixes, "sysctl -w user.max_user_namespaces=15000 && echo user.max_user_namespaces=15000 > /etc/sysctl.d/90-userns.conf")
		}
	} else {
		ok = false
		found = append(found, "no /proc/sys/user/max_user_namespaces (a kernel without CONFIG_USER_NS)")
		fixes = append(fixes, "a kernel built with CONFIG_USER_NS=y (any Debian kernel)")
	}
	if v, err := h.readTrim("sys/kernel/apparmor_restrict_unprivileged_userns"); err == nil {
		found = append(found, "kernel.apparmor_restrict_unprivileged_userns="+v)
		if v == "1" {
			ok = false
			fixes = append(fixes, "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0 (or an AppArmor profile allowing userns for virtx)")
		}
	}
	detail := "unprivileged users may make user namespaces"
	if !ok {
		detail = "unprivileged users may not make user namespaces"
	}
	if h.Euid == 0 {
		detail += " (running as root: the sandbox does not need them)"
	}
	return result("user namespaces", need, ok, detail+": "+strings.Join(found, ", "), strings.Join(fixes, "; "))
}

// Cgroups checks that sessions' limits can be enforced: a cgroup hierarchy this process may
// write, with the memory, pids and cpu controllers.
func (h *Host) Cgroups() Result {
	info := h.DetectCgroups()
	detail := fmt.Sprintf("cgroup v%d, controllers: %s", info.Version, strings.Join(info.Controllers, " "))
	switch {
	case info.Version == 0:
		detail = "no usable cgroup filesystem"
	case info.Writable:
		detail += "; groups under " + info.Root
	default:
		detail += "; not writable by uid " + strconv.Itoa(h.Euid)
	}
	return result("cgroups", NeedSandbox, info.Writable && info.Reason == "", detail, info.Reason)
}

// Overlay checks for overlayfs, the sandbox's root filesystem.
func (h *Host) Overlay() Result {
	r := h.filesystem("overlayfs", "overlay", "fs/overlayfs", "CONFIG_OVERLAY_FS", NeedSandbox)
	if r.Status == OK && h.Euid != 0 && !h.kernelAtLeast(5, 11) {
		r.Status = Missing
		r.Detail = "overlayfs is there, but mounting it in a user namespace needs Linux 5.11+ (this is " + h.Kernel + ")"
		r.Fix = "upgrade the kernel (Debian 12's 6.1 has it), or run virtx as root"
	}
	return r
}

// EROFS checks for the erofs filesystem and its tools (read-only image forms).
func (h *Host) EROFS() Result {
	r := h.filesystem("erofs", "erofs", "fs/erofs", "CONFIG_EROFS_FS", NeedOptional)
	if r.Status == OK {
		if p, err := h.LookPath("mkfs.erofs"); err == nil {
			r.Detail += "; mkfs.erofs at " + p
		} else {
			r.Status, r.Detail, r.Fix = Missing, r.Detail+"; mkfs.erofs is not on PATH", "apt-get install erofs-utils"
		}
	}
	return r
}

// filesystem checks /proc/filesystems for fs, else whether a module would provide it.
func (h *Host) filesystem(name, fsName, modDir, config string, need Need) Result {
	b, err := os.ReadFile(filepath.Join(h.Proc, "filesystems"))
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && f[len(f)-1] == fsName {
				return result(name, need, true, fsName+" in /proc/filesystems", "")
			}
		}
	}
	if m, _ := filepath.Glob(filepath.Join(h.Modules, "kernel", modDir, "*.ko*")); len(m) > 0 {
		return result(name, need, false, fsName+" is a module that is not loaded", "modprobe "+fsName+
			" && echo "+fsName+" > /etc/modules-load.d/"+fsName+".conf")
	}
	return result(name, need, false, fsName+" is not in /proc/filesystems and no module provides it",
		"a kernel built with "+config+" (Debian's linux-image-amd64 has it)")
}

// UserNetwork checks for a user-space network stack for network:true sessions.
func (h *Host) UserNetwork() Result {
	var found []string
	for _, p := range []string{"pasta", "slirp4netns"} {
		if path, err := h.LookPath(p); err == nil {
			found = append(found, p+" at "+path)
		}
	}
	if len(found) > 0 {
		return result("pasta/slirp4netns", NeedSandbox, true, strings.Join(found, ", "), "")
	}
	return result("pasta/slirp4netns", NeedSandbox, false, "neither pasta nor slirp4netns is on PATH (network:true sessions need one)",
		"apt-get install passt   (or: apt-get install slirp4netns)")
}

// CacheDir checks virtx's cache directory: where it is, that it can be made and written, and
// the room left.
func (h *Host) CacheDir() Result {
	dir, err := h.FindCacheDir()
	if err != nil {
		return result("cache dir", NeedSandbox, false, err.Error(), "export VIRTX_HOME=/a/directory/with/room")
	}
	// The directory, or the nearest ancestor it would be made in.
	at := dir
	for {
		if _, err := os.Stat(at); err == nil || at == filepath.Dir(at) {
			break
		}
		at = filepath.Dir(at)
	}
	if !h.Writable(at) {
		return result("cache dir", NeedSandbox, false, fmt.Sprintf("%s: %s is not writable by uid %d", dir, at, h.Euid),
			"export VIRTX_HOME=/a/directory/you/own (or fix the permissions of "+at+")")
	}
	free, err := h.FreeSpace(at)
	if err != nil {
		return result("cache dir", NeedSandbox, false, fmt.Sprintf("%s: %v", dir, err), "export VIRTX_HOME=/a/directory/with/room")
	}
	detail := fmt.Sprintf("%s, %s free", dir, human(free))
	if at != dir {
		detail = fmt.Sprintf("%s (not made yet), %s free", dir, human(free))
	}
	return result("cache dir", NeedSandbox, free >= MinFree, detail,
		fmt.Sprintf("free at least %s there, or export VIRTX_HOME=/a/directory/with/room", human(MinFree)))
}

// FUSE checks for the FUSE device and fusermount3 (virtual directory trees).
func (h *Host) FUSE() Result {
	dev := filepath.Join(h.Dev, "fuse")
	_, devErr := os.Stat(dev)
	fm, fmErr := h.LookPath("fusermount3")
	switch {
	case devErr != nil:
		return result("fuse", NeedOptional, false, dev+" is not there", "modprobe fuse && apt-get install fuse3")
	case fmErr != nil:
		return result("fuse", NeedOptional, false, dev+" is there; fusermount3 is not on PATH", "apt-get install fuse3")
	}
	return result("fuse", NeedOptional, true, dev+", fusermount3 at "+fm, "")
}

// Bwrap checks for bubblewrap (the peer the benchmarks compare with).
func (h *Host) Bwrap() Result {
	if p, err := h.LookPath("bwrap"); err == nil {
		return result("bwrap", NeedOptional, true, p, "")
	}
	return result("bwrap", NeedOptional, false, "bwrap is not on PATH (only the benchmarks use it)", "apt-get install bubblewrap")
}

// QEMU checks for the system emulator the vm backend boots guests with.
func (h *Host) QEMU() Result {
	bin, pkg := "qemu-system-x86_64", "qemu-system-x86"
	if h.GOARCH == "arm64" {
		bin, pkg = "qemu-system-aarch64", "qemu-system-arm"
	}
	if p, err := h.LookPath(bin); err == nil {
		return result("qemu", NeedVM, true, p, "")
	}
	return result("qemu", NeedVM, false, bin+" is not on PATH", "apt-get install "+pkg)
}

// KVM checks what can be known about hardware virtualisation without booting a guest.
func (h *Host) KVM() Result {
	flags := h.cpuFlags()
	var flagNote string
	switch {
	case flags["vmx"]:
		flagNote = "CPU flag vmx (Intel VT-x)"
	case flags["svm"]:
		flagNote = "CPU flag svm (AMD-V)"
	default:
		flagNote = "no vmx/svm CPU flag"
	}
	if _, err := os.Stat(filepath.Join(h.Sys, "module", "kvm_pvm")); err == nil {
		flagNote += ", kvm_pvm loaded"
	}
	dev := filepath.Join(h.Dev, "kvm")
	if _, err := os.Stat(dev); err != nil {
		fix := "no hardware virtualisation here: enable VT-x/AMD-V in the firmware, or nested virtualisation on the VM's host; the sandbox backend works without it"
		if flags["vmx"] {
			fix = "modprobe kvm_intel"
		} else if flags["svm"] {
			fix = "modprobe kvm_amd"
		}
		return result("kvm", NeedVM, false, dev+" is not there; "+flagNote, fix)
	}
	api, err := h.ProbeKVM(dev)
	if err != nil {
		fix := "check dmesg for KVM errors; the sandbox backend works without KVM"
		if errors.Is(err, fs.ErrPermission) {
			fix = "usermod -aG kvm $USER (then log in again), or run virtx as root"
		}
		return result("kvm", NeedVM, false, fmt.Sprintf("%s: %v; %s", dev, err, flagNote), fix)
	}
	return result("kvm", NeedVM, true, fmt.Sprintf("%s: API %d, KVM_CREATE_VM works; %s; acceleration is only confirmed by a probe boot",
		dev, api, flagNote), "")
}

// cpuFlags reads the flags of the first CPU in /proc/cpuinfo.
func (h *Host) cpuFlags() map[string]bool {
	flags := map[string]bool{}
	f, err := os.Open(filepath.Join(h.Proc, "cpuinfo"))
	if err != nil {
		return flags
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "flags" {
			for _, fl := range strings.Fields(v) {
				flags[fl] = true
			}
			break
		}
	}
	return flags
}

func (h *Host) readTrim(rel string) (string, error) {
	b, err := os.ReadFile(filepath.Join(h.Proc, rel))
	return strings.TrimSpace(string(b)), err
}

// kernelAtLeast compares the kernel release with major.minor.
func (h *Host) kernelAtLeast(major, minor int) bool {
	var a, b int
	if _, err := fmt.Sscanf(h.Kernel, "%d.%d", &a, &b); err != nil {
		return true // unknown: do not claim it is too old
	}
	return a > major || (a == major && b >= minor)
}

func human(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}

// Write prints results as doctor does: one line each, OK or MISSING, the fix under a
// MISSING one, and a verdict for each backend.
func Write(w io.Writer, rs []Result) {
	for _, r := range rs {
		fmt.Fprintf(w, "%-8s %-18s %s\n", r.Status, r.Name, r.Detail)
		if r.Status == Missing {
			tag := map[Need]string{NeedSandbox: "needed by the sandbox backend", NeedVM: "needed by the vm backend",
				NeedOptional: "optional"}[r.Need]
			fmt.Fprintf(w, "%-8s %-18s fix (%s): %s\n", "", "", tag, r.Fix)
		}
	}
	fmt.Fprintln(w)
	if m := MissingFor(rs, NeedSandbox); len(m) > 0 {
		fmt.Fprintf(w, "sandbox backend: cannot run here until this is fixed: %s\n", names(m))
	} else {
		fmt.Fprintln(w, "sandbox backend: everything it needs is here")
	}
	if m := MissingFor(rs, NeedVM); len(m) > 0 {
		fmt.Fprintf(w, "vm backend: missing %s (auto uses the sandbox)\n", names(m))
	} else {
		fmt.Fprintln(w, "vm backend: KVM and QEMU are here; a probe boot decides whether auto uses it")
	}
}

func names(rs []Result) string {
	var n []string
	for _, r := range rs {
		n = append(n, r.Name)
	}
	return strings.Join(n, ", ")
}

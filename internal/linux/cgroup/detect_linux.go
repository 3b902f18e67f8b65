package cgroup

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// parentName is the per-host parent every virtx group is made under, in each hierarchy.
const parentName = "virtx"

// leafName is where a delegated v2 cgroup's own processes are moved so that controllers can
// be enabled for its children (the "no internal processes" rule).
const leafName = "virtx-server"

// limitControllers are the controllers Limits use; freezer serves v1 kills.
var (
	limitControllers = []string{"memory", "pids", "cpu", "cpuset"}
	coreControllers  = []string{"memory", "pids", "cpu"} // Reason is "" only when all three work
)

// system is where the package looks: the real machine, or a fake tree in tests.
type system struct {
	mountinfo  string // the mount table: /proc/self/mountinfo
	selfCgroup string // this process's cgroups: /proc/self/cgroup
	proc       string // procfs, for owners and membership: /proc
	euid       int
	self       owner // the owner recorded in new groups' names

	// write writes an interface file (writeFile on a real kernel; a fake tree's also acts
	// as the kernel would: moving pids between cgroup.procs files, refusing with EBUSY…).
	write func(path, data string) error
	// mkdir makes one cgroup directory. On a real kernel it is mkdir(2) and the kernel
	// fills the directory; a fake tree's writes the interface files the kernel would.
	mkdir func(path string) error
	// rmdir removes an empty cgroup (its interface files go with it).
	rmdir func(path string) error
	// sigkill sends SIGKILL to a process, when check (if set) still says it is in the group.
	sigkill func(pid int, check func(pid int) bool) error

	noCgroupKill bool // tests: act as a kernel before 5.14, which has no cgroup.kill
	// noCloneInto: the kernel refused CLONE_INTO_CGROUP once (StartProcess); processes
	// are moved into their v2 group after they start. Tests set it to act as such a kernel.
	noCloneInto atomic.Bool

	layoutOnce sync.Once
	lay        layout // detect's answer, made once: a delegated process moves to a leaf later
	readyMu    sync.Mutex
	ready      map[string]bool // parents set up by this process
}

// layout detects once and remembers: the mounts do not change under a server, and once a
// delegated server has moved itself to its leaf, its own cgroup is no longer the base.
func (s *system) layout() layout {
	s.layoutOnce.Do(func() { s.lay = s.detect() })
	return s.lay
}

// mount is one cgroup filesystem from the mount table.
type mount struct {
	dir      string   // mount point
	root     string   // the cgroup mounted there, as a path in the hierarchy
	v2       bool     // cgroup2
	ro       bool     // mounted read-only
	ctrls    []string // v1: the controllers of the hierarchy (super options)
	selfPath string   // this process's cgroup in the hierarchy (from /proc/self/cgroup)
}

// selfDir is this process's cgroup directory under the mount, or "" when it is not visible
// through it.
func (m mount) selfDir() string {
	if m.selfPath == "" {
		return ""
	}
	rel := m.selfPath
	if m.root != "/" {
		r, ok := strings.CutPrefix(rel, m.root)
		if !ok || (r != "" && r[0] != '/') {
			return ""
		}
		rel = r
	}
	return filepath.Join(m.dir, rel)
}

// layout is what detection decided: where groups go in which hierarchy.
type layout struct {
	info Info
	// v1 maps each usable v1 controller to its hierarchy's mount point (co-mounted
	// controllers share one). Empty unless Version is 1.
	v1 map[string]string
	// v1Root maps each of those mount points to the cgroup mounted there (the mount's root,
	// "/" unless a subtree was mounted), to find a thread's own cgroup directories from
	// /proc/thread-self/cgroup.
	v1Root map[string]string
	// v2 is the directory under which the virtx parent sits in the unified hierarchy ("":
	// none usable). With Version 2 it holds the limits; on a hybrid host (Version 1) it only
	// tracks and kills the group's processes (cgroup.kill, cgroup.events).
	v2 string
	// v2Delegated: v2 is this process's own delegated cgroup, whose processes must move to
	// a leaf before controllers can be enabled below it.
	v2Delegated bool
	// v2Ctrls are the controllers v2 offers (its cgroup.controllers).
	v2Ctrls []string
}

// readMounts parses the mount table for cgroup filesystems and matches each with this
// process's cgroup in it.
func (s *system) readMounts() ([]mount, error) {
	mi, err := os.ReadFile(s.mountinfo)
	if err != nil {
		return nil, fmt.Errorf("cgroup: read mount table: %w", err)
	}
	self, err := os.ReadFile(s.selfCgroup)
	if err != nil {
		return nil, fmt.Errorf("cgroup: read own cgroups: %w", err)
	}
	v1Self, v2Self := parseProcCgroup(self)
	var ms []mount
	sc := bufio.NewScanner(bytes.NewReader(mi))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL…] - FSTYPE SOURCE SUPEROPTIONS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 6 || len(b) < 3 || (b[0] != "cgroup" && b[0] != "cgroup2") {
			continue
		}
		m := mount{dir: unescape(a[4]), root: unescape(a[3]), v2: b[0] == "cgroup2"}
		m.ro = slices.Contains(strings.Split(a[5], ","), "ro") || slices.Contains(strings.Split(b[2], ","), "ro")
		if m.v2 {
			m.selfPath = v2Self
		} else {
			for _, o := range strings.Split(b[2], ",") {
				if o == "rw" || o == "ro" || strings.Contains(o, "=") || !isController(o) {
					continue
				}
				m.ctrls = append(m.ctrls, o)
			}
			if len(m.ctrls) == 0 {
				continue // a named hierarchy (name=systemd): no controllers, nothing to use
			}
			m.selfPath = v1Self[m.ctrls[0]]
		}
		ms = append(ms, m)
	}
	return ms, sc.Err()
}

// parseProcCgroup parses a /proc/PID/cgroup (or /proc/thread-self/cgroup) file: lines
// "ID:CONTROLLERS:PATH", where ID 0 with no controllers is v2. v1 maps each v1 controller
// to the path of the cgroup in its hierarchy.
func parseProcCgroup(b []byte) (v1 map[string]string, v2 string) {
	v1 = map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		if f[0] == "0" && f[1] == "" {
			v2 = f[2]
			continue
		}
		for _, c := range strings.Split(f[1], ",") {
			v1[c] = f[2]
		}
	}
	return v1, v2
}

// isController reports whether a v1 super option is a controller name rather than a flag.
func isController(o string) bool {
	switch o {
	case "noprefix", "clone_children", "xattr", "cpuset_v2_mode", "favordynmods", "nsdelegate",
		"memory_localevents", "memory_recursiveprot", "memory_hugetlb_accounting", "pids_localevents",
		"relatime", "noatime", "nosuid", "nodev", "noexec":
		return false
	}
	return true
}

// unescape undoes the mount table's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// detect decides the layout from the mount table and the permissions it finds.
func (s *system) detect() layout {
	ms, err := s.readMounts()
	if err != nil {
		return layout{info: Info{Reason: err.Error()}}
	}
	var v2 *mount
	v1 := map[string]string{}
	v1root := map[string]string{}
	v1ro := false
	for i := range ms {
		m := &ms[i]
		if m.v2 {
			if v2 == nil || (v2.ro && !m.ro) {
				v2 = m
			}
			continue
		}
		for _, c := range m.ctrls {
			if _, seen := v1[c]; !seen && (slices.Contains(limitControllers, c) || c == "freezer") {
				v1[c] = m.dir
				v1root[m.dir] = m.root
				v1ro = v1ro || m.ro
			}
		}
	}
	limitsInV1 := v1["memory"] != "" || v1["pids"] != "" || v1["cpu"] != ""
	switch {
	case limitsInV1:
		l := s.detectV1(v1, v1ro, v2)
		l.v1Root = v1root
		return l
	case v2 != nil:
		return s.detectV2(v2)
	default:
		return layout{info: Info{Reason: "no cgroup filesystem is mounted: mount one with " +
			"`mount -t cgroup2 none /sys/fs/cgroup` (or boot with systemd, which does)"}}
	}
}

// detectV1 lays out a host whose limit controllers are v1 hierarchies (legacy or hybrid).
func (s *system) detectV1(v1 map[string]string, ro bool, v2 *mount) layout {
	l := layout{v1: v1, info: Info{Version: 1}}
	for c := range v1 {
		l.info.Controllers = append(l.info.Controllers, c)
	}
	slices.Sort(l.info.Controllers)
	mem := v1["memory"]
	if mem == "" {
		mem = v1["pids"]
		if mem == "" {
			mem = v1["cpu"]
		}
	}
	l.info.Root = filepath.Join(mem, parentName)
	switch {
	case s.euid != 0:
		l.info.Reason = fmt.Sprintf("the cgroup limits live in v1 hierarchies (%s), which only root can "+
			"write and which cannot be delegated safely: run virtx as root, or boot the host with "+
			"cgroup v2 (systemd.unified_cgroup_hierarchy=1 on the kernel command line) and run under "+
			"`systemd-run --user --scope -p Delegate=yes virtx serve`", filepath.Dir(mem))
		return l
	case ro:
		l.info.Reason = fmt.Sprintf("the v1 cgroup hierarchies under %s are mounted read-only (a container?): "+
			"give virtx a writable cgroupfs (e.g. docker run --privileged, or mount -o remount,rw on each)",
			filepath.Dir(mem))
		return l
	}
	l.info.Writable = true
	var missing []string
	for _, c := range coreControllers {
		if v1[c] == "" {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		l.info.Reason = fmt.Sprintf("no v1 hierarchy has the %s controller: mount it "+
			"(mkdir -p /sys/fs/cgroup/%s && mount -t cgroup -o %s cgroup /sys/fs/cgroup/%s), or check "+
			"the kernel command line for cgroup_disable=", strings.Join(missing, ", "), missing[0], missing[0], missing[0])
	}
	// Hybrid: the unified hierarchy beside them tracks and kills (cgroup.kill, populated).
	if v2 != nil && !v2.ro && s.euid == 0 {
		l.v2 = v2.dir
	}
	return l
}

// detectV2 lays out a host whose limits live in the unified hierarchy: under its root as
// root, else under this process's own cgroup when that is delegated to it.
func (s *system) detectV2(m *mount) layout {
	l := layout{info: Info{Version: 2}}
	if m.ro {
		l.info.Reason = fmt.Sprintf("%s is mounted read-only (a container?): give the container a "+
			"writable cgroup (docker run --cgroupns=private --privileged, or podman's default), "+
			"or run virtx on the host", m.dir)
		return l
	}
	base := m.dir
	if s.euid != 0 {
		base = m.selfDir()
		l.v2Delegated = true
	}
	if base != "" {
		l.info.Root = filepath.Join(base, parentName)
	}
	switch {
	case base == "":
		l.info.Reason = fmt.Sprintf("this process's cgroup is not visible under %s: run virtx in the "+
			"host's cgroup namespace, or under `systemd-run --user --scope -p Delegate=yes virtx serve`", m.dir)
		return l
	case l.v2Delegated && !s.writable(base):
		l.info.Reason = fmt.Sprintf("rootless cgroup v2 needs a delegated cgroup, and %s is not delegated "+
			"to uid %d: run under `systemd-run --user --scope -p Delegate=yes virtx serve …` "+
			"(or run virtx as root)", base, s.euid)
		return l
	}
	l.v2 = base
	l.info.Writable = true
	ctrls, _ := os.ReadFile(filepath.Join(base, "cgroup.controllers"))
	l.v2Ctrls = strings.Fields(string(ctrls))
	for _, c := range l.v2Ctrls {
		if slices.Contains(limitControllers, c) {
			l.info.Controllers = append(l.info.Controllers, c)
		}
	}
	slices.Sort(l.info.Controllers)
	var missing []string
	for _, c := range coreControllers {
		if !slices.Contains(l.v2Ctrls, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		list := strings.Join(missing, " ")
		if l.v2Delegated {
			l.info.Reason = fmt.Sprintf("the %s controller(s) are not delegated to %s: delegate them to "+
				"user sessions (mkdir -p /etc/systemd/system/user@.service.d && printf '[Service]\\nDelegate=cpu "+
				"cpuset io memory pids\\n' > /etc/systemd/system/user@.service.d/delegate.conf && "+
				"systemctl daemon-reload), then log in again", list, base)
		} else {
			l.info.Reason = fmt.Sprintf("cgroup v2 at %s does not offer the %s controller(s): they are "+
				"disabled on the kernel command line (cgroup_disable=) or bound to a v1 hierarchy; "+
				"boot with systemd.unified_cgroup_hierarchy=1 and without cgroup_disable", base, list)
		}
	}
	return l
}

// writable reports whether this process may make and fill cgroups under dir: root, or the
// owner of the directory and of the files a delegation hands over.
func (s *system) writable(dir string) bool {
	for _, p := range []string{dir, filepath.Join(dir, "cgroup.procs"), filepath.Join(dir, "cgroup.subtree_control")} {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return false
		}
		if s.euid == 0 {
			continue
		}
		if !(int(st.Uid) == s.euid && st.Mode&0o200 != 0) && st.Mode&0o002 == 0 {
			return false
		}
	}
	return true
}

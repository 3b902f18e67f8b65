package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeMounts makes a system that reads the given mount table and /proc/self/cgroup (mount
// points are made under a temporary directory, substituted for "$T").
func fakeMounts(t *testing.T, euid int, mountinfo, self string) (*system, string) {
	t.Helper()
	top := t.TempDir()
	mountinfo = strings.ReplaceAll(mountinfo, "$T", top)
	for _, line := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			must(t, os.MkdirAll(unescape(f[4]), 0o755))
		}
	}
	must(t, os.WriteFile(filepath.Join(top, "mountinfo"), []byte(mountinfo), 0o644))
	must(t, os.WriteFile(filepath.Join(top, "self-cgroup"), []byte(self), 0o644))
	return &system{mountinfo: filepath.Join(top, "mountinfo"), selfCgroup: filepath.Join(top, "self-cgroup"),
		proc: "/proc", euid: euid, write: writeFile, mkdir: realMkdir, rmdir: realRmdir, sigkill: realSigkill}, top
}

// hybridMounts is this kind of host: v1 controller hierarchies plus an empty unified one.
const hybridMounts = `31 23 0:28 / $T/cg rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / $T/cg/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / $T/cg/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / $T/cg/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / $T/cg/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / $T/cg/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / $T/cg/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / $T/cg/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
`

const hybridSelf = "9:name=systemd:/user.slice\n8:pids:/\n4:memory:/user.slice\n3:cpuset:/\n1:cpu,cpuacct:/\n0::/user.slice\n"

func TestDetectHybridAsRoot(t *testing.T) {
	s, top := fakeMounts(t, 0, hybridMounts, hybridSelf)
	l := s.layout()
	want := Info{Version: 1, Controllers: []string{"cpu", "cpuset", "freezer", "memory", "pids"}, Writable: true,
		Root: top + "/cg/memory/virtx"}
	if fmt.Sprint(l.info) != fmt.Sprint(want) {
		t.Errorf("Detect = %+v\nwant     %+v", l.info, want)
	}
	if l.v1["cpu"] != top+"/cg/cpu,cpuacct" || l.v1["pids"] != top+"/cg/pids" {
		t.Errorf("v1 hierarchies = %v", l.v1)
	}
	if l.v2 != top+"/cg/unified" {
		t.Errorf("unified tracking hierarchy = %q, want %s/cg/unified", l.v2, top)
	}
}

func TestDetectV1Rootless(t *testing.T) {
	s, _ := fakeMounts(t, 1000, hybridMounts, hybridSelf)
	info := s.layout().info
	if info.Version != 1 || info.Writable {
		t.Fatalf("Detect = %+v, want v1, not writable", info)
	}
	for _, w := range []string{"v1", "run virtx as root", "systemd.unified_cgroup_hierarchy=1", "Delegate=yes"} {
		if !strings.Contains(info.Reason, w) {
			t.Errorf("Reason %q does not say %q", info.Reason, w)
		}
	}
	if _, err := s.create("x", Limits{Pids: 10}); !errors.Is(err, ErrCannotEnforce) {
		t.Errorf("Create = %v, want ErrCannotEnforce", err)
	}
	if n, err := s.reapStale(); n != 0 || err != nil {
		t.Errorf("reapStale = %d, %v; want nothing to do", n, err)
	}
}

func TestDetectV1MissingController(t *testing.T) {
	mounts := strings.ReplaceAll(hybridMounts, "39 31 0:36 / $T/cg/pids rw,relatime - cgroup cgroup rw,pids\n", "")
	s, _ := fakeMounts(t, 0, mounts, hybridSelf)
	info := s.layout().info
	if !info.Writable || info.Has("pids") || !strings.Contains(info.Reason, "pids") {
		t.Errorf("Detect = %+v, want writable, no pids, a reason naming pids", info)
	}
	if _, err := s.create("x", Limits{Pids: 10}); !errors.Is(err, ErrCannotEnforce) || !strings.Contains(err.Error(), "mount -t cgroup -o pids") {
		t.Errorf("Create = %v, want ErrCannotEnforce naming the mount", err)
	}
}

func TestDetectNothingMounted(t *testing.T) {
	s, _ := fakeMounts(t, 0, "22 1 0:21 / $T/proc rw - proc proc rw\n", "0::/\n")
	info := s.layout().info
	if info.Version != 0 || info.Writable || !strings.Contains(info.Reason, "mount -t cgroup2") {
		t.Errorf("Detect = %+v, want version 0 naming the mount", info)
	}
	if _, err := s.create("x", Limits{}); !errors.Is(err, ErrCannotEnforce) {
		t.Errorf("Create = %v, want ErrCannotEnforce", err)
	}
}

func TestDetectV2CgroupNamespaceRoot(t *testing.T) {
	// A mount whose root is not "/" (a bind of a sub-tree): this process's cgroup is found
	// relative to it, and a cgroup outside it is not visible.
	mi := "41 31 0:38 /user.slice/u $T/cg rw - cgroup2 cgroup2 rw\n"
	s, top := fakeMounts(t, 1000, mi, "0::/user.slice/u/app.scope\n")
	if got := s.layout().info.Root; got != top+"/cg/app.scope/virtx" {
		t.Errorf("Root = %q, want %s/cg/app.scope/virtx", got, top)
	}
	s, _ = fakeMounts(t, 1000, mi, "0::/elsewhere\n")
	if info := s.layout().info; info.Writable || !strings.Contains(info.Reason, "not visible") {
		t.Errorf("Detect = %+v, want not writable: own cgroup not visible", info)
	}
}

func TestMountinfoEscapes(t *testing.T) {
	if got := unescape(`/a\040b\011c\134d`); got != "/a b\tc\\d" {
		t.Errorf("unescape = %q", got)
	}
	if got := unescape(`/trailing\04`); got != `/trailing\04` {
		t.Errorf("unescape of a short escape = %q", got)
	}
	s, top := fakeMounts(t, 0, `41 31 0:38 / $T/with\040space rw - cgroup2 cgroup2 rw`+"\n", "0::/\n")
	if got := s.layout().info.Root; got != top+"/with space/virtx" {
		t.Errorf("Root = %q", got)
	}
}

func TestGroupDirNames(t *testing.T) {
	o := owner{pid: 1234, start: 98765}
	d := groupDir("sess.1-a_b", o)
	if d != "sess.1-a_b@1234-98765" {
		t.Errorf("groupDir = %q", d)
	}
	name, got, ok := parseGroupDir(d)
	if !ok || name != "sess.1-a_b" || got != o {
		t.Errorf("parseGroupDir(%q) = %q, %+v, %v", d, name, got, ok)
	}
	for _, bad := range []string{"virtx-server", "@1-2", "x@1", "x@a-2", "x@1-b", "x@0-5", ".x@1-2", "a b@1-2"} {
		if _, _, ok := parseGroupDir(bad); ok {
			t.Errorf("parseGroupDir(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"", ".hidden", "a/b", "a@b", strings.Repeat("x", 65), "cgroup procs"} {
		if validName(bad) == nil {
			t.Errorf("validName(%q) accepted", bad)
		}
	}
}

func TestLimitsArithmetic(t *testing.T) {
	for cpus, want := range map[float64]int64{1: 100000, 1.5: 150000, 0.001: 1000, 0.3333: 33330, 2: 200000} {
		if got := (Limits{CPUs: cpus}).cpuQuota(); got != want {
			t.Errorf("quota(%v) = %d, want %d", cpus, got, want)
		}
	}
	for _, bad := range []Limits{{MemoryBytes: -1}, {CPUs: -1}, {Pids: -2}, {CPUSet: "0-1;rm"}} {
		if bad.validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

func TestKeyedFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "memory.events")
	must(t, os.WriteFile(p, []byte("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n"), 0o644))
	if n, err := keyed(p, "oom_kill"); n != 2 || err != nil {
		t.Errorf("oom_kill = %d, %v", n, err)
	}
	if _, err := keyed(p, "nope"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("missing key: %v, want ENOENT", err)
	}
	if _, err := keyed(p+".absent", "oom"); !errors.Is(err, unix.ENOENT) {
		t.Errorf("missing file: %v, want ENOENT", err)
	}
}

package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeKernel is a cgroup v2 filesystem in a temporary directory that answers the package's
// writes the way the kernel does, closely enough to check what the driver asks of it: mkdir
// fills a group with the interface files its parent's enabled controllers give it;
// cgroup.procs moves a pid from wherever it was; cgroup.subtree_control takes "+c -c",
// refuses a controller the group is not offered (ENOENT) and refuses with EBUSY while the
// group holds processes (no internal processes); cgroup.kill empties the subtree;
// cgroup.freeze and the populated bit show in cgroup.events. Every other file is written as
// given, so tests read back exactly what the driver wrote.
type fakeKernel struct {
	t     *testing.T
	top   string // the temporary directory
	mnt   string // the fake cgroup2 mount point
	euid  int    // the uid groups made through the system are owned by (delegation)
	noKil bool   // no cgroup.kill in new groups (a kernel before 5.14)

	mu     sync.Mutex
	killed []int // pids the fake sigkill was asked to kill
}

// fakeAll is what a real root cgroup offers in cgroup.controllers.
const fakeAll = "cpuset cpu io memory hugetlb pids rdma misc"

// newFakeV2 makes a fake unified hierarchy mounted alone (a v2-only host), the process's own
// cgroup being selfPath, and the system that looks at it.
func newFakeV2(t *testing.T, euid int, selfPath string, ro bool) (*system, *fakeKernel) {
	t.Helper()
	top := t.TempDir()
	fk := &fakeKernel{t: t, top: top, mnt: filepath.Join(top, "cgroup"), euid: euid}
	must(t, os.Mkdir(fk.mnt, 0o755))
	fk.put("", "cgroup.controllers", fakeAll)
	fk.put("", "cgroup.subtree_control", "")
	fk.put("", "cgroup.procs", "1\n")
	opts := "rw,nosuid,nodev,noexec,relatime"
	if ro {
		opts = "ro,nosuid,nodev,noexec,relatime"
	}
	mountinfo := "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n" +
		fmt.Sprintf("30 23 0:26 / %s %s shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n", fk.mnt, opts)
	must(t, os.WriteFile(filepath.Join(top, "mountinfo"), []byte(mountinfo), 0o644))
	must(t, os.WriteFile(filepath.Join(top, "self-cgroup"), []byte("0::"+selfPath+"\n"), 0o644))
	return fk.system(), fk
}

// system is a system looking at the fake tree, owned by this test process.
func (fk *fakeKernel) system() *system {
	s := &system{
		mountinfo:  filepath.Join(fk.top, "mountinfo"),
		selfCgroup: filepath.Join(fk.top, "self-cgroup"),
		proc:       "/proc",
		euid:       fk.euid,
		write:      fk.write,
		mkdir:      func(p string) error { return fk.mkdirAs(p, fk.euid) },
		rmdir:      fk.rmdir,
		sigkill:    fk.sigkill,
	}
	s.self.pid = os.Getpid()
	st, err := startTime("/proc", s.self.pid)
	must(fk.t, err)
	s.self.start = st
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// path is the fake's path of group rel ("" the root).
func (fk *fakeKernel) path(rel string) string { return filepath.Join(fk.mnt, rel) }

// put writes a file of group rel directly (the test playing the kernel or another process).
func (fk *fakeKernel) put(rel, file, content string) {
	fk.t.Helper()
	must(fk.t, os.WriteFile(filepath.Join(fk.path(rel), file), []byte(content), 0o644))
}

// get reads a file of group rel.
func (fk *fakeKernel) get(rel, file string) string {
	fk.t.Helper()
	b, err := os.ReadFile(filepath.Join(fk.path(rel), file))
	must(fk.t, err)
	return string(b)
}

// cg makes group rel owned by uid, offering ctrls and holding procs, directly.
func (fk *fakeKernel) cg(rel string, uid int, ctrls, procs string) {
	fk.t.Helper()
	must(fk.t, fk.mkdirAs(fk.path(rel), uid))
	fk.put(rel, "cgroup.controllers", ctrls)
	fk.put(rel, "cgroup.procs", procs)
	fk.populate()
}

// mkdirAs makes a group as the kernel does: owned by its maker, with the core interface
// files and those of the controllers its parent enabled for it.
func (fk *fakeKernel) mkdirAs(dir string, uid int) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return fmt.Errorf("cgroup: mkdir %s: %w", dir, pe.Err)
		}
		return err
	}
	ctrls := strings.Fields(readOr(filepath.Join(filepath.Dir(dir), "cgroup.subtree_control")))
	files := map[string]string{
		"cgroup.procs": "", "cgroup.subtree_control": "", "cgroup.type": "domain\n",
		"cgroup.controllers": strings.Join(ctrls, " ") + "\n",
		"cgroup.events":      "populated 0\nfrozen 0\n", "cgroup.freeze": "0\n",
	}
	if !fk.noKil {
		files["cgroup.kill"] = ""
	}
	for _, c := range ctrls {
		switch c {
		case "memory":
			files["memory.max"], files["memory.swap.max"] = "max\n", "max\n"
			files["memory.events"] = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n"
		case "cpu":
			files["cpu.max"] = "max 100000\n"
		case "pids":
			files["pids.max"] = "max\n"
		case "cpuset":
			files["cpuset.cpus"], files["cpuset.mems"] = "\n", "\n"
		}
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			return err
		}
	}
	return os.Lchown(dir, uid, uid)
}

// rmdir removes a group as the kernel does: EBUSY with processes or child groups in it, and
// its interface files go with it.
func (fk *fakeKernel) rmdir(dir string) error {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	ents, err := os.ReadDir(dir)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return fmt.Errorf("cgroup: rmdir %s: %w", dir, pe.Err)
		}
		return err
	}
	if strings.TrimSpace(readOr(filepath.Join(dir, "cgroup.procs"))) != "" {
		return fmt.Errorf("cgroup: rmdir %s: %w", dir, unix.EBUSY)
	}
	for _, e := range ents {
		if e.IsDir() {
			return fmt.Errorf("cgroup: rmdir %s: %w", dir, unix.EBUSY)
		}
	}
	for _, e := range ents {
		must(fk.t, os.Remove(filepath.Join(dir, e.Name())))
	}
	return os.Remove(dir)
}

func readOr(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// write is the fake kernel's answer to writing data into the interface file path.
func (fk *fakeKernel) write(path, data string) error {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	fail := func(errno unix.Errno) error { return fmt.Errorf("cgroup: write %q to %s: %w", data, path, errno) }
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("cgroup: open %s: %w", path, unix.ENOENT)
	}
	dir := filepath.Dir(path)
	switch filepath.Base(path) {
	case "cgroup.procs":
		pid, err := strconv.Atoi(strings.TrimSpace(data))
		if err != nil {
			return fail(unix.EINVAL)
		}
		if dir != fk.mnt && strings.TrimSpace(readOr(filepath.Join(dir, "cgroup.subtree_control"))) != "" {
			return fail(unix.EBUSY) // a group that gives controllers to children holds no processes
		}
		fk.removePid(pid)
		must(fk.t, os.WriteFile(path, []byte(readOr(path)+strconv.Itoa(pid)+"\n"), 0o644))
		fk.populate()
	case "cgroup.subtree_control":
		offered := strings.Fields(readOr(filepath.Join(dir, "cgroup.controllers")))
		on := strings.Fields(readOr(path))
		for _, tok := range strings.Fields(data) {
			c := tok[1:]
			if !slices.Contains(offered, c) {
				return fail(unix.ENOENT)
			}
			switch tok[0] {
			case '+':
				if dir != fk.mnt && strings.TrimSpace(readOr(filepath.Join(dir, "cgroup.procs"))) != "" {
					return fail(unix.EBUSY)
				}
				if !slices.Contains(on, c) {
					on = append(on, c)
				}
			case '-':
				on = slices.DeleteFunc(on, func(x string) bool { return x == c })
			default:
				return fail(unix.EINVAL)
			}
		}
		// The kernel lists them in its own order, as cgroup.controllers does.
		var out []string
		for _, c := range strings.Fields(fakeAll) {
			if slices.Contains(on, c) {
				out = append(out, c)
			}
		}
		must(fk.t, os.WriteFile(path, []byte(strings.Join(out, " ")+"\n"), 0o644))
	case "cgroup.kill":
		if strings.TrimSpace(data) != "1" {
			return fail(unix.EINVAL)
		}
		must(fk.t, os.WriteFile(path, []byte(data), 0o644)) // kept, so a test can see it was written
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Name() == "cgroup.procs" {
				for _, f := range strings.Fields(readOr(p)) {
					pid, _ := strconv.Atoi(f)
					fk.killed = append(fk.killed, pid)
				}
				os.WriteFile(p, nil, 0o644)
			}
			return nil
		})
		fk.populate()
	case "cgroup.freeze":
		must(fk.t, os.WriteFile(path, []byte(data), 0o644))
		ev := filepath.Join(dir, "cgroup.events")
		pop := strings.Split(readOr(ev), "\n")[0]
		must(fk.t, os.WriteFile(ev, []byte(pop+"\nfrozen "+strings.TrimSpace(data)+"\n"), 0o644))
	default:
		must(fk.t, os.WriteFile(path, []byte(data), 0o644))
	}
	return nil
}

// removePid takes pid out of every cgroup.procs in the tree.
func (fk *fakeKernel) removePid(pid int) {
	filepath.WalkDir(fk.mnt, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Name() != "cgroup.procs" {
			return nil
		}
		var keep []string
		for _, f := range strings.Fields(readOr(p)) {
			if f != strconv.Itoa(pid) {
				keep = append(keep, f+"\n")
			}
		}
		os.WriteFile(p, []byte(strings.Join(keep, "")), 0o644)
		return nil
	})
}

// populate recomputes every group's "populated" in cgroup.events.
func (fk *fakeKernel) populate() {
	filepath.WalkDir(fk.mnt, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		ev := filepath.Join(p, "cgroup.events")
		if _, err := os.Stat(ev); err != nil {
			return nil
		}
		pids, _ := readProcs(p)
		n := 0
		if len(pids) > 0 {
			n = 1
		}
		lines := strings.Split(readOr(ev), "\n")
		lines[0] = "populated " + strconv.Itoa(n)
		os.WriteFile(ev, []byte(strings.Join(lines, "\n")), 0o644)
		return nil
	})
}

// sigkill records the kill and takes the pid out of the tree (a fake pid is no process).
func (fk *fakeKernel) sigkill(pid int, _ func(int) bool) error {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	fk.killed = append(fk.killed, pid)
	fk.removePid(pid)
	fk.populate()
	return nil
}

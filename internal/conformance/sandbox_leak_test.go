package conformance

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// hostCounts is what a leak would add to: this host's processes, its mount table (the
// test's own mount namespace: the host's), temp dirs, and the cache directory's entries.
type hostCounts struct {
	procs, tmp, cache int
	mounts            map[string]bool // mountinfo lines
}

func countHost(t testing.TB, cache string) hostCounts {
	t.Helper()
	var c hostCounts
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			c.procs++
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	c.mounts = map[string]bool{}
	for _, l := range strings.Split(string(mi), "\n") {
		c.mounts[l] = true
	}
	tmp, _ := os.ReadDir(os.TempDir())
	c.tmp = len(tmp)
	filepath.WalkDir(cache, func(string, os.DirEntry, error) error { c.cache++; return nil })
	return c
}

// settle waits for the counts to come back to base (a killed process is reaped, and a
// namespace torn down, shortly after the kill), or fails naming what did not.
func settle(t testing.TB, cache string, base hostCounts, what string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		now := countHost(t, cache)
		// Other processes come and go on a shared host: processes are checked by marker
		// (countMarked), and of new mounts only those a sandbox makes count.
		leaked := sandboxMounts(base.mounts, now.mounts)
		if len(leaked) == 0 && now.tmp <= base.tmp && now.cache == base.cache {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: left behind: mounts %q, temp dirs %d → %d, cache entries %d → %d",
				what, leaked, base.tmp, now.tmp, base.cache, now.cache)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sandboxMounts are the mountinfo lines in now and not in base that a sandbox could have
// left: its filesystem types, or anything below /tmp (where init builds the root) or
// naming virtx.
func sandboxMounts(base, now map[string]bool) []string {
	var out []string
	for l := range now {
		if base[l] || l == "" {
			continue
		}
		f := strings.Fields(l)
		fstype := ""
		for i, x := range f {
			if x == "-" && i+1 < len(f) {
				fstype = f[i+1]
			}
		}
		point := ""
		if len(f) > 4 {
			point = f[4]
		}
		switch {
		case fstype == "overlay", fstype == "proc", fstype == "sysfs", fstype == "devpts",
			point == "/tmp", strings.HasPrefix(point, "/tmp/"), strings.Contains(l, "virtx"):
			out = append(out, l)
		}
	}
	return out
}

// countMarked counts this host's processes whose command line holds marker.
func countMarked(marker string) int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if bytes.Contains(b, []byte(marker)) {
			n++
		}
	}
	return n
}

// sandboxEnv gives the servers of a test a cache dir and a temp dir of their own, so what
// they leave is counted apart from the rest of the host.
func sandboxEnv(t *testing.T) string {
	cache := t.TempDir()
	t.Setenv("VIRTX_HOME", cache)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	return cache
}

// TestSandboxKilledServerLeaksNothing: SIGKILL of `virtx serve --backend sandbox` during an
// exec, with a tree mounted and daemonised processes inside, leaves no process, mount,
// temp dir or cache entry behind.
func TestSandboxKilledServerLeaksNothing(t *testing.T) {
	requireSandbox(t)
	cache := sandboxEnv(t)
	// The host image is built once and kept (it is the cache's, not a session's).
	warm := startPeer(t, "sandbox")
	warm.exec("true")
	warm.notify(protocol.MethodQuit)
	warm.expectEOF()
	base := countHost(t, cache)

	marker := "3131.0" + strconv.Itoa(os.Getpid())
	_, guest, m := (&env{t: t, target: targets["sandbox"]}).tree("t", false, map[string]string{"f": "x"})
	p := startPeer(t, "sandbox")
	p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
	p.sh("setsid sh -c 'sleep " + marker + "' >/dev/null 2>&1 </dev/null & echo kept > /root/file; cat " + guest + "/f")
	p.sendDoc(protocol.AppendRequest(nil, p.nextID, protocol.MethodExec, &protocol.ExecParams{Cmd: []string{"sleep", marker}}))
	p.nextID++
	time.Sleep(300 * time.Millisecond)
	if n := countMarked(marker); n != 3 { // setsid's sh and its sleep, and the exec's sleep
		t.Fatalf("%d marked processes before the kill, want 3", n)
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done

	deadline := time.Now().Add(15 * time.Second)
	for countMarked(marker) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes of the sandbox outlived its killed server", countMarked(marker))
		}
		time.Sleep(20 * time.Millisecond)
	}
	settle(t, cache, base, "a killed server")
}

// TestSandboxManySessionsLeakNothing: 200 sessions opened, used (a tree, a write, an exec)
// and closed in a loop leave nothing behind.
func TestSandboxManySessionsLeakNothing(t *testing.T) {
	requireSandbox(t)
	if testing.Short() {
		t.Skip("200 sessions: not in -short")
	}
	cache := sandboxEnv(t)
	warm := startPeer(t, "sandbox")
	warm.exec("true")
	warm.notify(protocol.MethodQuit)
	warm.expectEOF()
	base := countHost(t, cache)
	_, guest, m := (&env{t: t, target: targets["sandbox"]}).tree("t", false, map[string]string{"f": "x"})
	marker := "3232.0" + strconv.Itoa(os.Getpid())
	for i := range 200 {
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{m}})
		p.write("/root/w", []byte(strconv.Itoa(i)), nil)
		if got := p.sh("cat /root/w " + guest + "/f; (sleep " + marker + " >/dev/null 2>&1 &)"); got != strconv.Itoa(i)+"x" {
			t.Fatalf("session %d: %q", i, got)
		}
		if i%2 == 0 {
			p.notify(protocol.MethodQuit)
		} else {
			p.stdin.Close()
		}
		p.expectEOF()
	}
	deadline := time.Now().Add(15 * time.Second)
	for countMarked(marker) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes outlived their sessions", countMarked(marker))
		}
		time.Sleep(20 * time.Millisecond)
	}
	settle(t, cache, base, "200 sessions")
	if strings.Contains(os.Getenv("VIRTX_LOG"), "debug") {
		t.Logf("counts: %+v", countHost(t, cache))
	}
}

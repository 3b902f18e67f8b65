package conformance

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// vmChildren are the QEMU, virtiofsd and slirp4netns processes below a server.
func vmChildren(pid int) map[int]string {
	out := map[int]string{}
	for p, n := range descendants(pid) {
		if strings.HasPrefix(n, "qemu") || strings.HasPrefix(n, "virtiofsd") || strings.HasPrefix(n, "slirp4netns") {
			out[p] = n
		}
	}
	return out
}

// TestVMServerKilled kills a server with a booted VM with SIGKILL: its QEMU and
// virtiofsd die with it (parent-death signal), and the next server reaps its run dir.
func TestVMServerKilled(t *testing.T) {
	requireVM(t)
	p := startPeer(t, "vm")
	p.init(&protocol.InitParams{Mounts: []protocol.Mount{{URL: "file://" + t.TempDir(), GuestPath: "/data"}}})
	p.exec("true")
	pid := p.cmd.Process.Pid
	kids := vmChildren(pid)
	if len(kids) < 3 {
		t.Fatalf("want QEMU, virtiofsd and slirp4netns (network on) below the server, found %v", kids)
	}
	if len(runDirsOf(t, pid)) != 1 {
		t.Fatalf("want one run dir of the server, found %v", runDirsOf(t, pid))
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	waitGone(t, kids, 10*time.Second)

	// The next server that boots reaps what the killed one left.
	q := startPeer(t, "vm")
	q.exec("true")
	if left := runDirsOf(t, pid); len(left) != 0 {
		t.Fatalf("the killed server's run dir is still there: %v", left)
	}
	qpid := q.cmd.Process.Pid
	qkids := vmChildren(qpid)
	q.notify(protocol.MethodQuit)
	q.expectEOF()
	<-q.done
	waitGone(t, qkids, 10*time.Second)
	if left := runDirsOf(t, qpid); len(left) != 0 {
		t.Fatalf("a server that quit left its run dir: %v", left)
	}
}

// TestVMSessionLoop opens and closes 20 sessions, each booted, and checks that none
// leaves a process, a run dir or a mount behind.
func TestVMSessionLoop(t *testing.T) {
	requireVM(t)
	mountsBefore := countLines(t, "/proc/self/mountinfo")
	for i := 0; i < 20; i++ {
		p := startPeer(t, "vm")
		p.init(&protocol.InitParams{Mounts: []protocol.Mount{{URL: "file://" + t.TempDir(), GuestPath: "/data", ReadOnly: i%2 == 0}}})
		if got := p.sh("echo $((1+1))"); got != "2\n" {
			t.Fatalf("session %d: %q", i, got)
		}
		pid := p.cmd.Process.Pid
		kids := vmChildren(pid)
		p.stdin.Close()
		p.expectEOF()
		<-p.done
		waitGone(t, kids, 10*time.Second)
		if left := runDirsOf(t, pid); len(left) != 0 {
			t.Fatalf("session %d left %v", i, left)
		}
	}
	if after := countLines(t, "/proc/self/mountinfo"); after != mountsBefore {
		t.Fatalf("mounts in the host's namespace: %d before, %d after", mountsBefore, after)
	}
}

func countLines(t testing.TB, p string) int {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

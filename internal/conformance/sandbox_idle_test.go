package conformance

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"virtx.dev/virtx/internal/linux"
	"virtx.dev/virtx/protocol"
)

// An idle session (server and its sandbox's init, nothing asked for IdleTrimAfter) holds
// at most 10 MiB of resident memory, the bar for 100 idle sessions: both hand back
// their pages of the binary (linux.IdleTrimmer), and the next request is served as before.
func TestSandboxIdleMemory(t *testing.T) {
	requireSandbox(t)
	p := startPeer(t, "sandbox")
	p.init(&protocol.InitParams{Network: boolp(false)})
	p.exec("true")
	srv := p.cmd.Process.Pid
	init := sandboxInit(t, srv)
	busy := rssKiB(srv) + rssKiB(init)
	time.Sleep(linux.IdleTrimAfter + 1500*time.Millisecond)
	idle := rssKiB(srv) + rssKiB(init)
	t.Logf("server + init resident: %d KiB after a request, %d KiB idle", busy, idle)
	if idle > 10<<10 {
		t.Errorf("an idle session holds %d KiB resident (server %d + init %d), over 10 MiB", idle, rssKiB(srv), rssKiB(init))
	}
	if r := p.exec("echo", "still here"); string(r.Stdout) != "still here\n" {
		t.Errorf("after the trim: %q", r.Stdout)
	}
}

// sandboxInit is the pid of the sandbox init a server started.
func sandboxInit(t *testing.T, server int) int {
	t.Helper()
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", server))
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", server, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			cmdline, _ := os.ReadFile("/proc/" + f + "/cmdline")
			if strings.Contains(string(cmdline), "__sandbox-init") {
				pid, _ := strconv.Atoi(f)
				return pid
			}
		}
	}
	t.Fatalf("no sandbox init among server %d's children", server)
	return 0
}

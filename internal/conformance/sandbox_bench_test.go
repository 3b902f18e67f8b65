package conformance

import (
	"os/exec"
	"testing"

	"virtx.dev/virtx/protocol"
)

// The sandbox benchmarks, against their yardsticks measured in the same run:
//
//   - BenchmarkSandboxColdSession: spawn `virtx serve --backend sandbox`, init, and the first
//     exec answered (the boot happens on that exec); the quit after it is not timed. Yardstick:
//     BenchmarkBwrapTrue (bubblewrap running `true` in new namespaces; the goal is
//     at most 2× it).
//   - BenchmarkSandboxWarmExec: one exec of /bin/true in a booted sandbox. Yardstick:
//     BenchmarkForkExecTrue (bench_test.go; the goal is at most 1.5× it).

func BenchmarkSandboxColdSession(b *testing.B) {
	requireSandbox(b)
	params := &protocol.ExecParams{Cmd: []string{"/bin/true"}}
	for b.Loop() {
		p := startPeer(b, "sandbox")
		p.init(&protocol.InitParams{})
		if m := p.call(protocol.MethodExec, params); m.Err != nil {
			b.Fatal(m.Err)
		}
		b.StopTimer() // the session's end is not its start
		p.notify(protocol.MethodQuit)
		p.expectEOF()
		b.StartTimer()
	}
}

func BenchmarkSandboxWarmExec(b *testing.B) {
	requireSandbox(b)
	p := startPeer(b, "sandbox")
	p.exec("true") // booted
	params := &protocol.ExecParams{Cmd: []string{"/bin/true"}}
	b.ResetTimer()
	for b.Loop() {
		if m := p.call(protocol.MethodExec, params); m.Err != nil {
			b.Fatal(m.Err)
		}
	}
}

// BenchmarkBwrapTrue is bubblewrap (Debian: bubblewrap) running `true` with the host's
// /usr and fresh namespaces, as the issue measures it.
func BenchmarkBwrapTrue(b *testing.B) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Skip("bwrap is not installed (Debian: apt-get install bubblewrap)")
	}
	args := []string{"--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
		"--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "--die-with-parent", "--new-session", "true"}
	for b.Loop() {
		if err := exec.Command(bwrap, args...).Run(); err != nil {
			b.Fatal(err)
		}
	}
}

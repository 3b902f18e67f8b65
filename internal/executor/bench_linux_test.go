//go:build linux

package executor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BenchmarkExecTrue and BenchmarkForkExecTrue side by side give the
// executor's overhead over a bare os/exec of the same program.
func BenchmarkExecTrue(b *testing.B) {
	e := newTestExecutor(b, Config{})
	req := ExecRequest{Cmd: []string{"/bin/true"}, Cwd: "/"}
	for b.Loop() {
		res, err := e.Exec(context.Background(), req)
		if err != nil || res.Code != 0 {
			b.Fatal(res, err)
		}
	}
}

func BenchmarkForkExecTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRead64MiB(b *testing.B) {
	e := newTestExecutor(b, Config{})
	p := filepath.Join(b.TempDir(), "big")
	if err := os.WriteFile(p, make([]byte, 64<<20), 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(DefaultReadLimit) // one Read returns at most this much
	for b.Loop() {
		data, _, err := e.Read(context.Background(), p, 0, -1)
		if err != nil || len(data) != DefaultReadLimit {
			b.Fatal(len(data), err)
		}
	}
}

func BenchmarkWrite64MiB(b *testing.B) {
	e := newTestExecutor(b, Config{})
	p := filepath.Join(b.TempDir(), "big")
	data := make([]byte, 64<<20)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := e.Write(context.Background(), p, data, 0, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecTrueSubreaper is BenchmarkExecTrue as a server runs it: with Subreaper,
// each exec also looks for orphans to reap. (It leaves this test process a subreaper.)
func BenchmarkExecTrueSubreaper(b *testing.B) {
	e := newTestExecutor(b, Config{Subreaper: true})
	req := ExecRequest{Cmd: []string{"/bin/true"}, Cwd: "/"}
	for b.Loop() {
		res, err := e.Exec(context.Background(), req)
		if err != nil || res.Code != 0 {
			b.Fatal(res, err)
		}
	}
}

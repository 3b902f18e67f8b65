package conformance

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"virtx.dev/virtx/protocol"
)

// The benchmarks drive the real `virtx serve --backend host` over stdio, as a client
// would, so they measure the whole path: frame, decode, session rules, executor, answer.
// BenchmarkForkExecTrue is the yardstick for BenchmarkExecTrue, measured in the same run.

func BenchmarkExecTrue(b *testing.B) {
	p := startPeer(b, "host")
	p.exec("true") // warm: booted
	params := &protocol.ExecParams{Cmd: []string{"/bin/true"}}
	b.ResetTimer()
	for b.Loop() {
		if m := p.call(protocol.MethodExec, params); m.Err != nil {
			b.Fatal(m.Err)
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

const (
	benchFileSize = 64 << 20
	benchPiece    = 16 << 20 // pieces well under the 64 MiB frame cap
)

func benchTree(b *testing.B) (*peer, string) {
	dir := b.TempDir()
	p := startPeer(b, "host")
	p.init(&protocol.InitParams{Mounts: []protocol.Mount{{URL: "file://" + dir, GuestPath: dir}}})
	return p, filepath.Join(dir, "f")
}

func BenchmarkRead64MiB(b *testing.B) {
	p, f := benchTree(b)
	if err := os.WriteFile(f, make([]byte, benchFileSize), 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		for off := uint64(0); off < benchFileSize; off += benchPiece {
			r := p.read(f, u64(off), u64(benchPiece))
			if len(r.Data) != benchPiece {
				b.Fatalf("short read %d", len(r.Data))
			}
		}
	}
}

func BenchmarkWrite64MiB(b *testing.B) {
	p, f := benchTree(b)
	piece := make([]byte, benchPiece)
	b.SetBytes(benchFileSize)
	b.ResetTimer()
	for b.Loop() {
		for off := uint64(0); off < benchFileSize; off += benchPiece {
			var o *uint64
			if off > 0 {
				o = u64(off)
			}
			p.write(f, piece, o)
		}
	}
}

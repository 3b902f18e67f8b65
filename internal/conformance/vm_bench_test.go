package conformance

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// The vm benchmarks report medians of their samples (ReportMetric) next to Go's mean:
// run them once, e.g.
//
//	VIRTX_CONFORMANCE_BACKENDS=vm go test -run '^$' -bench VM -benchtime 10x ./internal/conformance

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkVMColdSession: spawn a server, init, and the first exec answered (a boot).
func BenchmarkVMColdSession(b *testing.B) {
	requireVM(b)
	warm := startPeer(b, "vm") // provisioning (kernel, guest binary) is not a session's
	warm.exec("true")
	var samples []time.Duration
	for b.Loop() {
		start := time.Now()
		p := startPeer(b, "vm")
		p.init(&protocol.InitParams{})
		p.exec("true")
		samples = append(samples, time.Since(start))
		b.StopTimer()
		p.stdin.Close()
		<-p.done
		b.StartTimer()
	}
	b.ReportMetric(float64(median(samples).Milliseconds()), "ms-median/session")
}

// BenchmarkVMExecTrue: the warm round trip of one exec.
func BenchmarkVMExecTrue(b *testing.B) {
	benchVMExec(b, "/bin/true")
}

// BenchmarkVMExecPwd: the round trip of an exec the executor answers itself (pwd runs
// no process): the protocol, the relay and the virtio-serial channel, without a fork
// and exec inside the guest (which dominates BenchmarkVMExecTrue under TCG).
func BenchmarkVMExecPwd(b *testing.B) {
	benchVMExec(b, "pwd")
}

// benchVMExec times warm execs of argv on one booted vm session (medians reported).
func benchVMExec(b *testing.B, argv ...string) {
	requireVM(b)
	p := startPeer(b, "vm")
	p.exec("true")
	params := &protocol.ExecParams{Cmd: argv}
	var samples []time.Duration
	for b.Loop() {
		start := time.Now()
		if m := p.call(protocol.MethodExec, params); m.Err != nil {
			b.Fatal(m.Err)
		}
		samples = append(samples, time.Since(start))
	}
	b.ReportMetric(float64(median(samples).Microseconds()), "µs-median/exec")
}

// BenchmarkVMIdleRSS: the resident memory of an idle booted session's QEMU and
// virtiofsd (guest memory is counted as QEMU touches it).
func BenchmarkVMIdleRSS(b *testing.B) {
	requireVM(b)
	var samples []time.Duration // KiB, in a Duration for median()
	for b.Loop() {
		p := startPeer(b, "vm")
		p.exec("true")
		time.Sleep(time.Second)
		var kib int64
		for pid := range vmChildren(p.cmd.Process.Pid) {
			kib += rssKiB(pid)
		}
		samples = append(samples, time.Duration(kib))
		b.StopTimer()
		p.stdin.Close()
		<-p.done
		b.StartTimer()
	}
	b.ReportMetric(float64(median(samples))/1024, "MiB-median-RSS/session")
}

func rssKiB(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}

// BenchmarkVMWrite64MiB and BenchmarkVMRead64MiB: a 64 MiB file through the protocol,
// in 16 MiB pieces, to and from the session's own disk.
func BenchmarkVMWrite64MiB(b *testing.B) {
	requireVM(b)
	p := startPeer(b, "vm")
	p.exec("true")
	piece := make([]byte, benchPiece)
	b.SetBytes(benchFileSize)
	var samples []time.Duration
	for b.Loop() {
		start := time.Now()
		for off := uint64(0); off < benchFileSize; off += benchPiece {
			var o *uint64
			if off > 0 {
				o = u64(off)
			}
			p.write("/root/f", piece, o)
		}
		samples = append(samples, time.Since(start))
	}
	b.ReportMetric(float64(benchFileSize)/(1<<20)/median(samples).Seconds(), "MiB/s-median")
}

func BenchmarkVMRead64MiB(b *testing.B) {
	requireVM(b)
	p := startPeer(b, "vm")
	p.sh("head -c 67108864 /dev/zero > /root/f")
	b.SetBytes(benchFileSize)
	var samples []time.Duration
	for b.Loop() {
		start := time.Now()
		for off := uint64(0); off < benchFileSize; off += benchPiece {
			if r := p.read("/root/f", u64(off), u64(benchPiece)); len(r.Data) != benchPiece {
				b.Fatalf("short read %d", len(r.Data))
			}
		}
		samples = append(samples, time.Since(start))
	}
	b.ReportMetric(float64(benchFileSize)/(1<<20)/median(samples).Seconds(), "MiB/s-median")
}

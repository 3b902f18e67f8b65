package cli

import (
	"os"
	"runtime/pprof"
)

// startCPUProfile writes a CPU profile of `virtx serve` to path until stop is called
// ($VIRTX_CPUPROFILE: for finding where a benchmark's time goes on the server side).
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

//go:build !linux

package hostcheck

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/internal/linux/cgroup"
)

var errUnsupported = fmt.Errorf("unsupported on %s: virtx's boundaries need Linux", runtime.GOOS)

// Local is this machine; off Linux every probe fails with an "unsupported on GOOS" error
// and the checks that read Linux files find nothing.
func Local() *Host {
	return &Host{
		Proc: "/proc", Dev: "/dev", Sys: "/sys", Modules: "/lib/modules",
		Euid:            os.Geteuid(),
		GOARCH:          runtime.GOARCH,
		LookPath:        exec.LookPath,
		DetectCgroups:   cgroup.Detect,
		FindCacheDir:    console.CacheDir,
		Writable:        func(string) bool { return false },
		FreeSpace:       func(string) (uint64, error) { return 0, errUnsupported },
		ProbeNamespaces: func(bool) error { return errUnsupported },
		ProbeKVM:        func(string) (int, error) { return 0, errUnsupported },
	}
}

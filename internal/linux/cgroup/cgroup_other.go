//go:build !linux

package cgroup

import (
	"fmt"
	"runtime"
	"syscall"
)

var errUnsupported = fmt.Errorf("%w: cgroups are unsupported on %s", ErrCannotEnforce, runtime.GOOS)

// Detect reports that there are no cgroups off Linux.
func Detect() Info {
	return Info{Reason: "cgroups are unsupported on " + runtime.GOOS + ": run virtx on Linux"}
}

// Create fails: cgroups are Linux-only.
func Create(name string, lim Limits) (*Group, error) { return nil, errUnsupported }

// ReapStale has nothing to do off Linux.
func ReapStale() (int, error) { return 0, nil }

// Group is a cgroup; there are none off Linux.
type Group struct{}

func (g *Group) Add(pid int) error        { return errUnsupported }
func (g *Group) Procs() ([]int, error)    { return nil, errUnsupported }
func (g *Group) Kill() error              { return errUnsupported }
func (g *Group) Destroy() error           { return nil }
func (g *Group) OOMKills() (int64, error) { return 0, errUnsupported }
func (g *Group) Path() string             { return "" }

// StartProcess fails: cgroups are Linux-only.
func (g *Group) StartProcess(attr *syscall.SysProcAttr, start func(attr *syscall.SysProcAttr) (pid int, err error)) (int, error) {
	return 0, errUnsupported
}

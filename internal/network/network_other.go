//go:build !linux

package network

import (
	"context"
	"fmt"
	"net"
	"runtime"
)

// errUnsupported is what everything answers on a GOOS other than Linux.
var errUnsupported = fmt.Errorf("network: %w on %s: network namespaces are Linux's", ErrUnsupported, runtime.GOOS)

// sysUserNet holds nothing where namespaces do not exist.
type sysUserNet struct{}

// SetupLoopback fails: network namespaces exist only on Linux.
func SetupLoopback() error { return errUnsupported }

// Available fails: network namespaces exist only on Linux.
func Available() (tool string, err error) { return "", errUnsupported }

// Start fails: network namespaces exist only on Linux.
func Start(ctx context.Context, pid int, opts Options) (*UserNet, error) {
	return nil, errUnsupported
}

// Close does nothing: no UserNet is ever made here.
func (u *UserNet) Close() error { return nil }

// DialInNetns fails: network namespaces exist only on Linux.
func DialInNetns(ctx context.Context, nsPath string, network, addr string) (net.Conn, error) {
	return nil, errUnsupported
}

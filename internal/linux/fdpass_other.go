//go:build !linux

package linux

import "net"

// SendFds fails: unsupported here.
func SendFds(c *net.UnixConn, data []byte, fds ...int) error {
	return wrap("sendmsg", "", ErrUnsupported)
}

// RecvFds fails: unsupported here.
func RecvFds(c *net.UnixConn, buf []byte, maxFds int) (int, []int, error) {
	return 0, nil, wrap("recvmsg", "", ErrUnsupported)
}

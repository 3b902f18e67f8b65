package linux

import (
	"net"

	"golang.org/x/sys/unix"
)

// SendFds writes data on a Unix socket with the descriptors fds attached (SCM_RIGHTS).
// data must not be empty: the descriptors travel with its first byte.
func SendFds(c *net.UnixConn, data []byte, fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(data, oob, nil)
	if err == nil && (n != len(data) || oobn != len(oob)) {
		err = unix.EMSGSIZE
	}
	return wrap("sendmsg", "", err)
}

// RecvFds reads into buf from a Unix socket, with up to maxFds descriptors that came with
// those bytes (close-on-exec). Descriptors beyond maxFds are closed.
func RecvFds(c *net.UnixConn, buf []byte, maxFds int) (int, []int, error) {
	oob := make([]byte, unix.CmsgSpace(4*max(maxFds, 1)))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return n, nil, wrap("recvmsg", "", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return n, nil, wrap("recvmsg: control message", "", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range got {
			if len(fds) < maxFds {
				fds = append(fds, fd)
			} else {
				unix.Close(fd)
			}
		}
	}
	return n, fds, nil
}

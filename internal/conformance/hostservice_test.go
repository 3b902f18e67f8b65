package conformance

import (
	"net"
	"sync/atomic"
	"testing"
)

// hostService listens on the host's 127.0.0.1 — a service a session must never reach —
// answering every connection with greeting; it counts the connections it accepted and is
// closed when the test ends.
func hostService(t testing.TB, greeting string) (port int, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Write([]byte(greeting))
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, accepted
}

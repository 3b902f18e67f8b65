package conformance

import (
	"archive/tar"
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"

	"virtx.dev/virtx/protocol"
)

// TestSandboxNetwork: network:true gives the session eth0 with a default route through a
// user-space stack, and a resolv.conf naming its relay; the host's loopback services stay
// out of reach however they are addressed; network:false is loopback only.
func TestSandboxNetwork(t *testing.T) {
	requireSandbox(t)
	_, errSlirp := exec.LookPath("slirp4netns")
	_, errPasta := exec.LookPath("pasta")
	requirePrereq(t, errSlirp == nil || errPasta == nil, "a user-space network stack", "Debian: slirp4netns or passt")
	t.Setenv("VIRTX_HOME", t.TempDir())

	port, _ := hostService(t, "host service\n")
	probe := func(host string) string {
		return fmt.Sprintf("import socket; s=socket.create_connection((%q, %d), timeout=2); print(s.recv(64))", host, port)
	}

	t.Run("on", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{Network: boolp(true)})
		if got := p.sh("ls /sys/class/net"); !strings.Contains(got, "eth0") {
			t.Errorf("interfaces: %q, want eth0", got)
		}
		// /proc/net/route: a default route (destination 00000000) on eth0.
		if got := p.sh("cat /proc/net/route"); !strings.Contains(got, "eth0\t00000000") {
			t.Errorf("no default route via eth0:\n%s", got)
		}
		conf := p.sh("cat /etc/resolv.conf")
		ns := ""
		for _, l := range strings.Split(conf, "\n") {
			if v, ok := strings.CutPrefix(l, "nameserver "); ok {
				ns = strings.TrimSpace(v)
			}
		}
		if ns != "10.0.2.3" && ns != "169.254.1.53" {
			t.Errorf("resolv.conf names %q, want the user-space stack's relay:\n%s", ns, conf)
		}
		// The host's 127.0.0.1 service: not through the session's own loopback, not
		// through the gateway (slirp's 10.0.2.2 would be the host's loopback without
		// --disable-host-loopback), not through the host's other addresses.
		targets := []string{"127.0.0.1", "10.0.2.2"}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
					targets = append(targets, ip.IP.String())
				}
			}
		}
		for _, h := range targets {
			if r := p.exec("python3", "-c", probe(h)); r.Code == 0 {
				t.Errorf("network true: a command reached the host's 127.0.0.1:%d through %s: %s", port, h, r.Stdout)
			}
		}
		// The resolv.conf it was given is not among the session's writes.
		blob := p.ok(protocol.MethodSnapshot, nil).(*protocol.SnapshotResult).Blob
		tr := tar.NewReader(bytes.NewReader(blob))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if strings.Contains(h.Name, "resolv.conf") {
				t.Errorf("the snapshot carries %s", h.Name)
			}
		}
	})

	t.Run("off", func(t *testing.T) {
		p := startPeer(t, "sandbox")
		p.init(&protocol.InitParams{Network: boolp(false)})
		if got := strings.TrimSpace(p.sh("ls /sys/class/net")); got != "lo" {
			t.Errorf("network false, interfaces: %q", got)
		}
		for _, h := range []string{"127.0.0.1", "10.0.2.2"} {
			if r := p.exec("python3", "-c", probe(h)); r.Code == 0 {
				t.Errorf("network false: a command reached the host's 127.0.0.1:%d through %s", port, h)
			}
		}
	})
}

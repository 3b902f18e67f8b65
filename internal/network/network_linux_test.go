package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// quiet is how long a probe waits for a connection that must not come.
const quiet = 300 * time.Millisecond

// hostLoopbackListener is a service on the host's 127.0.0.1 that no session may reach.
func hostLoopbackListener(t *testing.T) (netip.AddrPort, func() int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	n := countAccepts(ln)
	return ln.Addr().(*net.TCPAddr).AddrPort(), func() int64 { return n.Load() }
}

func TestSetupLoopbackThenDialInNetns(t *testing.T) {
	g := newNetns(t, true) // the guest ran SetupLoopback and listens on 127.0.0.1 itself
	if got := g.links(t); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("links in a fresh namespace: %v, want [lo]", got)
	}
	dialEcho(t, g.path, "tcp", fmt.Sprintf("127.0.0.1:%d", g.loPort))

	// A service bound to 0.0.0.0 inside is reached through 127.0.0.1 too.
	any := g.listen(t, "tcp", "0.0.0.0:0")
	go serveEcho(any)
	dialEcho(t, g.path, "tcp4", fmt.Sprintf("127.0.0.1:%d", any.Addr().(*net.TCPAddr).Port))

	// IPv6 loopback came up with lo as well.
	six := g.listen(t, "tcp6", "[::1]:0")
	go serveEcho(six)
	dialEcho(t, g.path, "tcp", fmt.Sprintf("[::1]:%d", six.Addr().(*net.TCPAddr).Port))

	// The calling goroutine's thread is back in the host namespace.
	self, _ := nsOf("/proc/self/ns/net")
	here, _ := nsOf(threadNetns)
	if self != here {
		t.Fatal("thread left in the guest namespace")
	}
}

func TestDialInNetnsErrors(t *testing.T) {
	g := newNetns(t, true)
	ctx := context.Background()

	free := g.listen(t, "tcp", "127.0.0.1:0")
	port := free.Addr().(*net.TCPAddr).Port
	free.Close()
	_, err := DialInNetns(ctx, g.path, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("nothing listening: got %v, want ECONNREFUSED", err)
	}

	_, err = DialInNetns(ctx, "/proc/self/ns/no-such", "tcp", "127.0.0.1:1")
	if !errors.Is(err, fs.ErrNotExist) || !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "/proc/self/ns/no-such") {
		t.Fatalf("missing namespace: got %v", err)
	}
	if _, err := DialInNetns(ctx, g.path, "tcp", "localhost:80"); err == nil {
		t.Fatal("a host name was accepted")
	}
	if _, err := DialInNetns(ctx, g.path, "unix", "127.0.0.1:80"); err == nil {
		t.Fatal("network unix was accepted")
	}
}

func TestWithoutStartOnlyLoopback(t *testing.T) {
	hostAddr, accepted := hostLoopbackListener(t)
	g := newNetns(t, true)
	if got := g.links(t); !slices.Equal(got, []string{"lo"}) {
		t.Fatalf("links: %v, want [lo]", got)
	}
	if g.hasDefaultRoute(t) {
		t.Fatal("a namespace without Start has a default route")
	}
	ctx := context.Background()
	// 127.0.0.1 inside is the namespace's own: nothing listens on that port there.
	if _, err := DialInNetns(ctx, g.path, "tcp", hostAddr.String()); !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("dial host's loopback port from inside: got %v, want ECONNREFUSED", err)
	}
	// Anything else has no route.
	if _, err := DialInNetns(ctx, g.path, "tcp", "198.51.100.7:80"); !errors.Is(err, unix.ENETUNREACH) {
		t.Fatalf("dial outside: got %v, want ENETUNREACH", err)
	}
	time.Sleep(quiet)
	if n := accepted(); n != 0 {
		t.Fatalf("the host's 127.0.0.1 listener got %d connections", n)
	}
}

func TestStartHostLoopbackUnreachable(t *testing.T) {
	for _, tool := range tools {
		t.Run(tool, func(t *testing.T) {
			requireTool(t, tool)
			hostAddr, accepted := hostLoopbackListener(t)
			g := newNetns(t, true)
			u := startNet(t, g, Options{Tool: tool})
			if u.Tool() != tool {
				t.Fatalf("Tool() = %q", u.Tool())
			}
			if links := g.links(t); !slices.Contains(links, Interface) {
				t.Fatalf("links after Start: %v", links)
			}
			if !g.hasDefaultRoute(t) {
				t.Fatal("no default route after Start")
			}
			ctx := context.Background()
			port := hostAddr.Port()

			// The session's 127.0.0.1 is still its own.
			if _, err := DialInNetns(ctx, g.path, "tcp", hostAddr.String()); !errors.Is(err, unix.ECONNREFUSED) {
				t.Errorf("dial 127.0.0.1:%d inside: got %v, want ECONNREFUSED", port, err)
			}
			// The addresses a tool could alias to the host's loopback.
			var aliases []netip.Addr
			if tool == ToolSlirp4netns {
				aliases = []netip.Addr{netip.MustParseAddr("10.0.2.2"), slirpDNS}
			} else {
				aliases = []netip.Addr{pastaDNS}
			}
			for _, a := range aliases {
				dctx, cancel := context.WithTimeout(ctx, quiet)
				c, err := DialInNetns(dctx, g.path, "tcp", netip.AddrPortFrom(a, port).String())
				cancel()
				if err == nil {
					// pasta answers a SYN before its own connect is through; what counts
					// is whether anything arrives at the host's listener.
					c.Close()
				}
				time.Sleep(quiet)
				if n := accepted(); n != 0 {
					t.Fatalf("the host's 127.0.0.1 listener got %d connections from the session through %v", n, a)
				}
			}
			// SYNs written straight onto the tap, past the session's routing (which keeps
			// these destinations local): each would be a connection to the host's loopback
			// without the tap guard.
			src := netip.AddrPortFrom(g.addr4(t), 40000)
			for _, dst := range []string{"127.0.0.1", "0.0.0.0"} {
				sendRawSYN(t, g.path, src, netip.AddrPortFrom(netip.MustParseAddr(dst), port))
				time.Sleep(quiet)
				if n := accepted(); n != 0 {
					t.Fatalf("the host's 127.0.0.1 listener got %d connections from a raw SYN to %s", n, dst)
				}
			}
			if src6, ok := g.addr6(t); ok {
				ln6, err := net.Listen("tcp6", "[::1]:0")
				if err != nil {
					t.Fatal(err)
				}
				defer ln6.Close()
				accepted6 := countAccepts(ln6)
				port6 := uint16(ln6.Addr().(*net.TCPAddr).Port)
				for _, dst := range []netip.AddrPort{
					netip.AddrPortFrom(netip.IPv6Loopback(), port6),
					netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), port),
				} {
					sendRawSYN(t, g.path, netip.AddrPortFrom(src6, 40000), dst)
					time.Sleep(quiet)
					if n := accepted() + accepted6.Load(); n != 0 {
						t.Fatalf("the host's loopback listeners got %d connections from a raw SYN to %v", n, dst)
					}
				}
			} else if tool == ToolPasta {
				t.Log("no IPv6 in the session: IPv6 probes skipped")
			}
		})
	}
}

func TestStartOutboundThroughFakeHost(t *testing.T) {
	for _, tool := range tools {
		t.Run(tool, func(t *testing.T) {
			requireTool(t, tool)
			f := newFakeHost(t)
			remote := f.r.listen(t, "tcp", netip.AddrPortFrom(fakeRemoteAddr, 0).String())
			go serveEcho(remote)
			remotePort := remote.Addr().(*net.TCPAddr).Port
			var dnsConn net.PacketConn
			f.r.in(t, func() (err error) {
				dnsConn, err = net.ListenPacket("udp", netip.AddrPortFrom(fakeRemoteAddr, 53).String())
				return err
			})
			t.Cleanup(func() { dnsConn.Close() })
			queries := serveDNS(dnsConn)
			// The fake host's own loopback service, which the session must not reach.
			hostLo := f.h.listen(t, "tcp", "127.0.0.1:0")
			hostLoHits := countAccepts(hostLo)
			hostLoPort := uint16(hostLo.Addr().(*net.TCPAddr).Port)

			g := newNetns(t, true)
			u := startNet(t, g, Options{Tool: tool, hostNetns: f.h.path, resolvConf: resolvConf(t, fakeRemoteAddr)})
			ctx := context.Background()

			// Outbound TCP reaches the remote through the helper.
			dialEcho(t, g.path, "tcp", netip.AddrPortFrom(fakeRemoteAddr, uint16(remotePort)).String())

			// DNS sent where DNS() says reaches the host's resolver (here the remote's).
			if dns := u.DNS(); len(dns) != 1 {
				t.Fatalf("DNS() = %v", dns)
			} else if err := dnsQuery(ctx, g.path, dns[0]); err != nil {
				t.Fatalf("DNS through %v: %v", dns[0], err)
			}
			if queries.Load() == 0 {
				t.Fatal("the resolver saw no query")
			}

			// The gateway is the real gateway, not the host's loopback.
			gw := netip.MustParseAddr("10.0.2.2")
			if tool == ToolPasta {
				gw = fakeRemoteAddr
			}
			dctx, cancel := context.WithTimeout(ctx, quiet)
			if c, err := DialInNetns(dctx, g.path, "tcp", netip.AddrPortFrom(gw, hostLoPort).String()); err == nil {
				c.Close()
			}
			cancel()

			// Raw SYNs: the one to the remote arrives (so the probe is real), the one to
			// 127.0.0.1 must not.
			src := netip.AddrPortFrom(g.addr4(t), 40001)
			probe := f.r.listen(t, "tcp", netip.AddrPortFrom(fakeRemoteAddr, 0).String())
			probeHits := countAccepts(probe)
			sendRawSYN(t, g.path, src, netip.AddrPortFrom(fakeRemoteAddr, uint16(probe.Addr().(*net.TCPAddr).Port)))
			sendRawSYN(t, g.path, netip.AddrPortFrom(src.Addr(), 40002), netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), hostLoPort))
			deadline := time.Now().Add(3 * time.Second)
			for probeHits.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if probeHits.Load() == 0 {
				t.Error("a raw SYN to the remote never arrived: the raw probe proves nothing")
			}
			time.Sleep(quiet)
			if n := hostLoHits.Load(); n != 0 {
				t.Fatalf("the host's 127.0.0.1 listener got %d connections from the session", n)
			}
		})
	}
}

// A host whose resolver listens on its own loopback (systemd-resolved, dnsmasq): DNS
// works through it, and it is the only loopback service the session reaches.
func TestStartDNSWithLoopbackResolver(t *testing.T) {
	for _, tool := range tools {
		t.Run(tool, func(t *testing.T) {
			requireTool(t, tool)
			f := newFakeHost(t)
			var dnsConn net.PacketConn
			f.h.in(t, func() (err error) {
				dnsConn, err = net.ListenPacket("udp", "127.0.0.1:53")
				return err
			})
			t.Cleanup(func() { dnsConn.Close() })
			queries := serveDNS(dnsConn)
			hostLo := f.h.listen(t, "tcp", "127.0.0.1:0")
			hostLoHits := countAccepts(hostLo)
			hostLoPort := uint16(hostLo.Addr().(*net.TCPAddr).Port)

			g := newNetns(t, true)
			u := startNet(t, g, Options{Tool: tool, hostNetns: f.h.path, resolvConf: resolvConf(t, netip.MustParseAddr("127.0.0.1"))})
			ctx := context.Background()
			dns := u.DNS()[0]
			if err := dnsQuery(ctx, g.path, dns); err != nil {
				t.Fatalf("DNS through %v to a loopback resolver: %v", dns, err)
			}
			if queries.Load() == 0 {
				t.Fatal("the loopback resolver saw no query")
			}
			// The relay is for DNS only: another port on the relay address goes nowhere.
			dctx, cancel := context.WithTimeout(ctx, quiet)
			if c, err := DialInNetns(dctx, g.path, "tcp", netip.AddrPortFrom(dns, hostLoPort).String()); err == nil {
				c.Close()
			}
			cancel()
			time.Sleep(quiet)
			if n := hostLoHits.Load(); n != 0 {
				t.Fatalf("the host's 127.0.0.1 listener got %d connections through the DNS relay", n)
			}
		})
	}
}

// A sandbox in a user namespace of its own (as a rootless one is): the helper joins that
// user namespace to make its tap, and the guard still goes on.
func TestStartGuestInUserNamespace(t *testing.T) {
	for _, tool := range tools {
		t.Run(tool, func(t *testing.T) {
			requireTool(t, tool)
			hostAddr, accepted := hostLoopbackListener(t)
			g := newNetnsIn(t, true, true)
			if a, _ := nsOf(fmt.Sprintf("/proc/%d/ns/user", g.pid)); a == must(nsOf("/proc/self/ns/user")) {
				t.Fatal("the guest shares the host's user namespace")
			}
			u := startNet(t, g, Options{Tool: tool})
			if !slices.ContainsFunc(u.sys.cmd.Args, func(a string) bool { return strings.HasPrefix(a, "--userns") }) {
				t.Fatalf("helper not told to join the user namespace: %q", u.sys.cmd.Args)
			}
			if !g.hasDefaultRoute(t) {
				t.Fatal("no default route")
			}
			sendRawSYN(t, g.path, netip.AddrPortFrom(g.addr4(t), 40000), hostAddr)
			time.Sleep(quiet)
			if n := accepted(); n != 0 {
				t.Fatalf("the host's 127.0.0.1 listener got %d connections", n)
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestCloseKillsHelper(t *testing.T) {
	for _, tool := range tools {
		t.Run(tool, func(t *testing.T) {
			requireTool(t, tool)
			g := newNetns(t, false)
			u := startNet(t, g, Options{Tool: tool, MTU: 1500})
			pid := u.sys.pid
			if !alive(pid) {
				t.Fatal("helper not running after Start")
			}
			if got := g.mtu(t); got != 1500 {
				t.Errorf("MTU %d, want 1500", got)
			}
			if err := u.Close(); err != nil {
				t.Fatal(err)
			}
			if alive(pid) {
				t.Fatalf("helper %d still running after Close", pid)
			}
			if err := u.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			// The tap went with its owner.
			deadline := time.Now().Add(2 * time.Second)
			for slices.Contains(g.links(t), Interface) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if links := g.links(t); slices.Contains(links, Interface) {
				t.Fatalf("links after Close: %v", links)
			}
		})
	}
}

// A server killed with SIGKILL takes its helpers along (parent-death signal).
func TestOwnerKilledLeavesNoHelper(t *testing.T) {
	for _, tool := range tools {
		t.Run(tool, func(t *testing.T) {
			requireTool(t, tool)
			g := newNetns(t, false)
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), roleEnv+"=owner", fmt.Sprintf("VIRTX_NETTEST_PID=%d", g.pid), "VIRTX_NETTEST_TOOL="+tool)
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				t.Fatalf("owner: %v", err)
			}
			var helper int
			if _, err := fmt.Sscanf(line, "helper %d", &helper); err != nil {
				t.Fatalf("owner said %q", line)
			}
			t.Cleanup(func() { syscall.Kill(helper, syscall.SIGKILL) }) // if the test fails
			if !alive(helper) {
				t.Fatal("helper not running")
			}
			cmd.Process.Signal(syscall.SIGKILL)
			cmd.Wait()
			deadline := time.Now().Add(3 * time.Second)
			for alive(helper) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if alive(helper) {
				t.Fatalf("helper %d outlived its SIGKILLed owner", helper)
			}
		})
	}
}

func TestStartRefusesHostNamespace(t *testing.T) {
	requireRoot(t)
	tool, err := Available()
	if err != nil {
		if ci() {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	before := helperPids(t)
	_, err = Start(context.Background(), os.Getpid(), Options{Tool: tool})
	if err == nil || !strings.Contains(err.Error(), "host's network namespace") {
		t.Fatalf("Start on the host's namespace: %v", err)
	}
	if after := helperPids(t); !slices.Equal(before, after) {
		t.Fatalf("helpers before %v, after %v", before, after)
	}
}

func TestStartHelperFailureIsReported(t *testing.T) {
	for _, tool := range tools {
		t.Run(tool, func(t *testing.T) {
			requireTool(t, tool)
			g := newNetns(t, false)
			// A device that is not a tap already named eth0: the helper cannot make its
			// tap, and Start must say why rather than wait for a route.
			g.in(t, func() error {
				return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: Interface}, PeerName: "peer0"})
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			before := helperPids(t)
			u, err := Start(ctx, g.pid, Options{Tool: tool})
			if err == nil {
				u.Close()
				t.Fatal("Start succeeded over a dummy eth0")
			}
			if !strings.Contains(err.Error(), "helper exited") {
				t.Fatalf("got %v", err)
			}
			t.Log(err)
			if after := helperPids(t); !slices.Equal(before, after) {
				t.Fatalf("helpers before %v, after %v", before, after)
			}
		})
	}
}

func TestToolChoice(t *testing.T) {
	if _, _, err := findTool("vde"); err == nil {
		t.Fatal("unknown tool accepted")
	}
	if _, err := Start(context.Background(), 1, Options{Tool: "vde"}); err == nil {
		t.Fatal("Start took an unknown tool")
	}
	if _, err := Start(context.Background(), os.Getpid(), Options{MTU: 100}); err == nil || !strings.Contains(err.Error(), "MTU") {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("MTU 100: %v", err)
		}
	}

	saved := searchDirs
	searchDirs = nil
	t.Cleanup(func() { searchDirs = saved })
	t.Setenv("PATH", t.TempDir())
	_, err := Available()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), `"passt"`) || !strings.Contains(err.Error(), "slirp4netns") {
		t.Fatalf("nothing installed: %v", err)
	}
	_, err = Start(context.Background(), os.Getpid(), Options{Tool: ToolPasta})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), `"passt"`) {
		t.Fatalf("pasta missing: %v", err)
	}
}

// helperPids lists running pasta and slirp4netns processes.
func helperPids(t testing.TB) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		if (strings.HasPrefix(name, "passt") || name == "pasta" || name == "slirp4netns") && alive(pid) {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids
}

// mtu is the MTU of Interface inside.
func (p *netnsProc) mtu(t testing.TB) int {
	t.Helper()
	var m int
	p.in(t, func() error {
		ifc, err := net.InterfaceByName(Interface)
		if err != nil {
			return err
		}
		m = ifc.MTU
		return nil
	})
	return m
}

// TestStartLatency reports the median time Start takes per tool (10 starts on one
// namespace, each closed before the next).
func TestStartLatency(t *testing.T) {
	for _, tool := range tools {
		t.Run(tool, func(t *testing.T) {
			requireTool(t, tool)
			g := newNetns(t, false)
			if testing.Verbose() {
				prev := slog.Default()
				slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
				t.Cleanup(func() { slog.SetDefault(prev) })
			}
			var times []time.Duration
			for range 10 {
				t0 := time.Now()
				u, err := Start(context.Background(), g.pid, Options{Tool: tool})
				d := time.Since(t0)
				if err != nil {
					t.Fatal(err)
				}
				times = append(times, d)
				if err := u.Close(); err != nil {
					t.Fatal(err)
				}
				// Wait for the old tap to go before the next start names its own eth0.
				deadline := time.Now().Add(2 * time.Second)
				for slices.Contains(g.links(t), Interface) && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
			}
			slices.Sort(times)
			t.Logf("%s: Start median %v (min %v, max %v) over %d", tool, times[len(times)/2], times[0], times[len(times)-1], len(times))
		})
	}
}

// BenchmarkDialInNetnsThroughput moves 64 MiB per iteration over one DialInNetns
// connection to a sink listening inside a namespace.
func BenchmarkDialInNetnsThroughput(b *testing.B) {
	g := newNetns(b, true)
	sink := g.listen(b, "tcp", "127.0.0.1:0")
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	const size = 64 << 20
	buf := make([]byte, 1<<20)
	addr := sink.Addr().String()
	b.SetBytes(size)
	b.ResetTimer()
	for range b.N {
		c, err := DialInNetns(context.Background(), g.path, "tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		for sent := 0; sent < size; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		c.Close()
	}
}

// BenchmarkDialInNetns is the cost of one connection: setns in, socket, connect, setns
// back.
func BenchmarkDialInNetns(b *testing.B) {
	g := newNetns(b, true)
	addr := fmt.Sprintf("127.0.0.1:%d", g.loPort)
	b.ResetTimer()
	for range b.N {
		c, err := DialInNetns(context.Background(), g.path, "tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkOutbound moves 64 MiB per iteration from a session through each helper to a
// remote behind the fake host.
func BenchmarkOutbound(b *testing.B) {
	for _, tool := range tools {
		b.Run(tool, func(b *testing.B) {
			requireTool(b, tool)
			f := newFakeHost(b)
			sink := f.r.listen(b, "tcp", netip.AddrPortFrom(fakeRemoteAddr, 0).String())
			go func() {
				for {
					c, err := sink.Accept()
					if err != nil {
						return
					}
					go func() { io.Copy(io.Discard, c); c.Close() }()
				}
			}()
			g := newNetns(b, false)
			startNet(b, g, Options{Tool: tool, hostNetns: f.h.path})
			const size = 64 << 20
			buf := make([]byte, 1<<20)
			b.SetBytes(size)
			b.ResetTimer()
			for range b.N {
				c, err := DialInNetns(context.Background(), g.path, "tcp", sink.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				for sent := 0; sent < size; sent += len(buf) {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				c.(*net.TCPConn).CloseWrite()
				io.Copy(io.Discard, c) // until the sink has everything
				c.Close()
			}
		})
	}
}

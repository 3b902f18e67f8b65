package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/network"
)

// startNetwork is startUserNet for callers that name no resolver (the image builder's
// RUN steps, which start it after the boot).
func startNetwork(pid int) (io.Closer, error) {
	c, _, err := startUserNet(context.Background(), pid)
	return c, err
}

// startUserNet gives the sandbox whose init is pid its outbound network, for a session
// with network true: a user-space stack (internal/network: slirp4netns, else pasta), one
// per session, whose tap guard keeps frames for the host's loopback from reaching it. It
// returns once the namespace has eth0 up with a default route, with the resolvers the
// session's /etc/resolv.conf must name; what it returns is closed when the sandbox is
// shut down.
func startUserNet(ctx context.Context, pid int) (io.Closer, []string, error) {
	u, err := network.Start(ctx, pid, network.Options{Tool: rootlessTool()})
	if errors.Is(err, network.ErrUnavailable) {
		return nil, nil, fmt.Errorf("%w: network true: %v", backend.ErrUnsupportedNetwork, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: network true: %v", backend.ErrBootFailed, err)
	}
	var dns []string
	for _, a := range u.DNS() {
		dns = append(dns, a.String())
	}
	return u, dns, nil
}

// outboundNetwork says whether startNetwork gives a session more than loopback.
const outboundNetwork = true

// networkAvailable refuses network true at init where no user-space stack is installed.
func networkAvailable() error {
	if _, err := network.Available(); err != nil {
		return fmt.Errorf("%w: network true: %v", backend.ErrUnsupportedNetwork, err)
	}
	if rootlessTool() == "" && os.Geteuid() != 0 {
		return fmt.Errorf("%w: network true: rootless, the sandbox's user-space network is pasta, which is not installed (slirp4netns cannot confine itself from outside the session's user namespace): apt-get install passt, or ask for network false", backend.ErrUnsupportedNetwork)
	}
	// The stack's tap device comes from /dev/net/tun, opened as the server's user.
	if err := unix.Access("/dev/net/tun", unix.R_OK|unix.W_OK); err != nil {
		return fmt.Errorf("%w: network true: the user-space network needs /dev/net/tun, which this user cannot open (%v): make it usable by everyone as Debian does (chmod 0666 /dev/net/tun; in a container: --device /dev/net/tun), or ask for network false", backend.ErrUnsupportedNetwork, err)
	}
	return nil
}

// rootlessTool is the stack a rootless server uses: pasta, which joins the session's
// user namespace itself. slirp4netns --enable-sandbox, as internal/network starts it,
// fails there (its parent, outside that namespace, cannot setegid(0)). As root it is ""
// (internal/network's preference).
func rootlessTool() string {
	if os.Geteuid() == 0 {
		return ""
	}
	if _, err := exec.LookPath(network.ToolPasta); err == nil {
		return network.ToolPasta
	}
	return ""
}

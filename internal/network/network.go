package network

import (
	"errors"
	"net/netip"
)

// The tools Options.Tool names.
const (
	ToolPasta       = "pasta"       // Debian package "passt"
	ToolSlirp4netns = "slirp4netns" // Debian package "slirp4netns"
)

// DefaultMTU is the MTU of the session's interface when Options.MTU is 0: the largest
// both tools take. A user-space stack moves data per frame, so a large MTU is what makes
// it fast; nothing outside sees it, since the tool re-segments onto host sockets.
const DefaultMTU = 65520

// Interface is the name of the session's interface under either tool.
const Interface = "eth0"

// The addresses a session sends DNS queries to; the tool relays them to the host's
// resolver.
var (
	pastaDNS = netip.MustParseAddr("169.254.1.53")
	slirpDNS = netip.MustParseAddr("10.0.2.3")
)

// ErrUnavailable is matched by the error of Start and Available when the tool asked for
// (or, for "", both tools) is not installed; the message names the Debian package.
var ErrUnavailable = errors.New("no user-space network stack")

// ErrUnsupported is matched by every error this package returns elsewhere than Linux.
var ErrUnsupported = errors.New("unsupported")

// Options says how Start connects a namespace.
type Options struct {
	// Tool is "" (pasta if installed, else slirp4netns), ToolPasta or ToolSlirp4netns.
	Tool string
	// MTU of the session's interface; 0 means DefaultMTU. Between 1280 and 65520.
	MTU int

	// Test hooks, settable only inside this package. hostNetns runs the helper in that
	// network namespace instead of the server's (a fake "host" the tests build from a
	// veth pair); resolvConf bind-mounts that file over /etc/resolv.conf for the helper,
	// in a mount namespace of the helper's own.
	hostNetns  string
	resolvConf string
}

// UserNet is a namespace's connection to the outside: one helper process.
type UserNet struct {
	tool string
	dns  []netip.Addr
	sys  sysUserNet
}

// Tool is the helper in use: ToolPasta or ToolSlirp4netns.
func (u *UserNet) Tool() string { return u.tool }

// DNS is what the session's /etc/resolv.conf should name: the helper relays queries sent
// there to the host's resolver.
func (u *UserNet) DNS() []netip.Addr { return append([]netip.Addr(nil), u.dns...) }

// packageOf is the Debian package that installs tool.
func packageOf(tool string) string {
	if tool == ToolPasta {
		return "passt"
	}
	return tool
}

package protocol

import (
	"fmt"
	"strconv"
	"strings"
)

// Mount is one of a session's trees: where it is (URL), where the session sees it
// (GuestPath), and whether commands may write in it.
type Mount struct {
	URL       string // "<scheme>://…"; the scheme is the kind of tree
	GuestPath string // absolute, without a colon, spelled as the client wrote it
	ReadOnly  bool
}

// Scheme is the URL's scheme ("file", "https", …).
func (m Mount) Scheme() string {
	scheme, _, _ := strings.Cut(m.URL, "://")
	return scheme
}

// String spells the mount the way the wire does; `rw`, the default, is left off.
func (m Mount) String() string {
	if m.ReadOnly {
		return m.URL + ":" + m.GuestPath + ":ro"
	}
	return m.URL + ":" + m.GuestPath
}

// ParseMount reads `<url>:<guest path>[:<option>]…` from the right: trailing segments that
// are options (`ro`, `rw`) are options, the segment before them is the guest path (it must
// start with '/'), and everything before that is the URL, which may hold colons of its own
// but must have a scheme and something after `://`.
func ParseMount(s string) (Mount, error) {
	segs := strings.Split(s, ":")
	var m Mount
	ro, rw := false, false
	i := len(segs) - 1
	for ; i >= 0; i-- {
		switch segs[i] {
		case "ro":
			ro = true
			continue
		case "rw":
			rw = true
			continue
		}
		break
	}
	if ro && rw {
		return Mount{}, fmt.Errorf("mount %q: both ro and rw", s)
	}
	if i < 0 {
		return Mount{}, fmt.Errorf("mount %q: want <url>:<absolute guest path>[:ro]", s)
	}
	if !strings.HasPrefix(segs[i], "/") {
		return Mount{}, fmt.Errorf("mount %q: %q is neither an option (ro, rw) nor an absolute guest path", s, segs[i])
	}
	if i == 0 {
		return Mount{}, fmt.Errorf("mount %q: no URL before the guest path", s)
	}
	m.GuestPath = segs[i]
	m.URL = strings.Join(segs[:i], ":")
	m.ReadOnly = ro
	scheme, rest, ok := strings.Cut(m.URL, "://")
	if !ok || rest == "" || !validScheme(scheme) {
		return Mount{}, fmt.Errorf("mount %q: %q is not a URL (want <scheme>://…)", s, m.URL)
	}
	return m, nil
}

// validScheme follows RFC 3986: a letter, then letters, digits, '+', '-' or '.'.
func validScheme(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		letter := (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if i == 0 && !letter {
			return false
		}
		if !letter && !(c >= '0' && c <= '9') && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

// Port is a way into the session: a listener at 127.0.0.1:Host on the server's machine
// that reaches Guest inside the session.
type Port struct {
	Host  uint16
	Guest uint16
}

// String spells the port as docker's -p does, host first.
func (p Port) String() string { return fmt.Sprintf("%d:%d", p.Host, p.Guest) }

// ParsePort reads "HOST:GUEST", both decimal numbers in 1..65535.
func ParsePort(s string) (Port, error) {
	h, g, ok := strings.Cut(s, ":")
	if !ok || strings.Contains(g, ":") {
		return Port{}, fmt.Errorf("port %q: want \"HOST:GUEST\", e.g. \"8080:80\"", s)
	}
	host, err := parsePortNumber(h)
	if err != nil {
		return Port{}, fmt.Errorf("port %q: host side: %v", s, err)
	}
	guest, err := parsePortNumber(g)
	if err != nil {
		return Port{}, fmt.Errorf("port %q: guest side: %v", s, err)
	}
	return Port{Host: host, Guest: guest}, nil
}

func parsePortNumber(s string) (uint16, error) {
	if s == "" {
		return 0, fmt.Errorf("missing number")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%q is not a number", s)
		}
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%s is not a port in 1..65535", s)
	}
	return uint16(n), nil
}

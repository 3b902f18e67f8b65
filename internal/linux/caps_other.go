//go:build !linux

package linux

// LastCap is 0: there are no Linux capabilities here.
func LastCap() int { return 0 }

// LimitThreadCaps fails: unsupported here.
func LimitThreadCaps(keep []int) error { return wrap("limit capabilities", "", ErrUnsupported) }

// SetNoNewPrivs fails: unsupported here.
func SetNoNewPrivs() error { return wrap("no_new_privs", "", ErrUnsupported) }

// ThreadCaps fails: unsupported here.
func ThreadCaps() (uint64, error) { return 0, wrap("capget", "", ErrUnsupported) }

// SetHostname fails: unsupported here.
func SetHostname(name string) error { return wrap("sethostname", name, ErrUnsupported) }

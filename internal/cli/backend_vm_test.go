package cli

import (
	"errors"
	"strings"
	"testing"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/backend/host"
)

// TestPickBackend checks the auto rule: the highest-ranked backend auto may pick, while a
// backend auto must not pick (a VM under TCG) still runs when asked for by name.
func TestPickBackend(t *testing.T) {
	saved := backendFactories
	defer func() { backendFactories = saved }()
	var made string
	mk := func(name string) func() (backend.Backend, error) {
		return func() (backend.Backend, error) { made = name; return host.New(), nil }
	}
	no := func() error { return errors.New("not here") }
	backendFactories = map[string]backendFactory{}
	registerBackend(backendFactory{name: "plain", rank: 0, make: mk("plain")})
	registerBackend(backendFactory{name: "emulated", rank: 20, autoOK: no, make: mk("emulated")})
	registerBackend(backendFactory{name: "absent", rank: 10, available: no, make: mk("absent")})
	for _, c := range []struct{ ask, want, errHas string }{
		{"auto", "plain", ""},
		{"emulated", "emulated", ""},
		{"plain", "plain", ""},
		{"absent", "", "not available here"},
		{"nosuch", "", "unknown backend"},
	} {
		made = ""
		_, err := pickBackend(c.ask)
		if made != c.want || (c.errHas == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.errHas)) {
			t.Errorf("pickBackend(%q): made %q err %v; want %q err containing %q", c.ask, made, err, c.want, c.errHas)
		}
	}
}

package cli

import (
	"virtx.dev/virtx/internal/backend/sandbox"
	"virtx.dev/virtx/internal/guest"
)

// entryPoints are the hidden commands this binary runs as when virtx itself starts it
// inside a boundary: a sandbox's PID 1 (`virtx __sandbox-init`) and a VM guest's /init
// (`__guest-init`). Main runs them before it builds the command tree: each is on the
// cold path of every session, and under TCG building the cobra tree costs the guest
// tens of milliseconds.
var entryPoints = map[string]func(args []string) error{
	sandbox.InitCommand: sandbox.RunInit,
	"__guest-init":      func([]string) error { return guest.Main() },
}

package cli

import (
	"virtx.dev/virtx/console"
	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/backend/sandbox"
)

func init() {
	registerBackend(backendFactory{
		name:      "sandbox",
		rank:      10, // a real boundary: above host, below a VM
		available: sandbox.Available,
		make: func() (backend.Backend, error) {
			// One server, one session: its first init starts with the server.
			opts := []sandbox.Option{sandbox.WithLogger(logger("").With("backend", "sandbox")), sandbox.WithPrespawn()}
			if dir, err := console.CacheDir(); err == nil {
				opts = append(opts, sandbox.WithCacheDir(dir))
			}
			return sandbox.New(opts...), nil
		},
	})
}

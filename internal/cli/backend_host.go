package cli

import (
	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/backend/host"
)

func init() {
	registerBackend(backendFactory{
		name: "host",
		rank: 0, // no boundary at all: auto takes it only when nothing else works
		make: func() (backend.Backend, error) { return host.New(host.WithSubreaper()), nil },
	})
}

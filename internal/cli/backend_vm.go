package cli

import (
	"fmt"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/backend/vm"
)

func init() {
	registerBackend(backendFactory{
		name: "vm",
		rank: 20, // a kernel of its own: above sandbox (10), when hardware runs it
		// Asked for by name it always runs (TCG where there is no KVM): a missing QEMU
		// or kernel is answered by the first boot, naming the fix. auto picks it only
		// where hardware acceleration really works.
		autoOK: func() error {
			if _, _, err := vm.FindQEMU(); err != nil {
				return err
			}
			cache, err := console.CacheDir()
			if err != nil {
				return err
			}
			if err := vm.KVMUsable(cache); err != nil {
				return fmt.Errorf("no hardware acceleration for auto to pick a VM (use --backend vm for TCG): %w", err)
			}
			return nil
		},
		make: func() (backend.Backend, error) {
			cache, err := console.CacheDir()
			if err != nil {
				return nil, err
			}
			return vm.New(cache, vm.WithLogger(logger(""))), nil
		},
	})
}

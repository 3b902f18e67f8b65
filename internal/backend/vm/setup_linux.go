package vm

import (
	"context"
	"fmt"
	"io"
	"time"
)

// Setup provisions everything the vm backend needs into the cache (fetching the
// kernel package when it is not there) and reports what it found to w: what `virtx
// setup vm` runs. A second run finds everything cached.
func Setup(ctx context.Context, cache string, w io.Writer) error {
	start := time.Now()
	if n := reap(cache); n > 0 {
		fmt.Fprintf(w, "reaped %d run directories of killed servers\n", n)
	}
	var p provisioner
	a, err := p.Provision(ctx, cache, true, func(msg string, args ...any) {
		fmt.Fprintln(w, append([]any{msg}, args...)...)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "qemu       %s\nvirtiofsd  %s\nkernel     %s (%s)\nmodules    %d\ninitramfs  %s\n",
		a.QEMU, a.Virtiofsd, a.Kernel.Vmlinux, a.Kernel.Version, len(a.Kernel.Modules), a.Initramfs)
	if err := networkAvailable(); err != nil {
		fmt.Fprintf(w, "network    none for network:true sessions (%v)\n", err)
	} else {
		fmt.Fprintln(w, "network    slirp4netns")
	}
	if err := KVMUsable(cache); err != nil {
		fmt.Fprintf(w, "accel      tcg (%v)\n", err)
	} else {
		fmt.Fprintln(w, "accel      kvm")
	}
	fmt.Fprintf(w, "ready in %v\n", time.Since(start).Round(time.Millisecond))
	return nil
}

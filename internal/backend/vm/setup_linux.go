package vm

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

// Setup provisions everything the vm backend needs into the cache (fetching the
// kernel package when it is not there, and building the guest kernel when opts ask)
// and reports what it found to w: what `virtx setup vm` runs. A second run finds
// everything cached.
func Setup(ctx context.Context, cache string, w io.Writer, opts SetupOptions) error {
	start := time.Now()
	if n := reap(cache); n > 0 {
		fmt.Fprintf(w, "reaped %d run directories of killed servers\n", n)
	}
	logf := func(msg string, args ...any) {
		fmt.Fprintln(w, append([]any{msg}, args...)...)
	}
	if os.Getenv("VIRTX_KERNEL") == "" {
		// The fetched kernel is always there: it is what a boot falls back to when the
		// built one is gone.
		if _, err := cachedKernel(cache); err != nil {
			if _, err := fetchKernel(ctx, cache, logf); err != nil {
				return err
			}
		}
		pruneKernelLayouts(cache)
		if opts.BuildKernel {
			if _, err := BuildKernel(ctx, cache, logf); err != nil {
				return err
			}
		}
	}
	var p provisioner
	a, err := p.Provision(ctx, cache, true, logf)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "qemu       %s\nvirtiofsd  %s\nkernel     %s (%s)\nmodules    %d\ninitramfs  %s\n",
		a.QEMU, a.Virtiofsd, a.Kernel.Vmlinux, a.Kernel.Version, len(a.Kernel.Modules), a.Initramfs)
	if p, err := exec.LookPath("mkfs.erofs"); err != nil {
		fmt.Fprintln(w, "mkfs.erofs none: sessions on OCI images need it (apt-get install erofs-utils)")
	} else {
		fmt.Fprintf(w, "mkfs.erofs %s\n", p)
	}
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

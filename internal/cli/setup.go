package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/internal/backend/vm"
)

func init() {
	extraCommands = append(extraCommands, newSetup)
}

func newSetup() *cobra.Command {
	setup := &cobra.Command{
		Use:   "setup",
		Short: "Fetch and check what a backend needs",
	}
	var opts vm.SetupOptions
	setupVM := &cobra.Command{
		Use:   "vm",
		Short: "Fetch the guest kernel and build the guest's initramfs for --backend vm",
		Long: `Fetch the Debian cloud kernel package (apt-get download linux-image-cloud-amd64's
kernel), extract its PVH vmlinux and the modules a guest needs into the cache directory,
build the guest's initramfs, and check QEMU and virtiofsd. Repeat runs find it all cached.
Needs: apt-get install qemu-system-x86 (and apt-get update for the kernel package).
$VIRTX_KERNEL names another kernel.

--build-kernel also builds a kernel configured for the guest from Debian's kernel source
(linux-source and the build tools, installed with apt-get when missing; a few minutes,
once per source version). Every later boot prefers it: it boots in about a third of the
cloud kernel's time under TCG, with every driver built in.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cache, err := console.CacheDir()
			if err != nil {
				return err
			}
			if err := vm.Setup(cmd.Context(), cache, cmd.OutOrStdout(), opts); err != nil {
				return fmt.Errorf("setup vm: %w", err)
			}
			return nil
		},
	}
	setupVM.Flags().BoolVar(&opts.BuildKernel, "build-kernel", false, "also build the guest kernel from Debian's kernel source (minutes, once; boots faster)")
	setup.AddCommand(setupVM)
	return setup
}

package cli

import (
	"encoding/json"
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/internal/backend/vm"
	"virtx.dev/virtx/internal/hostcheck"
)

func init() { extraCommands = append(extraCommands, newDoctor) }

// doctorHost is the host doctor checks (tests substitute a fake one).
var doctorHost = hostcheck.Local

// vmKernelCheck says which guest kernel the vm backend would boot, from the cache.
func vmKernelCheck() hostcheck.Result {
	r := hostcheck.Result{Name: "vm kernel", Need: hostcheck.NeedVM, Status: hostcheck.OK}
	cache, err := console.CacheDir()
	if err != nil {
		r.Status, r.Detail, r.Fix = hostcheck.Missing, err.Error(), "set VIRTX_HOME to a writable directory"
		return r
	}
	var ok bool
	r.Detail, ok, r.Fix = vm.KernelStatus(cache)
	if !ok {
		r.Status = hostcheck.Missing
	}
	return r
}

func newDoctor() *cobra.Command {
	var strict, asJSON bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Print what this host supports for virtx's backends, and how to fix what is missing",
		Long: `Check what this host offers virtx's boundaries: namespaces and user namespaces,
cgroups (version, controllers, whether this user may write them), overlayfs, FUSE, erofs,
pasta/slirp4netns, bwrap, KVM, QEMU, the vm backend's guest kernel and the cache directory. Each line is OK or MISSING;
under a MISSING one is the exact fix (a Debian package, a sysctl, a command).

KVM is checked without booting a guest (/dev/kvm, the CPU's vmx/svm flags, KVM_CREATE_VM):
real acceleration is only confirmed by a probe boot.

Exit status: 0; with --strict, 1 when something the sandbox backend needs is missing (the
backend auto uses wherever hardware virtualisation does not work).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h := doctorHost()
			rs := append(h.All(), vmKernelCheck())
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rs); err != nil {
					return err
				}
			} else {
				kernel := h.Kernel
				if kernel == "" {
					kernel = "unknown"
				}
				fmt.Fprintf(out, "virtx doctor: %s/%s, kernel %s, running as uid %d\n\n", runtime.GOOS, h.GOARCH, kernel, h.Euid)
				hostcheck.Write(out, rs)
			}
			if strict && len(hostcheck.MissingFor(rs, hostcheck.NeedSandbox)) > 0 {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&strict, "strict", false, "exit 1 when something the default (sandbox) backend needs is missing")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the checks as JSON")
	return cmd
}

package cli

import (
	"github.com/spf13/cobra"

	"virtx.dev/virtx/internal/guest"
)

func init() {
	extraCommands = append(extraCommands, func() *cobra.Command {
		return &cobra.Command{
			Use:    "__guest-init",
			Short:  "Be /init of a vm backend guest (internal)",
			Hidden: true,
			Args:   cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				return guest.Main()
			},
		}
	})
}

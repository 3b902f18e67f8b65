package cli

import (
	"github.com/spf13/cobra"

	"virtx.dev/virtx/internal/backend/sandbox"
)

func init() { extraCommands = append(extraCommands, newSandboxInit) }

// newSandboxInit is the hidden command a sandbox's PID 1 runs: the sandbox backend starts
// this same binary as `virtx __sandbox-init` inside the namespaces it made.
func newSandboxInit() *cobra.Command {
	return &cobra.Command{
		Use:                sandbox.InitCommand,
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return sandbox.RunInit(args)
		},
	}
}

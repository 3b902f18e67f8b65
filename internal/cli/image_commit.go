package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

func init() {
	imageSubcommands = append(imageSubcommands, newImageCommit)
}

// newImageCommit turns a session's snapshot (the layer tar `snapshot` answers) into an
// image on top of the image the session ran on, which `virtx image export` then writes as
// an archive podman or docker can load.
func newImageCommit() *cobra.Command {
	return &cobra.Command{
		Use:   "commit BASE SNAPSHOT [REF]",
		Short: "Make an image of a session's snapshot on top of the image it ran on",
		Long: `Make an image of a session's snapshot on top of its base image.

BASE is the ref or digest the session ran on; SNAPSHOT is the layer tar its snapshot
method answered (a file, or - for stdin). REF names the new image. The digest is printed;
` + "`virtx image export`" + ` writes it as an archive that podman load and docker load read.`,
		Args: cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			s, err := openImageStore(ctx, cmd)
			if err != nil {
				return err
			}
			var layer io.Reader = cmd.InOrStdin()
			if args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				layer = f
			}
			ref := ""
			if len(args) == 3 {
				ref = args[2]
			}
			info, err := s.Commit(ctx, args[0], layer, ref)
			if err != nil {
				return fmt.Errorf("commit: %w", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), info.Digest)
			return nil
		},
	}
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"virtx.dev/virtx/image"
	"virtx.dev/virtx/internal/store"
	"virtx.dev/virtx/protocol"
)

func init() { extraCommands = append(extraCommands, newImageCmd) }

// imageStepRunner supplies the RUN-step runner of `virtx image build`: a session backend
// that can run `sh -c` on an image's layers. nil until a backend provides one (the
// sandbox integration); until then a Dockerfile with RUN fails with store.ErrNoStepRunner.
// The returned func releases what the runner holds.
var imageStepRunner func(ctx context.Context) (store.StepRunner, func(), error)

// openImageStore opens the store in the cache dir, with progress on stderr.
func openImageStore(ctx context.Context, cmd *cobra.Command) (*store.Store, error) {
	return store.Open(ctx, "", store.WithProgress(cmd.ErrOrStderr()), store.WithLogger(logger("")))
}

func newImageCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Manage images: build, pull, ls, rm, import, export, commit",
		Long: `Manage the images sessions run on, kept in the cache dir's image store.

Images are named as docker names them (alpine:3.20 is docker.io/library/alpine:3.20).
Registry mirrors: $` + store.MirrorsEnv + ` or <cache>/` + store.MirrorsFile + `, as
REGISTRY=URL pairs, e.g. docker.io=http://127.0.0.1:5000 (tried in order, then the
registry itself). Credentials come from ~/.docker/config.json.`,
	}
	cmd.AddCommand(newImageBuild(), newImagePull(), newImageLs(), newImageRm(), newImageImport(), newImageExport())
	for _, mk := range imageSubcommands {
		cmd.AddCommand(mk())
	}
	return cmd
}

// imageSubcommands are `virtx image` commands added by other files of this package.
var imageSubcommands []func() *cobra.Command

func ctxOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

func newImageBuild() *cobra.Command {
	var file, tag string
	cmd := &cobra.Command{
		Use:   "build [-f Dockerfile] [-t REF] [CONTEXT]",
		Short: "Build an image from a Dockerfile (FROM, RUN, COPY, ENV, WORKDIR)",
		Long: `Build an image from a one-stage Dockerfile: FROM, then RUN, COPY, ENV and WORKDIR.
COPY sources are relative to CONTEXT (default: the current directory). Steps already
built are taken from the build cache. Progress goes to stderr; the image's digest to
stdout.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			bctx := "."
			if len(args) == 1 {
				bctx = args[0]
			}
			display := file
			if file == "" {
				file, display = filepath.Join(bctx, "Dockerfile"), "Dockerfile"
			}
			f, err := os.Open(file)
			if err != nil {
				return fmt.Errorf("image build: %w", err)
			}
			recipe, err := image.ParseDockerfile(f, display)
			f.Close()
			if err != nil {
				return err
			}
			s, err := openImageStore(ctx, cmd)
			if err != nil {
				return err
			}
			opts := store.BuildOptions{Ref: tag, Context: bctx, Out: cmd.ErrOrStderr()}
			if imageStepRunner != nil && hasRun(recipe.Steps) {
				r, release, err := imageStepRunner(ctx)
				if err != nil {
					return fmt.Errorf("image build: %w", err)
				}
				defer release()
				opts.Runner = r
			}
			info, err := s.Build(ctx, recipe, opts)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), info.Digest)
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", "the Dockerfile (default: CONTEXT/Dockerfile)")
	cmd.Flags().StringVarP(&tag, "tag", "t", "", "name the image REF (name[:tag])")
	return cmd
}

func hasRun(steps []protocol.Step) bool {
	for _, s := range steps {
		if s.Kind == protocol.StepRun {
			return true
		}
	}
	return false
}

func newImagePull() *cobra.Command {
	return &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from a registry (or its mirror)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			s, err := openImageStore(ctx, cmd)
			if err != nil {
				return err
			}
			info, err := s.Pull(ctx, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", image.Familiar(args[0]), info.Digest)
			return nil
		},
	}
}

func newImageLs() *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			s, err := openImageStore(ctx, cmd)
			if err != nil {
				return err
			}
			list, err := s.List(ctx)
			if err != nil {
				return err
			}
			if quiet {
				for _, in := range list {
					fmt.Fprintln(cmd.OutOrStdout(), in.Digest)
				}
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 8, 3, ' ', 0)
			fmt.Fprintln(tw, "REPOSITORY\tTAG\tDIGEST\tSIZE")
			for _, in := range list {
				short := strings.TrimPrefix(in.Digest, "sha256:")[:12]
				refs := in.Refs
				if len(refs) == 0 {
					refs = []string{"<none>"}
				}
				for _, r := range refs {
					repo, tag := r, "<none>"
					if i := strings.LastIndex(r, "@"); i >= 0 {
						repo = r[:i]
					} else if i := strings.LastIndex(r, ":"); i > strings.LastIndex(r, "/") {
						repo, tag = r[:i], r[i+1:]
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", repo, tag, short, humanBytes(in.Size))
				}
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print digests only")
	return cmd
}

func humanBytes(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fGB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fMB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fkB", float64(n)/1e3)
	}
	return fmt.Sprintf("%dB", n)
}

func newImageRm() *cobra.Command {
	return &cobra.Command{
		Use:     "rm REF|DIGEST…",
		Aliases: []string{"remove", "rmi"},
		Short:   "Remove images (a ref untags; the image goes with its last ref) and collect what nothing uses",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			s, err := openImageStore(ctx, cmd)
			if err != nil {
				return err
			}
			var errs []error
			for _, a := range args {
				if err := s.Remove(ctx, a); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), "Removed:", a)
			}
			return errors.Join(errs...)
		},
	}
}

func newImageImport() *cobra.Command {
	return &cobra.Command{
		Use:   "import SOURCE [REF]",
		Short: "Import an image: a rootfs directory or tarball, a docker save archive, or an OCI layout or archive",
		Long: `Import an image from SOURCE, for hosts without a registry:

  a directory holding an OCI image layout (it has an oci-layout file)
  any other directory: a root filesystem, as one layer
  a docker save archive, or an OCI archive (podman save --format oci-archive)
  any other tar, plain, gzip or zstd: a root filesystem

REF names the image; without it the archive's own name is kept. The digest is printed.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			s, err := openImageStore(ctx, cmd)
			if err != nil {
				return err
			}
			ref := ""
			if len(args) == 2 {
				ref = args[1]
			}
			info, err := s.Import(ctx, args[0], ref)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), info.Digest)
			return nil
		},
	}
}

func newImageExport() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "export REF|DIGEST [-o FILE]",
		Aliases: []string{"save"},
		Short:   "Export an image as an OCI archive (podman load and docker load read it)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			s, err := openImageStore(ctx, cmd)
			if err != nil {
				return err
			}
			var w io.Writer = cmd.OutOrStdout()
			if output != "" && output != "-" {
				f, err := os.CreateTemp(filepath.Dir(output), ".virtx-export-*")
				if err != nil {
					return err
				}
				defer os.Remove(f.Name())
				if err := s.Export(ctx, args[0], f); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
				os.Chmod(f.Name(), 0o644)
				return os.Rename(f.Name(), output)
			}
			if f, ok := w.(*os.File); ok && isCharDevice(f) {
				return fmt.Errorf("image export: refusing to write an archive to a terminal: use -o FILE or redirect")
			}
			return s.Export(ctx, args[0], w)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write to FILE instead of stdout")
	return cmd
}

// isCharDevice reports whether f is a terminal (or another character device).
func isCharDevice(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/backend/host"
	"virtx.dev/virtx/internal/server"
)

// backends lists what `--backend` accepts; auto picks the strongest boundary this host
// can give.
var backendNames = []string{"auto", "host"}

func pickBackend(name string) (backend.Backend, error) {
	switch name {
	case "auto", "host":
		return host.New(host.WithSubreaper()), nil
	}
	return nil, fmt.Errorf("unknown backend %q (want one of %v)", name, backendNames)
}

func newServe() *cobra.Command {
	var backendName, logLevel string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the Headless Console Protocol on stdin/stdout",
		Long: `Serve one session over stdin/stdout: length-prefixed BSON JSON-RPC 2.0.
Logs go to stderr only; stdout carries frames and nothing else.

Backends: host (commands run on this machine, no isolation); auto (default) picks the
strongest boundary this host supports.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := pickBackend(backendName)
			if err != nil {
				return err
			}
			log := logger(logLevel)
			srv := server.New(b, server.WithLogger(log))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
			go func() {
				sig := <-sigs
				log.Warn("signal: ending the session", "signal", sig)
				srv.Abort()
				os.Exit(128 + int(sig.(syscall.Signal)))
			}()
			growPipe(os.Stdin)
			growPipe(os.Stdout)
			log.Debug("serving", "backend", b.Name())
			return srv.Serve(ctx, os.Stdin, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&backendName, "backend", "auto", "where commands run: auto, host")
	cmd.Flags().StringVar(&logLevel, "log-level", "", "debug, info, warn or error (default $VIRTX_LOG, else warn)")
	return cmd
}

package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/linux"
	"virtx.dev/virtx/internal/server"
)

// backendFactory makes a backend for `virtx serve`. Each backend registers its own in
// its own file of this package (backend_host.go, …).
type backendFactory struct {
	name string
	// rank orders backends for auto: the highest that is available wins.
	rank int
	// available says whether this host can run the backend at all when asked for it by
	// name (nil: always), and if not why.
	available func() error
	// autoOK says whether auto may pick it (nil: when available): a VM under software
	// emulation runs when asked for, but auto must not choose it.
	autoOK func() error
	make   func() (backend.Backend, error)
}

var backendFactories = map[string]backendFactory{}

func registerBackend(f backendFactory) { backendFactories[f.name] = f }

func backendNames() []string {
	names := []string{"auto"}
	for n := range backendFactories {
		names = append(names, n)
	}
	sort.Strings(names[1:])
	return names
}

// pickBackend resolves a --backend name; auto takes the strongest available boundary.
func pickBackend(name string) (backend.Backend, error) {
	if name == "auto" {
		var best *backendFactory
		for _, f := range backendFactories {
			check := f.autoOK
			if check == nil {
				check = f.available
			}
			if check != nil && check() != nil {
				continue
			}
			if best == nil || f.rank > best.rank {
				f := f
				best = &f
			}
		}
		if best == nil {
			return nil, fmt.Errorf("no backend is available on this host")
		}
		return best.make()
	}
	f, ok := backendFactories[name]
	if !ok {
		return nil, fmt.Errorf("unknown backend %q (want one of %v)", name, backendNames())
	}
	if f.available != nil {
		if err := f.available(); err != nil {
			return nil, fmt.Errorf("backend %s is not available here: %w", name, err)
		}
	}
	return f.make()
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
			slog.SetDefault(log)
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
			if path := os.Getenv("VIRTX_CPUPROFILE"); path != "" {
				stop, err := startCPUProfile(path)
				if err != nil {
					return err
				}
				defer stop()
			}
			growPipe(os.Stdin)
			growPipe(os.Stdout)
			// Waiting for its client, the server holds little more than its heap.
			trim := linux.NewIdleTrimmer(linux.IdleTrimAfter)
			defer trim.Stop()
			log.Debug("serving", "backend", b.Name())
			return srv.Serve(ctx, trim.Reader(os.Stdin), os.Stdout)
		},
	}
	cmd.Flags().StringVar(&backendName, "backend", "auto", "where commands run: "+strings.Join(backendNames(), ", "))
	cmd.Flags().StringVar(&logLevel, "log-level", "", "debug, info, warn or error (default $VIRTX_LOG, else warn)")
	return cmd
}

// Package cli is the `virtx` command line: thin cobra commands over the library packages.
package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"virtx.dev/virtx/internal/server"
)

// exitError carries a process exit code through cobra.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// Main runs the command line and returns the process's exit code.
func Main(args []string) int {
	switch name := filepath.Base(args[0]); {
	case name == "virtx-uvm" && len(args) == 1:
		args = append(args, "serve") // where the upstream clients look for their server
	case name == "init" && len(args) == 1 && os.Getpid() == 1:
		args = append(args, "__guest-init") // /init of a VM guest's initramfs
	}
	// Packages that log through slog's default logger (cgroup, sandbox) log as this
	// process's logger does: to stderr, at $VIRTX_LOG's level (warn by default).
	slog.SetDefault(logger(""))
	var err error
	if entry, ok := entryPoints[argAt(args, 1)]; ok {
		err = entry(args[2:])
	} else {
		root := newRoot()
		root.SetArgs(args[1:])
		err = root.Execute()
	}
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	default:
		fmt.Fprintln(os.Stderr, "virtx:", err)
		return 125
	}
}

// argAt is args[i], or "" when there is none.
func argAt(args []string, i int) string {
	if i < len(args) {
		return args[i]
	}
	return ""
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "virtx",
		Short:         "Run commands in disposable Linux sessions",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServe(), newRun(), newVersion())
	for _, mk := range extraCommands {
		root.AddCommand(mk())
	}
	return root
}

// extraCommands are added by the files of this package that own them (doctor, image,
// setup…), each in its own init, so a new command touches no shared list.
var extraCommands []func() *cobra.Command

func newVersion() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "virtx", server.Version)
			return nil
		},
	}
}

// logger logs to stderr (stdout is the protocol's) at the level $VIRTX_LOG names
// (debug, info, warn, error; warn when unset).
func logger(level string) *slog.Logger {
	if level == "" {
		level = os.Getenv("VIRTX_LOG")
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		l = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

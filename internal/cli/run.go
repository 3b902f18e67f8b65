package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/protocol"
)

// Exit codes of `virtx run` when the command itself did not run, as docker run has them.
const (
	exitRefused       = 125 // the session could not be made, or the server broke
	exitNotExecutable = 127 // the program was not there
	exitTimedOut      = 124 // killed at --timeout, as timeout(1)
)

type runFlags struct {
	backend, image, memory, disk, workdir string
	mounts, ports                         []string
	network, gpu                          bool
	cpus                                  uint32
	timeout                               time.Duration
}

func newRun() *cobra.Command {
	f := &runFlags{}
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARG…]",
		Short: "Run a command in a disposable session and exit with its code",
		Long: `Run one command in a fresh session and throw the session away.

The command's stdout and stderr are printed as it wrote them and virtx exits with its
exit code (128+N when killed by signal N). When the command did not run: 125 for a
session that could not be made, 127 for a program that is not there, 124 for --timeout.`,
		Example: `  virtx run -- echo hi
  virtx run -v "$PWD:/work" -w /work -- make test
  virtx run --network=false --cpus 2 --memory 1g -- sh -c 'nproc; free -m'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runCommand(cmd.Context(), f, args)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.backend, "backend", "auto", "where commands run: "+strings.Join(backendNames(), ", "))
	fl.StringVar(&f.image, "image", "", "image to run on: a reference (name:tag) or a digest (sha256:…)")
	fl.StringArrayVarP(&f.mounts, "mount", "v", nil, "a host directory in the session: HOST:GUEST[:ro] (repeatable, in order)")
	fl.StringArrayVarP(&f.ports, "publish", "p", nil, "a port into the session: HOST:GUEST, listening on 127.0.0.1:HOST (repeatable)")
	fl.BoolVar(&f.network, "network", true, "give the session a network (--network=false: none at all)")
	fl.Uint32Var(&f.cpus, "cpus", 0, "vCPUs (default: the backend's)")
	fl.StringVar(&f.memory, "memory", "", "memory: MiB, or with a unit (512m, 2g)")
	fl.StringVar(&f.disk, "disk", "", "room for writes: GiB, or with a unit (10g, 512g)")
	fl.BoolVar(&f.gpu, "gpu", false, "give the session a GPU (refused where there is none)")
	fl.DurationVar(&f.timeout, "timeout", 0, "kill the command (and everything it started) after this long, e.g. 30s")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "directory in the session to run the command in")
	return cmd
}

func runCommand(ctx context.Context, f *runFlags, argv []string) error {
	if ctx == nil {
		ctx = context.Background()
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	opts := []console.Option{console.WithServer(self, "serve", "--backend", f.backend)}
	for _, m := range f.mounts {
		hostDir, guest, ro, err := parseVolume(m)
		if err != nil {
			return err
		}
		if ro {
			opts = append(opts, console.WithReadOnlyMount(hostDir, guest))
		} else {
			opts = append(opts, console.WithMount(hostDir, guest))
		}
	}
	if len(f.ports) > 0 {
		opts = append(opts, console.WithPorts(f.ports...))
	}
	if !f.network {
		opts = append(opts, console.WithNetwork(false))
	}
	if f.gpu {
		opts = append(opts, console.WithGPU(true))
	}
	if f.cpus != 0 {
		opts = append(opts, console.WithVCPUs(f.cpus))
	}
	if f.memory != "" {
		mib, err := parseSize(f.memory, 1<<20)
		if err != nil {
			return fmt.Errorf("--memory: %w", err)
		}
		opts = append(opts, console.WithMemoryMiB(mib))
	}
	if f.disk != "" {
		gib, err := parseSize(f.disk, 1<<30)
		if err != nil {
			return fmt.Errorf("--disk: %w", err)
		}
		opts = append(opts, console.WithDiskGiB(gib))
	}
	if f.image != "" {
		src := protocol.ImageSource{Type: protocol.ImageRef, Ref: f.image}
		if strings.HasPrefix(f.image, "sha256:") {
			src = protocol.ImageSource{Type: protocol.ImageDigest, Digest: f.image}
		}
		opts = append(opts, console.WithImage(src))
	}

	c, err := console.Open(ctx, opts...)
	if err != nil {
		return exitWith(err)
	}
	defer c.Close()
	if f.workdir != "" {
		res, err := c.Exec(ctx, []string{"cd", f.workdir})
		if err != nil {
			return exitWith(err)
		}
		if res.Code != 0 {
			os.Stderr.Write(res.Stderr)
			return exitError{exitRefused}
		}
	}
	var execOpts []console.ExecOption
	if f.timeout > 0 {
		execOpts = append(execOpts, console.WithTimeout(f.timeout))
	}
	res, err := c.Exec(ctx, argv, execOpts...)
	if err != nil {
		return exitWith(err)
	}
	os.Stdout.Write(res.Stdout)
	os.Stderr.Write(res.Stderr)
	if res.Truncated {
		fmt.Fprintln(os.Stderr, "virtx: output truncated: the command wrote more than the session keeps")
	}
	c.Close()
	if res.Code != 0 {
		return exitError{int(res.Code)}
	}
	return nil
}

// exitWith prints why the command did not run and picks docker's exit code for it.
func exitWith(err error) error {
	fmt.Fprintln(os.Stderr, "virtx:", err)
	code, _ := protocol.CodeOf(err)
	switch {
	case code == protocol.CodeNotExecutable:
		return exitError{exitNotExecutable}
	case code == protocol.CodeTimedOut:
		return exitError{exitTimedOut}
	case errors.Is(err, context.Canceled):
		return exitError{130}
	}
	return exitError{exitRefused}
}

// parseVolume reads docker's -v HOST:GUEST[:ro|rw]; HOST may be relative.
func parseVolume(s string) (hostDir, guest string, ro bool, err error) {
	parts := strings.Split(s, ":")
	if n := len(parts); n == 3 && (parts[2] == "ro" || parts[2] == "rw") {
		ro = parts[2] == "ro"
		parts = parts[:2]
	}
	if len(parts) != 2 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") {
		return "", "", false, fmt.Errorf("--mount %q: want HOST:GUEST[:ro] with an absolute GUEST path", s)
	}
	hostDir, err = filepath.Abs(parts[0])
	if err != nil {
		return "", "", false, fmt.Errorf("--mount %q: %w", s, err)
	}
	return hostDir, parts[1], ro, nil
}

// parseSize reads a number with an optional unit (k, m, g, t; b for bytes) and returns it
// in multiples of unit; a bare number is already in that unit.
func parseSize(s string, unit uint64) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "ib"), "b")
	mult := unit
	if n := len(t); n > 0 {
		if m, ok := map[byte]uint64{'k': 1 << 10, 'm': 1 << 20, 'g': 1 << 30, 't': 1 << 40}[t[n-1]]; ok {
			mult, t = m, t[:n-1]
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a positive size (e.g. 512m, 2g)", s)
	}
	bytes := n * mult
	if bytes/mult != n || bytes%unit != 0 {
		return 0, fmt.Errorf("%q is not a whole number of %s", s, unitName(unit))
	}
	return bytes / unit, nil
}

func unitName(unit uint64) string {
	if unit == 1<<30 {
		return "GiB"
	}
	return "MiB"
}

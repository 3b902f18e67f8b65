package conformance

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"virtx.dev/virtx/protocol"
)

// TestRunCLI checks `virtx run`: output as the command wrote it, and its exit code.
func TestRunCLI(t *testing.T) {
	for _, c := range []struct {
		args      []string
		code      int
		stdout    string
		stderrHas string
	}{
		{[]string{"run", "--", "echo", "hi"}, 0, "hi\n", ""},
		{[]string{"run", "--", "sh", "-c", "exit 3"}, 3, "", ""},
		{[]string{"run", "--backend", "host", "--", "sh", "-c", "echo out; echo err >&2; kill -9 $$"}, 137, "out\n", "err"},
		{[]string{"run", "--", "no-such-program-virtx"}, 127, "", "not found"},
		{[]string{"run", "--backend", "host", "--timeout", "200ms", "--", "sleep", "5"}, 124, "", "killed after 200ms"},
		{[]string{"run", "--network=false", "--backend", "host", "--", "true"}, 125, "", "cannot take the network away"},
		{[]string{"run", "--memory", "lots", "--", "true"}, 125, "", "--memory"},
		{[]string{"run", "-v", "relative-no-guest", "--", "true"}, 125, "", "--mount"},
		{[]string{"run", "--backend", "nosuch", "--", "true"}, 125, "", "unknown backend"},
		{[]string{"run", "--backend", "host", "-w", "/", "--", "pwd"}, 0, "/\n", ""},
		{[]string{"run", "--backend", "host", "-w", "/no/such/dir", "--", "pwd"}, 125, "", "no/such/dir"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			cmd := exec.Command(virtxBin, c.args...)
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != c.code || stdout.String() != c.stdout || !strings.Contains(stderr.String(), c.stderrHas) {
				t.Fatalf("exit %d stdout %q stderr %q; want exit %d stdout %q stderr containing %q",
					code, stdout.String(), stderr.String(), c.code, c.stdout, c.stderrHas)
			}
		})
	}
}

// TestVirtxUVMName checks that the binary installed as virtx-uvm serves with no arguments,
// which is where the upstream clients look for their server.
func TestVirtxUVMName(t *testing.T) {
	uvm := filepath.Join(t.TempDir(), "virtx-uvm")
	if err := os.Symlink(virtxBin, uvm); err != nil {
		t.Fatal(err)
	}
	saved := virtxBin
	virtxBin = uvm
	defer func() { virtxBin = saved }()
	p := startPeerArgs(t)
	if v := p.ok(protocol.MethodVersion, nil).(*protocol.VersionResult); v.Version == "" {
		t.Fatal("no version")
	}
}

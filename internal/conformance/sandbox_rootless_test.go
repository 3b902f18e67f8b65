package conformance

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// rootlessChild marks the run of this test binary that TestSandboxRootless starts.
const rootlessChild = "VIRTX_ROOTLESS_CHILD"

// TestSandboxRootless runs the conformance table, the escape suite and the killed-server
// leak test against the sandbox again as an ordinary user (uid and gid 65534, no groups,
// switched to with setpriv from util-linux): rootless sandboxes, in user namespaces.
//
// It runs this very test binary as that user. The binary's TestMain builds virtx with
// `go build`, which the user could not (the module cache is root's), so a stand-in `go`
// first in PATH copies the virtx this run already built.
func TestSandboxRootless(t *testing.T) {
	if os.Getenv(rootlessChild) != "" {
		t.Skip("this is the rootless run")
	}
	requireSandbox(t)
	if os.Geteuid() != 0 {
		t.Skip("already rootless: the suite itself runs rootless here")
	}
	setpriv, err := exec.LookPath("setpriv")
	requirePrereq(t, err == nil, "setpriv", "Debian: util-linux")

	dir, err := os.MkdirTemp("", "virtx-rootless-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"", 0o755}, {"bin", 0o755}, {"tmp", 0o1777}, {"home", 0o755}} {
		p := filepath.Join(dir, d.name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(dir, "home"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyExec(t, self, filepath.Join(dir, "conformance.test"))
	copyExec(t, virtxBin, filepath.Join(dir, "virtx"))
	fakeGo := fmt.Sprintf("#!/bin/sh\n# stands in for `go build -o OUT PKG` in TestMain\n[ \"$1\" = build ] && [ \"$2\" = -o ] && exec cp %s \"$3\"\necho \"fake go: $*\" >&2; exit 1\n", filepath.Join(dir, "virtx"))
	if err := os.WriteFile(filepath.Join(dir, "bin", "go"), []byte(fakeGo), 0o755); err != nil {
		t.Fatal(err)
	}

	argv := []string{setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
		filepath.Join(dir, "conformance.test"), "-test.count=1", "-test.v",
		"-test.run", "^(TestConformance|TestSandboxEscape|TestSandboxKilledServerLeaksNothing|TestSandboxRootlessLimits)$"}
	if st, err := os.Stat("/dev/net/tun"); err == nil && st.Mode().Perm()&0o006 != 0o006 {
		// /dev/net/tun is root's only here (a container's default; Debian's is 0666), and
		// network:true needs it: the run gets one everyone may open, in a mount namespace
		// of its own, so the host's stays as it is.
		tun := filepath.Join(dir, "tun")
		if err := os.Mkdir(tun, 0o755); err != nil {
			t.Fatal(err)
		}
		script := `mount -t tmpfs -o size=4k,mode=0755 tmpfs "$1" && mknod -m 0666 "$1/tun" c 10 200 && mount --bind "$1/tun" /dev/net/tun && shift && exec "$@"`
		argv = append([]string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", tun}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = filepath.Join(dir, "tmp")
	cmd.Env = []string{
		"PATH=" + filepath.Join(dir, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin",
		"TMPDIR=" + filepath.Join(dir, "tmp"),
		"HOME=" + filepath.Join(dir, "home"),
		"VIRTX_HOME=" + filepath.Join(dir, "home", "cache"),
		"VIRTX_CONFORMANCE_BACKENDS=sandbox",
		rootlessChild + "=1",
		// This user gets no cgroup limits on a v1 host: sessions that ask for none run
		// without (TestSandboxRootlessLimits checks the refusal without it).
		sandboxNoLimitsEnv + "=1",
		"CI=" + os.Getenv("CI"),
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the rootless run failed (%v):\n%s", err, out)
	}
	if !strings.Contains(string(out), "PASS") {
		t.Fatalf("the rootless run did not pass:\n%s", out)
	}
	if testing.Verbose() {
		t.Logf("rootless run:\n%s", out)
	}
}

func copyExec(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

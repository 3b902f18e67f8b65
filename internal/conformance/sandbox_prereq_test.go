package conformance

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// requireSandbox skips (fails in CI) where this host cannot make sandboxes, naming why.
func requireSandbox(t testing.TB) {
	t.Helper()
	out, err := exec.Command(virtxBin, "serve", "--backend", "sandbox").CombinedOutput()
	if err != nil && strings.Contains(string(out), "not available here") {
		if os.Getenv("CI") == "true" {
			t.Fatalf("prerequisite missing in CI: the sandbox backend: %s", out)
		}
		t.Skipf("prerequisite missing: the sandbox backend: %s", out)
	}
}

package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"virtx.dev/virtx/internal/hostcheck"
	"virtx.dev/virtx/internal/linux/cgroup"
)

// doctorOn runs `virtx doctor ARGS…` against host and returns its output and exit code.
func doctorOn(t *testing.T, host *hostcheck.Host, args ...string) (string, int) {
	t.Helper()
	old := doctorHost
	doctorHost = func() *hostcheck.Host { return host }
	t.Cleanup(func() { doctorHost = old })
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetArgs(append([]string{"doctor"}, args...))
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &ee):
		return out.String(), ee.code
	}
	t.Fatalf("doctor %v: %v", args, err)
	return "", 0
}

// bareHost has nothing: no files, no programs, every probe failing.
func bareHost(t *testing.T) *hostcheck.Host {
	dir := t.TempDir()
	return &hostcheck.Host{
		Proc: dir, Dev: dir, Sys: dir, Modules: dir, Euid: 1000, Kernel: "6.1.0", GOARCH: "amd64",
		LookPath:        func(string) (string, error) { return "", exec.ErrNotFound },
		DetectCgroups:   func() cgroup.Info { return cgroup.Info{Reason: "no cgroup filesystem is mounted"} },
		FindCacheDir:    func() (string, error) { return dir, nil },
		Writable:        func(string) bool { return true },
		FreeSpace:       func(string) (uint64, error) { return 10 << 30, nil },
		ProbeNamespaces: func(bool) error { return errors.New("operation not permitted") },
		ProbeKVM:        func(string) (int, error) { return 0, errors.New("no") },
	}
}

func TestDoctorExitCodes(t *testing.T) {
	h := bareHost(t)
	out, code := doctorOn(t, h)
	if code != 0 {
		t.Errorf("doctor on a bare host exited %d, want 0 without --strict", code)
	}
	for _, w := range []string{"running as uid 1000", "MISSING  cgroups", "fix (needed by the sandbox backend)",
		"apt-get install passt", "sandbox backend: cannot run here"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if _, code := doctorOn(t, h, "--strict"); code != 1 {
		t.Errorf("doctor --strict with the sandbox's needs missing exited %d, want 1", code)
	}
	out, code = doctorOn(t, h, "--json")
	var rs []hostcheck.Result
	if err := json.Unmarshal([]byte(out), &rs); err != nil || code != 0 || len(rs) == 0 {
		t.Errorf("--json: %v, code %d, %d results:\n%s", err, code, len(rs), out)
	}
}

func TestDoctorStrictPassesWhenOnlyOptionalThingsAreMissing(t *testing.T) {
	h := bareHost(t)
	h.Euid = 0
	h.ProbeNamespaces = func(bool) error { return nil }
	h.DetectCgroups = func() cgroup.Info {
		return cgroup.Info{Version: 2, Controllers: []string{"cpu", "memory", "pids"}, Writable: true, Root: "/sys/fs/cgroup/virtx"}
	}
	h.LookPath = func(p string) (string, error) {
		if p == "pasta" {
			return "/usr/bin/pasta", nil
		}
		return "", exec.ErrNotFound
	}
	if err := os.WriteFile(filepath.Join(h.Proc, "filesystems"), []byte("nodev\toverlay\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := doctorOn(t, h, "--strict")
	if code != 0 || !strings.Contains(out, "sandbox backend: everything it needs is here") || !strings.Contains(out, "MISSING  kvm") {
		t.Errorf("--strict exited %d with only the vm's and optional things missing:\n%s", code, out)
	}
}

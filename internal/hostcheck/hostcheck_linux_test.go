package hostcheck

import (
	"os"
	"strings"
	"testing"
)

// need fails under CI=true and skips otherwise, naming what is missing.
func need(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("missing prerequisite: %s", what)
	}
	t.Skipf("missing prerequisite: %s", what)
}

// The checks on this machine: each agrees with what the machine has.
func TestLocalAgreesWithThisHost(t *testing.T) {
	t.Setenv("VIRTX_HOME", t.TempDir())
	h := Local()
	rs := h.All()
	for _, r := range rs {
		t.Logf("%-8s %-18s %s  %s", r.Status, r.Name, r.Detail, r.Fix)
		if r.Name == "" || (r.Status != OK && r.Status != Missing) || (r.Status == Missing && r.Fix == "") {
			t.Errorf("malformed %+v", r)
		}
	}
	byName := map[string]Result{}
	for _, r := range rs {
		byName[r.Name] = r
	}
	fsys, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		t.Fatal(err)
	}
	if hasOverlay := strings.Contains(string(fsys), "\toverlay\n"); hasOverlay != (byName["overlayfs"].Status == OK) && h.Euid == 0 {
		t.Errorf("overlay in /proc/filesystems = %v, check says %s", hasOverlay, byName["overlayfs"].Status)
	}
	if r := byName["cache dir"]; r.Status != OK || !strings.Contains(r.Detail, os.Getenv("VIRTX_HOME")) {
		t.Errorf("cache dir with VIRTX_HOME=%s: %+v", os.Getenv("VIRTX_HOME"), r)
	}
	if _, err := os.Stat("/dev/kvm"); err == nil && h.Euid == 0 {
		if r := byName["kvm"]; !strings.Contains(r.Detail, "KVM_CREATE_VM") && !strings.Contains(r.Detail, "ioctl") {
			t.Errorf("/dev/kvm is here but the kvm check did not try it: %+v", r)
		}
	}
}

// The probes, for real.
func TestProbeNamespacesAsRoot(t *testing.T) {
	need(t, os.Geteuid() == 0, "root")
	if err := probeNamespaces(false); err != nil {
		t.Errorf("probe as root: %v", err)
	}
	if err := probeNamespaces(true); err != nil {
		t.Errorf("probe with a user namespace: %v", err)
	}
}

func TestProbeKVM(t *testing.T) {
	_, err := os.Stat("/dev/kvm")
	need(t, err == nil && os.Geteuid() == 0, "/dev/kvm and root")
	api, err := probeKVM("/dev/kvm")
	t.Logf("KVM API %d, KVM_CREATE_VM: %v", api, err)
	if api != 12 {
		t.Errorf("KVM_GET_API_VERSION = %d, want 12 (every KVM since 2.6.22)", api)
	}
	if _, err := probeKVM("/dev/null"); err == nil {
		t.Error("probing /dev/null as KVM succeeded")
	}
}

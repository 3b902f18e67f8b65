package vm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMissingConfig(t *testing.T) {
	frag := "## a comment\nCONFIG_A=y\nCONFIG_B=y\nCONFIG_S=\"-virtx\"\nCONFIG_N=64\n\nCONFIG_GONE=y\n"
	config := "CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_S=\"-virtx\"\nCONFIG_N=32\nCONFIG_EXTRA=y\n"
	got := missingConfig(frag, config)
	want := []string{"CONFIG_B=y", "CONFIG_N=64", "CONFIG_GONE=y"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("missingConfig = %v, want %v", got, want)
	}
	if m := missingConfig(frag, "CONFIG_A=y\nCONFIG_B=y\nCONFIG_S=\"-virtx\"\nCONFIG_N=64\nCONFIG_GONE=y\n"); len(m) != 0 {
		t.Fatalf("a config with everything: %v", m)
	}
}

// TestGuestKernelConfig: the shipped fragment sets every option once, and only to y or
// a value (the base is allnoconfig, so "=n" would say nothing).
func TestGuestKernelConfig(t *testing.T) {
	seen := map[string]bool{}
	for i, line := range strings.Split(guestKernelConfig, "\n") {
		if line == "" || strings.HasPrefix(line, "##") {
			continue
		}
		if strings.HasPrefix(line, "#") {
			t.Errorf("line %d: %q: a single # reads as a Kconfig line (\"# CONFIG_X is not set\"); comments start with ##", i+1, line)
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(k, "CONFIG_") || v == "" || v == "n" {
			t.Errorf("line %d: %q", i+1, line)
		}
		if seen[k] {
			t.Errorf("line %d: %s set twice", i+1, k)
		}
		seen[k] = true
	}
	for _, need := range []string{"CONFIG_PVH", "CONFIG_VIRTIO_MMIO", "CONFIG_VIRTIO_CONSOLE", "CONFIG_VIRTIO_BLK",
		"CONFIG_VIRTIO_NET", "CONFIG_VIRTIO_FS", "CONFIG_OVERLAY_FS", "CONFIG_EROFS_FS", "CONFIG_EXT4_FS",
		"CONFIG_CGROUP_PIDS", "CONFIG_DEVTMPFS", "CONFIG_BLK_DEV_INITRD", "CONFIG_SERIAL_8250_CONSOLE", "CONFIG_HZ_250"} {
		if !seen[need] {
			t.Errorf("%s is not in the fragment: the guest's /init needs it", need)
		}
	}
}

func TestVersionLess(t *testing.T) {
	for _, c := range []struct {
		a, b string
		less bool
	}{{"6.1", "6.12", true}, {"6.12", "6.1", false}, {"5.10", "6.1", true}, {"6.1", "6.1", false}, {"6.1", "6.1.1", true}} {
		if got := versionLess(c.a, c.b); got != c.less {
			t.Errorf("versionLess(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

// TestProvisionPrefersBuiltKernel: with both a fetched and a built kernel in the cache,
// ProvisionKernel answers the built one (no modules), and the fetched one without it.
func TestProvisionPrefersBuiltKernel(t *testing.T) {
	t.Setenv("VIRTX_KERNEL", "")
	cache := t.TempDir()
	kd := kernelDir(cache)
	fetched := filepath.Join(kd, "6.1.0-cloud-amd64")
	built := filepath.Join(builtKernelDir(cache), builtKernelName("6.1.192-3"))
	for _, d := range []string{fetched, built} {
		if err := os.MkdirAll(filepath.Join(d, "modules"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "vmlinux"), fakeVmlinux(true, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(fetched, "modules", "order.txt"), []byte("virtio_mmio.ko\n"), 0o644)
	os.WriteFile(filepath.Join(built, "modules", "order.txt"), nil, 0o644)
	os.WriteFile(filepath.Join(kd, currentFile), []byte(filepath.Base(fetched)+"\n"), 0o644)
	noop := func(string, ...any) {}

	k, err := ProvisionKernel(context.Background(), cache, false, noop)
	if err != nil || k.Version != filepath.Base(fetched) || len(k.Modules) != 1 || !k.StripSignatures {
		t.Fatalf("without a built kernel: %+v, %v", k, err)
	}
	if d, ok, _ := KernelStatus(cache); !ok || !strings.Contains(d, "cloud kernel "+filepath.Base(fetched)) {
		t.Errorf("KernelStatus without a built kernel: %q %v", d, ok)
	}
	os.WriteFile(filepath.Join(builtKernelDir(cache), currentFile), []byte(filepath.Base(built)+"\n"), 0o644)
	k, err = ProvisionKernel(context.Background(), cache, false, noop)
	if err != nil || k.Version != filepath.Base(built) || len(k.Modules) != 0 {
		t.Fatalf("with a built kernel: %+v, %v", k, err)
	}
	if d, ok, _ := KernelStatus(cache); !ok || !strings.Contains(d, "built for the guest: "+filepath.Base(built)) {
		t.Errorf("KernelStatus with a built kernel: %q %v", d, ok)
	}
	// A pointer to a kernel that is gone falls back to the fetched one.
	os.RemoveAll(built)
	if k, err = ProvisionKernel(context.Background(), cache, false, noop); err != nil || k.Version != filepath.Base(fetched) {
		t.Fatalf("a dangling pointer: %+v, %v", k, err)
	}
}

// TestBuiltKernel: the kernel `virtx setup vm --build-kernel` built is in the cache and
// bootable by PVH, with its configuration as guest-kernel.config asks. In CI it must be
// there (.ci/run builds it); elsewhere the test skips naming the command.
func TestBuiltKernel(t *testing.T) {
	cache := os.Getenv("VIRTX_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "virtx")
	}
	k, err := builtKernel(cache)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no built guest kernel in %s (CI runs `virtx setup vm --build-kernel` first): %v", cache, err)
		}
		t.Skipf("no built guest kernel in %s: run `virtx setup vm --build-kernel`: %v", cache, err)
	}
	b, err := os.ReadFile(k.Vmlinux)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPVH(b); err != nil {
		t.Fatal(err)
	}
	config, err := os.ReadFile(filepath.Join(filepath.Dir(k.Vmlinux), "config"))
	if err != nil {
		t.Fatal(err)
	}
	if m := missingConfig(guestKernelConfig, string(config)); len(m) > 0 {
		t.Fatalf("the built kernel's config lacks %v", m)
	}
	if len(k.Modules) != 0 {
		t.Fatalf("the built kernel comes with modules: %v", k.Modules)
	}
}

func TestPruneKernelLayouts(t *testing.T) {
	cache := t.TempDir()
	for _, d := range []string{"kernel", "kernel2", "kernel" + kernelLayout, "kernel-built", "kernelfoo"} {
		if err := os.MkdirAll(filepath.Join(cache, "vm", d, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pruneKernelLayouts(cache)
	ents, _ := os.ReadDir(filepath.Join(cache, "vm"))
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{"kernel-built", "kernel" + kernelLayout, "kernelfoo"}; strings.Join(left, ",") != strings.Join(want, ",") {
		t.Fatalf("left %v, want %v", left, want)
	}
}

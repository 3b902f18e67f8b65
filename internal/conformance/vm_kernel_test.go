package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"virtx.dev/virtx/protocol"
)

// TestVMKernels: a session boots on the kernel built for the guest when the cache has
// one (`virtx setup vm --build-kernel`, which CI runs), and on Debian's cloud kernel with
// its modules (erofs's too, for an image) when VIRTX_KERNEL names it: both paths the
// backend has stay working.
func TestVMKernels(t *testing.T) {
	requireVM(t)
	cache := vmCache(t)
	uname := func(t *testing.T) string {
		p := startPeer(t, "vm")
		p.init(&protocol.InitParams{})
		r := p.exec("uname", "-r")
		if r.Code != 0 {
			t.Fatalf("uname -r: %+v", r)
		}
		return strings.TrimSpace(string(r.Stdout))
	}
	t.Run("built", func(t *testing.T) {
		if os.Getenv("VIRTX_KERNEL") != "" {
			t.Skip("VIRTX_KERNEL names the kernel")
		}
		if _, err := os.Stat(filepath.Join(cache, "vm", "kernel-built", "current")); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("no built guest kernel (CI runs `virtx setup vm --build-kernel`): %v", err)
			}
			t.Skipf("no built guest kernel: run `virtx setup vm --build-kernel`: %v", err)
		}
		if got := uname(t); !strings.HasSuffix(got, "-virtx") {
			t.Fatalf("uname -r = %q, want the built kernel (…-virtx)", got)
		}
	})
	t.Run("cloud", func(t *testing.T) {
		cur, err := os.ReadFile(filepath.Join(cache, "vm", vmKernelDir, "current"))
		if err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("no fetched guest kernel (CI runs `virtx setup vm`): %v", err)
			}
			t.Skipf("no fetched guest kernel: run `virtx setup vm`: %v", err)
		}
		t.Setenv("VIRTX_KERNEL", filepath.Join(cache, "vm", vmKernelDir, strings.TrimSpace(string(cur))))
		// One boot, on an OCI image: the modules for the disks, the share and the root,
		// and erofs's, loaded only for an image's disk.
		reg := newImgRegistry(t)
		vmImageEnv(t, reg)
		ref := reg.push(t, "virtx-test/three:1", threeLayerImage(t))
		p := startPeer(t, "vm")
		p.init(&protocol.InitParams{Image: refImage(ref), Network: boolp(false)})
		if got := p.sh("cat /opt/data/new; uname -r"); !strings.HasPrefix(got, "new\n") || !strings.HasSuffix(got, "-cloud-amd64\n") {
			t.Fatalf("a session on an image with the cloud kernel: %q, want the image's file and Debian's cloud kernel", got)
		}
	})
}

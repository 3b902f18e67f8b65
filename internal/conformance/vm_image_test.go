package conformance

import (
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// vmKernelDir is where the usual cache keeps the fetched guest kernel (the vm backend's
// kernelDir: its layout number changes when the guest needs other modules).
const vmKernelDir = "kernel3"

// vmImageEnv is imageEnv (a cache of the test's own, the in-process registry as Docker
// Hub's mirror) for vm servers: the guest kernel is taken from the usual cache when it
// has one (VIRTX_KERNEL: the built one, else the fetched), so the fresh cache fetches
// none. Images need mkfs.erofs.
func vmImageEnv(t testing.TB, r *imgRegistry) string {
	t.Helper()
	requireVM(t)
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		msg := "mkfs.erofs is missing (the vm backend's image disks): apt-get install erofs-utils"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if os.Getenv("VIRTX_KERNEL") == "" {
		// The kernel a server of the usual cache boots: the built one, else the fetched.
		for _, dir := range []string{"kernel-built", vmKernelDir} {
			if cur, err := os.ReadFile(filepath.Join(vmCache(t), "vm", dir, "current")); err == nil {
				setenv(t, "VIRTX_KERNEL", filepath.Join(vmCache(t), "vm", dir, strings.TrimSpace(string(cur))))
				break
			}
		}
	}
	return imageEnv(t, r)
}

// imageErofs is the one erofs the vm backend has made in cache (its path, inode and
// content hash); it fails the test unless there is exactly one.
func imageErofs(t testing.TB, cache string) (string, uint64, [32]byte) {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(cache, "images", "derived", "*", "*.erofs"))
	if len(m) != 1 {
		t.Fatalf("want one image erofs in the cache, found %v", m)
	}
	b, err := os.ReadFile(m[0])
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(m[0])
	return m[0], fi.Sys().(*syscall.Stat_t).Ino, sha256.Sum256(b)
}

// vmImageCode is the vm backend's answer to an init on an image it cannot find.
func vmImageCode() protocol.Code {
	if os.Geteuid() != 0 {
		return protocol.CodeUnsupportedImage
	}
	return protocol.CodeUnknownImage
}

// TestVMImage: a VM session on a pulled 3-layer image sees the image's files (a
// whiteout, an opaque directory, a directory replaced by a file), its ENV and its
// WORKDIR; its writes survive a stop; the image (its erofs disk, the layers) is
// read-only to the guest however it tries; a second server's session uses the same
// erofs; a snapshot on the image comes back; an unknown digest is -32012 naming it;
// removing the image removes its erofs, and the sessions on it keep running.
func TestVMImage(t *testing.T) {
	reg := newImgRegistry(t)
	cache := vmImageEnv(t, reg)
	ref := reg.push(t, "virtx-test/three:1", threeLayerImage(t))

	p := startPeer(t, "vm")
	cwd := p.init(&protocol.InitParams{Image: refImage(ref), Network: boolp(false)})
	if cwd != "/opt/data" {
		t.Errorf("init cwd %q, want the image's WORKDIR /opt/data", cwd)
	}
	if got := p.pwd(); got != "/opt/data" {
		t.Errorf("pwd %q", got)
	}
	if got := p.sh(`echo "$GREETING"; echo "$PATH"`); got != "hi there\n/bin\n" {
		t.Errorf("the image's ENV: %q", got)
	}
	for _, c := range []struct{ script, want string }{
		{"cat /etc/hello", "hello\n"},
		{"ls /opt/data", "new\n"},                                       // opaque: the lower's a and sub are gone
		{"test -e /opt/data/sub/b || echo gone", "gone\n"},              // nested lower gone
		{"cat /opt/other", "now a file\n"},                              // a directory replaced by a file
		{"test -e /etc/removeme || echo gone", "gone\n"},                // whiteout
		{"test -e /usr/bin || echo no-host", "no-host\n"},               // nothing of the host image
		{"ls /sys/class/net", "lo\n"},                                   // network off
		{"stat -c %a /tmp", "1777\n"},                                   // the image's own modes
		{"cat /etc/hostname", "virtx\n"},                                // the session's /etc files
		{"busybox mount | grep -c ' / '", "1\n"},                        // one root
		{"echo mine > /opt/data/mine && rm /etc/hello; echo $?", "0\n"}, // writable as usual
	} {
		if got := p.sh(c.script); got != c.want {
			t.Errorf("%s: %q, want %q", c.script, got, c.want)
		}
	}
	// The image is one erofs in the cache, and one read-only disk in the guest.
	erofs, ino, sum := imageErofs(t, cache)
	dev := strings.TrimSpace(p.sh(`for d in /sys/block/vd*; do [ "$(cat $d/serial)" = virtx-image ] && echo /dev/${d##*/}; done`))
	if got := p.sh("cat /sys/block/" + strings.TrimPrefix(dev, "/dev/") + "/ro"); dev == "" || got != "1\n" {
		t.Errorf("the image's disk %q: ro %q", dev, got)
	}
	// The guest is root in its own kernel: it makes the disk writable, writes over it,
	// mounts it again read-write and writes into it; the host side refuses.
	p.exec("sh", "-c", "busybox blockdev --setrw "+dev+"; echo poke | busybox dd of="+dev+" bs=4096 seek=1 conv=notrunc,fsync; "+
		"mkdir -p /mnt/img && busybox mount -t erofs "+dev+" /mnt/img; busybox mount -o remount,rw /mnt/img; echo x > /mnt/img/bin/poke; echo x >> /mnt/img/etc/hello; busybox setfattr -n trusted.x -v y /mnt/img/etc; sync; true")
	if _, _, after := imageErofs(t, cache); after != sum {
		t.Errorf("the guest changed the image's erofs %s", erofs)
	}
	layers, _ := filepath.Glob(filepath.Join(cache, "images", "layers", "*"))
	if len(layers) != 3 {
		t.Errorf("the store has %d layers: %v", len(layers), layers)
	}
	for _, l := range layers {
		if _, err := os.Stat(filepath.Join(l, "bin", "poke")); err == nil {
			t.Errorf("the guest wrote into the layer %s", l)
		}
		if b, err := os.ReadFile(filepath.Join(l, "etc", "hello")); err == nil && string(b) != "hello\n" {
			t.Errorf("the guest changed the layer %s: %q", l, b)
		}
	}

	// One virtiofsd below the server (the share's, a parent and its child in a PID
	// namespace of their own: two processes; the image is no share), gone at a stop.
	kids := vmChildren(p.cmd.Process.Pid)
	n := 0
	for _, name := range kids {
		if strings.HasPrefix(name, "virtiofsd") {
			n++
		}
	}
	if n != 2 {
		t.Errorf("want one virtiofsd (two processes) below the server, found %v", kids)
	}

	// A stop keeps the session's writes; the next boot is on the same image.
	p.notify(protocol.MethodStop)
	if got := p.sh("cat /opt/data/mine; test -e /etc/hello || echo no-hello; echo $GREETING"); got != "mine\nno-hello\nhi there\n" {
		t.Errorf("after a stop: %q", got)
	}
	waitGone(t, kids, 10*time.Second)

	// A snapshot on the image, given to init on the same image, is the writes again.
	blob := p.ok(protocol.MethodSnapshot, nil).(*protocol.SnapshotResult).Blob
	q := startPeer(t, "vm")
	q.init(&protocol.InitParams{Image: refImage(ref), Snapshot: blob, Network: boolp(false)})
	if got := q.sh("ls /opt/data; test -e /etc/hello || echo no-hello"); got != "mine\nnew\nno-hello\n" {
		t.Errorf("the session on the snapshot sees %q", got)
	}
	if path, ino2, sum2 := imageErofs(t, cache); path != erofs || ino2 != ino || sum2 != sum {
		t.Errorf("the second server made the image's erofs again: %s (inode %d, was %d)", path, ino2, ino)
	}

	// An unknown digest or ref is -32012 naming it; the session stays usable.
	d := "sha256:" + strings.Repeat("1", 64)
	e := q.fails(vmImageCode(), protocol.MethodInit, &protocol.InitParams{Image: digestImage(d)})
	if !strings.Contains(e.Message, d) {
		t.Errorf("message does not name the digest: %q", e.Message)
	}
	e = q.fails(vmImageCode(), protocol.MethodInit, &protocol.InitParams{Image: refImage("docker.io/virtx-test/none:1")})
	if !strings.Contains(e.Message, "virtx-test/none:1") {
		t.Errorf("message does not name the ref: %q", e.Message)
	}
	if got := q.sh("cat /opt/data/mine"); got != "mine\n" {
		t.Errorf("after refused inits: %q", got)
	}
	// A new init on the host image: the image is gone from the root.
	q.init(&protocol.InitParams{Network: boolp(false)})
	if got := q.sh("test -e /opt/data || echo host; test -d /usr/bin && echo usr"); got != "host\nusr\n" {
		t.Errorf("the host image after an image session: %q", got)
	}

	// Removing the image removes its erofs from the cache; p's session, still on the
	// image, keeps the file open and runs on, across a stop too.
	if out, err := exec.Command(virtxBin, "image", "rm", ref).CombinedOutput(); err != nil {
		t.Fatalf("virtx image rm: %v: %s", err, out)
	}
	if m, _ := filepath.Glob(filepath.Join(cache, "images", "derived", "*")); len(m) != 0 {
		t.Errorf("the image's erofs outlived the image: %v", m)
	}
	if got := p.sh("cat /opt/data/new"); got != "new\n" {
		t.Errorf("the session on the removed image: %q", got)
	}
	p.notify(protocol.MethodStop)
	if got := p.sh("cat /opt/data/mine /opt/data/new"); got != "mine\nnew\n" {
		t.Errorf("the session on the removed image after a stop: %q", got)
	}
}

// BenchmarkVMColdSessionImage: a cold session (a new server, init, one exec) on the
// cached 3-layer test image against one on the host image, alternated so both see the
// same load; medians.
func BenchmarkVMColdSessionImage(b *testing.B) {
	reg := newImgRegistry(b)
	vmImageEnv(b, reg)
	ref := reg.push(b, "virtx-test/three:1", threeLayerImage(b))
	warm := startPeer(b, "vm")
	warm.init(&protocol.InitParams{Image: refImage(ref), Network: boolp(false)})
	warm.exec("true")
	cold := func(params *protocol.InitParams) time.Duration { return coldSession(b, "vm", params) }
	var onImage, onHost []time.Duration
	for b.Loop() {
		onImage = append(onImage, cold(&protocol.InitParams{Image: refImage(ref), Network: boolp(false)}))
		onHost = append(onHost, cold(&protocol.InitParams{Network: boolp(false)}))
	}
	b.ReportMetric(float64(median(onImage).Milliseconds()), "ms-median-image")
	b.ReportMetric(float64(median(onHost).Milliseconds()), "ms-median-host")
}

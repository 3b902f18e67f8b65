package conformance

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// vmImageEnv is imageEnv (a cache of the test's own, the in-process registry as Docker
// Hub's mirror) for vm servers: the guest kernel is taken from the usual cache when it
// has one (VIRTX_KERNEL), so the fresh cache fetches none.
func vmImageEnv(t testing.TB, r *imgRegistry) string {
	t.Helper()
	requireVM(t)
	if cur, err := os.ReadFile(filepath.Join(vmCache(t), "vm", "kernel2", "current")); err == nil && os.Getenv("VIRTX_KERNEL") == "" {
		setenv(t, "VIRTX_KERNEL", filepath.Join(vmCache(t), "vm", "kernel2", strings.TrimSpace(string(cur))))
	}
	return imageEnv(t, r)
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
// WORKDIR; its writes survive a stop; the layers are read-only to the guest however it
// tries; a snapshot on the image comes back; an unknown digest is -32012 naming it.
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
	// The guest is root in its own kernel: it mounts the image's share again and tries
	// to write into the layers; the host side refuses.
	p.exec("sh", "-c", "mkdir -p /mnt/img && busybox mount -t virtiofs virtx-img /mnt/img; echo x > /mnt/img/2/bin/poke; echo x >> /mnt/img/1/etc/hello; busybox setfattr -n trusted.x -v y /mnt/img/1/etc; true")
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

	// Two virtiofsd below the server (the share's and the image's, each a parent and
	// its child in a PID namespace of their own: four processes), gone at a stop.
	kids := vmChildren(p.cmd.Process.Pid)
	n := 0
	for _, name := range kids {
		if strings.HasPrefix(name, "virtiofsd") {
			n++
		}
	}
	if n != 4 {
		t.Errorf("want two virtiofsd (four processes) below the server, found %v", kids)
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

package store

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"virtx.dev/virtx/protocol"
)

func resolveRef(t testing.TB, s *Store, ref string) *Image {
	t.Helper()
	im, err := s.Resolve(context.Background(), refSource(ref), nil)
	must(t, err)
	t.Cleanup(im.Release)
	return im
}

func TestImportRootfsDir(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	must(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "bin/busybox"), busybox(t), 0o755))
	must(t, os.Symlink("busybox", filepath.Join(root, "bin/sh")))
	must(t, os.Symlink("busybox", filepath.Join(root, "bin/cat")))
	must(t, os.WriteFile(filepath.Join(root, "etc/os-release"), []byte("ID=test\n"), 0o644))
	s := openStore(t, t.TempDir())
	info, err := s.Import(context.Background(), root, "rootfs:1")
	must(t, err)
	if !slices.Equal(info.Refs, []string{"rootfs:1"}) {
		t.Errorf("info %+v", info)
	}
	im := resolveRef(t, s, "rootfs:1")
	mnt := mountImage(t, im)
	out, err := exec.Command("chroot", mnt, "/bin/sh", "-c", "cat /etc/os-release").CombinedOutput()
	if err != nil || string(out) != "ID=test\n" {
		t.Errorf("sh in the imported rootfs: %q %v", out, err)
	}
}

func TestImportRootfsTarball(t *testing.T) {
	requireRoot(t)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(layerTar(t, dir("etc"), file("etc/hello", "tarball\n")))
	zw.Close()
	p := filepath.Join(t.TempDir(), "rootfs.tar.gz")
	must(t, os.WriteFile(p, gz.Bytes(), 0o644))
	s := openStore(t, t.TempDir())
	_, err := s.Import(context.Background(), p, "tarball:1")
	must(t, err)
	im := resolveRef(t, s, "tarball:1")
	if got := readFile(t, filepath.Join(im.Lowers[0], "etc/hello")); got != "tarball\n" {
		t.Errorf("etc/hello = %q", got)
	}
}

func TestImportDockerArchive(t *testing.T) {
	requireRoot(t)
	img := threeLayers(t)
	tag, err := name.NewTag("example.com/saved/img:2")
	must(t, err)
	p := filepath.Join(t.TempDir(), "saved.tar")
	must(t, tarball.WriteToFile(p, tag, img))
	s := openStore(t, t.TempDir())
	info, err := s.Import(context.Background(), p, "")
	must(t, err)
	if !slices.Equal(info.Refs, []string{"example.com/saved/img:2"}) {
		t.Errorf("info %+v, want the archive's name", info)
	}
	im := resolveRef(t, s, "example.com/saved/img:2")
	if im.Config.WorkingDir != "/opt/data" || len(im.Lowers) != 3 {
		t.Errorf("config %+v, lowers %v", im.Config, im.Lowers)
	}
	// The archive's plain layers are stored plain: same diff_ids as the image it came from.
	cf, _ := img.ConfigFile()
	for i, l := range im.Layers {
		if l.DiffID != cf.RootFS.DiffIDs[i].String() {
			t.Errorf("layer %d: diff_id %s, want %s", i, l.DiffID, cf.RootFS.DiffIDs[i])
		}
	}
}

func TestImportOCILayout(t *testing.T) {
	requireRoot(t)
	img := threeLayers(t)
	other := testImage(t, nil, "/", layerTar(t, file("other", "o\n")))
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	must(t, err)
	must(t, lp.AppendImage(img, layout.WithAnnotations(map[string]string{"io.containerd.image.name": "docker.io/library/three:1"})))
	must(t, lp.AppendImage(other, layout.WithAnnotations(map[string]string{annotationRef: "docker.io/library/other:1"}), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "riscv64"})))
	s := openStore(t, t.TempDir())
	info, err := s.Import(context.Background(), dir, "three:1")
	must(t, err)
	if info.Digest != digestOf(t, img) {
		t.Errorf("imported %s, want %s", info.Digest, digestOf(t, img))
	}
	info, err = s.Import(context.Background(), dir, "other:1")
	must(t, err)
	if info.Digest != digestOf(t, other) {
		t.Errorf("imported %s, want %s", info.Digest, digestOf(t, other))
	}
}

// TestExportImport exports an image as an OCI archive and imports it into another store.
func TestExportImport(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	img := threeLayers(t)
	ref := reg.push(t, "t/three:1", img)
	s := openStore(t, t.TempDir())
	resolveRef(t, s, ref)
	p := filepath.Join(t.TempDir(), "out.tar")
	f, err := os.Create(p)
	must(t, err)
	must(t, s.Export(context.Background(), ref, f))
	must(t, f.Close())
	s2 := openStore(t, t.TempDir())
	info, err := s2.Import(context.Background(), p, "")
	must(t, err)
	if info.Digest != digestOf(t, img) || !slices.Equal(info.Refs, []string{reg.host() + "/t/three:1"}) {
		t.Errorf("round trip: %+v", info)
	}
	// By digest, too; and an unknown one is refused.
	var buf bytes.Buffer
	must(t, s.Export(context.Background(), info.Digest, &buf))
	if err := s.Export(context.Background(), "sha256:"+strings.Repeat("0", 64), &buf); err == nil {
		t.Errorf("exporting an unknown digest worked")
	}
}

// podman runs podman with its state in dir: vfs storage (no overlay-on-overlay, no
// fuse-overlayfs needed), cgroupfs and file events (no systemd on this host).
func podman(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	conf := filepath.Join(dir, "containers.conf")
	os.WriteFile(conf, []byte("[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n"), 0o644)
	cmd := exec.Command("podman", append([]string{
		"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "run"),
		"--storage-driver", "vfs", "--tmpdir", filepath.Join(dir, "tmp"),
	}, args...)...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+conf, "CONTAINERS_REGISTRIES_CONF=/dev/null", "TMPDIR="+filepath.Join(dir, "tmp"))
	os.MkdirAll(filepath.Join(dir, "tmp"), 0o755)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestExportPodmanLoad: an exported image loads into podman and runs there.
func TestExportPodmanLoad(t *testing.T) {
	requireRoot(t)
	_, err := exec.LookPath("podman")
	requirePrereq(t, err == nil, "podman", "apt-get install podman")
	s := openStore(t, t.TempDir())
	bctx := t.TempDir()
	must(t, os.WriteFile(filepath.Join(bctx, "msg"), []byte("from virtx\n"), 0o644))
	reg := newRegistry(t)
	base := reg.push(t, "t/three:1", threeLayers(t))
	_, err = s.Build(context.Background(), &protocol.Recipe{Base: base, Steps: []protocol.Step{copyStep("msg", "/msg")}}, BuildOptions{Context: bctx, Ref: "virtx-export-test:1"})
	must(t, err)
	p := filepath.Join(t.TempDir(), "img.tar")
	f, err := os.Create(p)
	must(t, err)
	must(t, s.Export(context.Background(), "virtx-export-test:1", f))
	must(t, f.Close())

	dir := t.TempDir()
	t.Cleanup(func() { podman(t, dir, "system", "reset", "--force") })
	out, err := podman(t, dir, "load", "-i", p)
	if err != nil {
		t.Fatalf("podman load: %v\n%s", err, out)
	}
	t.Logf("podman load: %s", strings.TrimSpace(out))
	out, err = podman(t, dir, "images", "--format", "{{.Repository}}:{{.Tag}}")
	if err != nil || !strings.Contains(out, "virtx-export-test:1") {
		t.Errorf("podman images: %v\n%s", err, out)
	}
	out, err = podman(t, dir, "image", "inspect", "--format", "{{.Config.WorkingDir}} {{.Config.Env}}", "docker.io/library/virtx-export-test:1")
	if err != nil || !strings.Contains(out, "/opt/data") || !strings.Contains(out, "GREETING=hi there") {
		t.Errorf("podman inspect: %v\n%s", err, out)
	}
}

// TestCommitSnapshot: a session's change (an overlay upper dir written as a layer, as a
// snapshot is) committed on its base becomes an image that runs and exports.
func TestCommitSnapshot(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	ref := reg.push(t, "t/three:1", threeLayers(t))
	s := openStore(t, t.TempDir())
	ctx := context.Background()
	base := resolveRef(t, s, ref)
	var snap bytes.Buffer
	layer, err := (&scriptRunner{t: t}).RunStep(ctx, base.Lowers, []string{"PATH=/bin"}, "/", "rm /etc/hello; echo note > /note", io.Discard)
	must(t, err)
	io.Copy(&snap, layer)
	info, err := s.Commit(ctx, base.Digest, &snap, "snap:1")
	must(t, err)
	im := resolveRef(t, s, "snap:1")
	if im.Digest != info.Digest || len(im.Lowers) != 4 {
		t.Fatalf("snapshot image %+v", im)
	}
	mnt := mountImage(t, im)
	if _, err := os.Stat(filepath.Join(mnt, "etc/hello")); err == nil {
		t.Errorf("etc/hello survived the snapshot's rm")
	}
	if got := readFile(t, filepath.Join(mnt, "note")); got != "note\n" {
		t.Errorf("note = %q", got)
	}
	var buf bytes.Buffer
	must(t, s.Export(ctx, "snap:1", &buf))
	if _, err := s.Commit(ctx, "nope:1", &buf, ""); err == nil {
		t.Errorf("commit on an unknown base worked")
	}
}

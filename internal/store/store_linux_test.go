package store

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/protocol"
)

func refSource(ref string) *protocol.ImageSource {
	return &protocol.ImageSource{Type: protocol.ImageRef, Ref: ref}
}

func TestPullResolve(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	img := threeLayers(t)
	ref := reg.push(t, "test/three:1", img)
	dir := t.TempDir()
	s := openStore(t, dir)
	ctx := context.Background()

	im, err := s.Resolve(ctx, refSource(ref), nil)
	must(t, err)
	defer im.Release()
	if want := digestOf(t, img); im.Digest != want {
		t.Errorf("digest %s, want %s", im.Digest, want)
	}
	if len(im.Lowers) != 3 {
		t.Fatalf("lowers %v, want 3", im.Lowers)
	}
	if got := readFile(t, filepath.Join(im.Lowers[1], "etc/hello")); got != "hello\n" {
		t.Errorf("etc/hello = %q", got)
	}
	if fi, err := os.Stat(filepath.Join(im.Lowers[2], "bin/busybox")); err != nil || fi.Mode()&0o111 == 0 {
		t.Errorf("bin/busybox in the bottom layer: %v %v", fi, err)
	}
	want := Config{Env: []string{"PATH=/bin", "GREETING=hi there"}, WorkingDir: "/opt/data"}
	if diff := cmp.Diff(want, im.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	// The whiteout conversion: a 0/0 device and the opaque xattr.
	var st unix.Stat_t
	must(t, unix.Lstat(filepath.Join(im.Lowers[0], "etc/removeme"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("etc/removeme in the top layer: mode %o rdev %d, want a 0/0 char device", st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(im.Lowers[0], "opt/data"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("opt/data opaque xattr: %q %v", buf[:n], err)
	}
	list, err := s.List(ctx)
	must(t, err)
	wantRef := reg.host() + "/test/three:1"
	if len(list) != 1 || list[0].Digest != im.Digest || !slices.Equal(list[0].Refs, []string{wantRef}) {
		t.Errorf("list = %+v", list)
	}

	// A second session on it, from this store and from a fresh one on the same directory
	// (another process), asks the registry nothing.
	before := reg.requests.Load()
	im2, err := s.Resolve(ctx, refSource(ref), nil)
	must(t, err)
	im2.Release()
	im3, err := openStore(t, dir).Resolve(ctx, refSource(ref), nil)
	must(t, err)
	im3.Release()
	im4, err := s.Resolve(ctx, &protocol.ImageSource{Type: protocol.ImageDigest, Digest: im.Digest}, nil)
	must(t, err)
	im4.Release()
	if n := reg.requests.Load() - before; n != 0 {
		t.Errorf("second resolve made %d registry requests, want 0", n)
	}
	if !slices.Equal(im3.Lowers, im.Lowers) {
		t.Errorf("lowers differ: %v vs %v", im3.Lowers, im.Lowers)
	}
}

// TestWhiteouts stacks the unpacked lowers in a real overlay mount and checks what a
// session sees: a deleted base file, a base directory replaced by an opaque one, a
// directory replaced by a file.
func TestWhiteouts(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	ref := reg.push(t, "test/three:1", threeLayers(t))
	s := openStore(t, t.TempDir())
	im, err := s.Resolve(context.Background(), refSource(ref), nil)
	must(t, err)
	defer im.Release()
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(im.Lowers, ":")); err != nil {
		requirePrereq(t, false, "an overlay mount: "+err.Error(), "a kernel with overlayfs, as root")
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })

	const absent, isDir = "<absent>", "<dir>"
	for _, tc := range []struct {
		path, want string
	}{
		{"etc/hello", "hello\n"},      // untouched base file
		{"etc/removeme", absent},      // deleted by a whiteout
		{"opt/data", isDir},           // replaced by an opaque directory…
		{"opt/data/a", absent},        // …so the base's files are gone
		{"opt/data/sub", absent},      // and its subdirectories
		{"opt/data/new", "new\n"},     // and only the new one is there
		{"opt/other", "now a file\n"}, // a directory replaced by a file
		{"opt/other/c", absent},       // (nothing below it)
		{"bin/busybox", "<exe>"},      // the bottom layer shows through
	} {
		t.Run(tc.path, func(t *testing.T) {
			p := filepath.Join(mnt, tc.path)
			fi, err := os.Lstat(p)
			switch {
			case tc.want == absent:
				if err == nil {
					t.Errorf("present (%v), want absent", fi.Mode())
				}
			case err != nil:
				t.Errorf("%v, want %q", err, tc.want)
			case tc.want == isDir:
				if !fi.IsDir() {
					t.Errorf("mode %v, want a directory", fi.Mode())
				}
			case tc.want == "<exe>":
				if fi.Mode()&0o111 == 0 {
					t.Errorf("mode %v, want executable", fi.Mode())
				}
			default:
				if got := readFile(t, p); got != tc.want {
					t.Errorf("content %q, want %q", got, tc.want)
				}
			}
		})
	}
	names, _ := os.ReadDir(filepath.Join(mnt, "opt/data"))
	if len(names) != 1 {
		t.Errorf("opt/data has %d entries, want 1 (new)", len(names))
	}
	out, err := exec.Command("chroot", mnt, "/bin/cat", "/etc/hello").CombinedOutput()
	if err != nil || string(out) != "hello\n" {
		t.Errorf("chroot cat: %q %v", out, err)
	}
}

func TestPullByDigestAndPlatform(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	host := testImage(t, []string{"WHICH=host"}, "/", layerTar(t, file("which", "host\n")))
	other := testImage(t, []string{"WHICH=other"}, "/", layerTar(t, file("which", "other\n")))
	otherPlat := v1.Platform{OS: "linux", Architecture: "riscv64"}
	hostPlat := hostPlatform()
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &otherPlat}},
		mutate.IndexAddendum{Add: host, Descriptor: v1.Descriptor{Platform: &hostPlat}},
	)
	ref := reg.host() + "/test/multi:1"
	pushIndex(t, ref, idx)
	idxDigest, err := idx.Digest()
	must(t, err)
	s := openStore(t, t.TempDir())
	ctx := context.Background()
	for _, r := range []string{ref, reg.host() + "/test/multi@" + idxDigest.String(), reg.host() + "/test/multi:1@" + idxDigest.String()} {
		im, err := s.Resolve(ctx, refSource(r), nil)
		must(t, err)
		if want := digestOf(t, host); im.Digest != want {
			t.Errorf("%s: digest %s, want the host platform's %s", r, im.Digest, want)
		}
		if got := readFile(t, filepath.Join(im.Lowers[0], "which")); got != "host\n" {
			t.Errorf("%s: which = %q", r, got)
		}
		im.Release()
	}
	// By the platform manifest's own digest, too.
	before := reg.requests.Load()
	im, err := s.Resolve(ctx, refSource(reg.host()+"/test/multi@"+digestOf(t, host)), nil)
	must(t, err)
	im.Release()
	if n := reg.requests.Load() - before; n != 0 {
		t.Errorf("a digest the store holds made %d requests", n)
	}
}

func TestUnknownImage(t *testing.T) {
	reg := newRegistry(t)
	s := openStore(t, t.TempDir())
	ctx := context.Background()
	d := "sha256:" + strings.Repeat("ab", 32)
	for _, src := range []*protocol.ImageSource{
		{Type: protocol.ImageDigest, Digest: d},
		refSource(reg.host() + "/nope/missing:1"),
	} {
		_, err := s.Resolve(ctx, src, nil)
		if !errors.Is(err, backend.ErrUnknownImage) || !strings.Contains(err.Error(), src.String()) {
			t.Errorf("%s: %v, want ErrUnknownImage naming it", src, err)
		}
	}
	if err := s.Remove(ctx, "nope:1"); !errors.Is(err, backend.ErrUnknownImage) {
		t.Errorf("remove unknown: %v", err)
	}
	s2 := openStore(t, t.TempDir(), WithoutPull())
	if _, err := s2.Resolve(ctx, refSource(reg.host()+"/x/y:1"), nil); !errors.Is(err, backend.ErrUnknownImage) {
		t.Errorf("without pull: %v", err)
	}
}

func TestRemoveAndGC(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	shared := layerTar(t, file("shared", "s\n"))
	a := testImage(t, nil, "", shared, layerTar(t, file("a", "a\n")))
	b := testImage(t, nil, "", shared, layerTar(t, file("b", "b\n")))
	refA, refB := reg.push(t, "t/a:1", a), reg.push(t, "t/b:1", b)
	dir := t.TempDir()
	s := openStore(t, dir)
	ctx := context.Background()
	imA, err := s.Resolve(ctx, refSource(refA), nil)
	must(t, err)
	imA.Release()
	imB, err := s.Resolve(ctx, refSource(refB), nil)
	must(t, err)
	layers := func() int { e, _ := os.ReadDir(filepath.Join(s.Root(), "layers")); return len(e) }
	blobs := func() int { e, _ := os.ReadDir(filepath.Join(s.Root(), "blobs/sha256")); return len(e) }
	if layers() != 3 || blobs() != 7 { // 3 layers; 2 manifests + 2 configs + 3 layers
		t.Fatalf("layers %d blobs %d, want 3 and 7", layers(), blobs())
	}
	// A second name for A; removing one name keeps the image.
	_, err = s.Commit(ctx, imA.Digest, strings.NewReader(string(layerTar(t, file("c", "c\n")))), "t/c:1")
	must(t, err)
	must(t, s.Remove(ctx, "t/c:1"))
	must(t, s.Remove(ctx, refA))
	if layers() != 2 || blobs() != 4 {
		t.Errorf("after removing a: layers %d blobs %d, want 2 and 4", layers(), blobs())
	}
	if _, err := os.Stat(filepath.Join(imB.Lowers[1], "shared")); err != nil {
		t.Errorf("the shared layer went: %v", err)
	}
	// b is in use by a session: removing it drops it from the index, but its layers stay
	// until the session releases them.
	must(t, s.Remove(ctx, imB.Digest))
	if list, _ := s.List(ctx); len(list) != 0 {
		t.Errorf("list after removing everything: %+v", list)
	}
	if layers() != 2 {
		t.Errorf("layers of a running session were collected")
	}
	imB.Release()
	st, err := s.GC(ctx)
	must(t, err)
	if layers() != 0 || blobs() != 0 || st.Layers != 2 {
		t.Errorf("after release: layers %d blobs %d (stats %+v), want none", layers(), blobs(), st)
	}
	if err := s.Remove(ctx, refB); !errors.Is(err, backend.ErrUnknownImage) {
		t.Errorf("removing again: %v", err)
	}
}

func TestMirrors(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	img := testImage(t, []string{"A=1"}, "/", layerTar(t, file("alpine-release", "3.20\n")))
	reg.push(t, "library/alpine:3.20", img)
	reg.push(t, "hub/library/alpine:3.20", img)
	ctx := context.Background()
	for _, mirror := range []string{reg.URL, reg.URL + "/hub"} {
		s := openStore(t, t.TempDir(), WithMirrors(Mirrors{"docker.io": {mirror}}))
		im, err := s.Resolve(ctx, refSource("alpine:3.20"), nil)
		must(t, err)
		im.Release()
		list, _ := s.List(ctx)
		if len(list) != 1 || !slices.Equal(list[0].Refs, []string{"alpine:3.20"}) {
			t.Errorf("mirror %s: list %+v", mirror, list)
		}
		// The same image under its long names.
		for _, r := range []string{"docker.io/library/alpine:3.20", "library/alpine:3.20", "index.docker.io/library/alpine:3.20"} {
			im, err := s.Resolve(ctx, refSource(r), nil)
			if err != nil || im.Digest != list[0].Digest {
				t.Errorf("%s: %v", r, err)
				continue
			}
			im.Release()
		}
	}
}

func TestParseMirrors(t *testing.T) {
	m, err := ParseMirrors("docker.io=http://127.0.0.1:5000, index.docker.io=https://m.example/hub\n# comment\nghcr.io=http://10.0.0.1:5000 # trailing\n")
	must(t, err)
	want := Mirrors{"docker.io": {"http://127.0.0.1:5000", "https://m.example/hub"}, "ghcr.io": {"http://10.0.0.1:5000"}}
	if diff := cmp.Diff(want, m); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
	for _, bad := range []string{"docker.io", "docker.io=", "=http://x", "docker.io=ftp://x", "docker.io=127.0.0.1:5000"} {
		if _, err := ParseMirrors(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, MirrorsFile), []byte("docker.io=http://file:1\n"), 0o644))
	t.Setenv(MirrorsEnv, "docker.io=http://env:1")
	m, err = LoadMirrors(dir)
	must(t, err)
	if got := m["docker.io"]; !slices.Equal(got, []string{"http://env:1", "http://file:1"}) {
		t.Errorf("env then file: %v", got)
	}
}

package store

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/protocol"
)

// The realistic distro image: one `debootstrap --variant=minbase` root filesystem, made
// once per machine in the cache dir (<cache>/testdata/debootstrap-<suite>-minbase) and
// imported into a fresh store by each run. $VIRTX_DEBIAN_MIRROR and $VIRTX_DEBIAN_SUITE
// choose where from and which release (default http://deb.debian.org/debian, bookworm).
func debootstrapRootfs(t *testing.T) string {
	t.Helper()
	requireRoot(t)
	_, err := exec.LookPath("debootstrap")
	requirePrereq(t, err == nil, "debootstrap", "apt-get install debootstrap")
	cache, err := console.CacheDir()
	must(t, err)
	suite := envOr("VIRTX_DEBIAN_SUITE", "bookworm")
	mirror := envOr("VIRTX_DEBIAN_MIRROR", "http://deb.debian.org/debian")
	dir := filepath.Join(cache, "testdata", "debootstrap-"+suite+"-minbase")
	if _, err := os.Stat(filepath.Join(dir, "etc/os-release")); err == nil {
		return dir
	}
	must(t, os.MkdirAll(filepath.Dir(dir), 0o755))
	l, err := lockPath(context.Background(), dir+".lock", exclusive)
	must(t, err)
	defer l.unlock()
	if _, err := os.Stat(filepath.Join(dir, "etc/os-release")); err == nil {
		return dir // another test run made it while we waited
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", suite, tmp, mirror).CombinedOutput()
	if err != nil {
		os.RemoveAll(tmp)
		tail := string(out)
		if len(tail) > 2000 {
			tail = tail[len(tail)-2000:]
		}
		requirePrereq(t, false, "debootstrap "+suite+" from "+mirror+": "+err.Error()+"\n"+tail, "reach a Debian mirror, or set VIRTX_DEBIAN_MIRROR")
	}
	must(t, os.Rename(tmp, dir))
	t.Logf("debootstrap --variant=minbase %s from %s took %v (once per machine: cached in %s)", suite, mirror, time.Since(start).Round(time.Second), dir)
	return dir
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

// TestDebootstrapImage imports a Debian minbase root filesystem, runs a shell on it and
// builds a step over it.
func TestDebootstrapImage(t *testing.T) {
	rootfs := debootstrapRootfs(t)
	s := openStore(t, t.TempDir())
	ctx := context.Background()
	start := time.Now()
	info, err := s.Import(ctx, rootfs, "debian:minbase")
	must(t, err)
	t.Logf("import of the rootfs (%s): %v", humanSize(info.Size), time.Since(start).Round(time.Millisecond))
	if list, _ := s.List(ctx); len(list) != 1 {
		t.Fatalf("list %+v", list)
	}
	start = time.Now()
	cached, err := s.Resolve(ctx, refSource("debian:minbase"), nil)
	must(t, err)
	cached.Release()
	t.Logf("resolve of the cached image: %v", time.Since(start))
	recipe := &protocol.Recipe{Base: "debian:minbase", Steps: []protocol.Step{
		env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
		run("echo built > /built && dpkg-query -W | wc -l > /packages"),
	}}
	start = time.Now()
	built, err := s.Build(ctx, recipe, BuildOptions{Runner: &scriptRunner{t: t}})
	must(t, err)
	t.Logf("build of one RUN step over it: %v", time.Since(start).Round(time.Millisecond))
	im, err := s.Resolve(ctx, &protocol.ImageSource{Type: protocol.ImageDigest, Digest: built.Digest}, nil)
	must(t, err)
	defer im.Release()
	mnt := mountImage(t, im)
	out, err := exec.Command("chroot", mnt, "/bin/sh", "-c", ". /etc/os-release; echo $ID; cat /built").CombinedOutput()
	if err != nil || string(out) != "debian\nbuilt\n" {
		t.Errorf("shell on the debian image: %q %v", out, err)
	}
	if n := strings.TrimSpace(readFile(t, filepath.Join(mnt, "packages"))); n == "0" || n == "" {
		t.Errorf("dpkg knows %q packages", n)
	}
}

package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHostImage builds the host image from a made-up /etc: what is curated and readable is
// there, secrets are not, and a change on the host gives a new image (the old one is
// collected once no process holds it).
func TestHostImage(t *testing.T) {
	etc := t.TempDir()
	write := func(name, content string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(etc, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write("passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644)
	write("shadow", "root:secret:::::::\n", 0o640)
	write("ssl/openssl.cnf", "cnf\n", 0o644)
	write("ssl/private/key.pem", "KEY\n", 0o600)
	write("ssl/certs/ca.pem", "CA\n", 0o644)
	write("ssl/unreadable", "x\n", 0o600)
	write("real-resolv", "nameserver 192.0.2.1\n", 0o644)
	os.Symlink("ca.pem", filepath.Join(etc, "ssl/certs/abcd.0"))
	os.Symlink(filepath.Join(etc, "real-resolv"), filepath.Join(etc, "resolv.conf"))
	os.Symlink("/usr/share/zoneinfo/Etc/UTC", filepath.Join(etc, "localtime"))
	saved := hostEtc
	hostEtc = etc
	defer func() { hostEtc = saved }()

	cache := t.TempDir()
	img, err := prepareHostImage(cache)
	if err != nil {
		t.Fatal(err)
	}
	got := filepath.Join(img.dir, "etc")
	for _, want := range []string{"passwd", "ssl/openssl.cnf", "ssl/certs/ca.pem", "hostname", "hosts"} {
		if _, err := os.Stat(filepath.Join(got, want)); err != nil {
			t.Errorf("%s is not in the image: %v", want, err)
		}
	}
	for _, never := range []string{"shadow", "ssl/private", "ssl/unreadable", "real-resolv"} {
		if _, err := os.Lstat(filepath.Join(got, never)); err == nil {
			t.Errorf("%s is in the image", never)
		}
	}
	if target, _ := os.Readlink(filepath.Join(got, "ssl/certs/abcd.0")); target != "ca.pem" {
		t.Errorf("a symlink is copied as %q", target)
	}
	if fi, err := os.Lstat(filepath.Join(got, "resolv.conf")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("resolv.conf (a link on the host) is not a file of its own: %v", err)
	} else if b, _ := os.ReadFile(filepath.Join(got, "resolv.conf")); string(b) != "nameserver 192.0.2.1\n" {
		t.Errorf("resolv.conf: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(got, "hostname")); string(b) != Hostname+"\n" {
		t.Errorf("hostname: %q", b)
	}
	if fi, err := os.Stat(filepath.Join(img.dir, "root", "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp of the skeleton: %v %v", fi.Mode(), err)
	}
	var targets []string
	for _, o := range img.overlays {
		targets = append(targets, o.Target)
	}
	if targets[0] != "/" || !strings.Contains(strings.Join(targets, " "), "/usr") || targets[len(targets)-1] != "/etc" {
		t.Errorf("overlays %v", targets)
	}

	// The same host: the same image, found without building.
	again, err := prepareHostImage(cache)
	if err != nil || again.dir != img.dir {
		t.Fatalf("a second prepare: %v, %v", again, err)
	}
	again.close()

	// An edit in place of a file inside a curated directory is a new image. The old one,
	// held by nobody now but used a moment ago, is kept (another virtx build may still
	// want it); once its last use is older than hostImageKeep, the next build removes it.
	time.Sleep(10 * time.Millisecond)
	write("ssl/openssl.cnf", "changed\n", 0o644)
	img.close() // nobody holds the old one now
	next, err := prepareHostImage(cache)
	if err != nil {
		t.Fatal(err)
	}
	next.close()
	if next.dir == img.dir {
		t.Fatal("a changed /etc gave the same image")
	}
	if b, _ := os.ReadFile(filepath.Join(next.dir, "etc/ssl/openssl.cnf")); string(b) != "changed\n" {
		t.Fatalf("the new image has %q", b)
	}
	if _, err := os.Stat(img.dir); err != nil {
		t.Fatalf("the image used a moment ago was collected: %v", err)
	}
	long := time.Now().Add(-hostImageKeep - time.Minute)
	if err := os.Chtimes(filepath.Join(img.dir, "ready"), long, long); err != nil {
		t.Fatal(err)
	}
	write("ssl/openssl.cnf", "changed again\n", 0o644)
	last, err := prepareHostImage(cache)
	if err != nil {
		t.Fatal(err)
	}
	defer last.close()
	if _, err := os.Stat(img.dir); err == nil {
		t.Fatal("the image unused for longer than hostImageKeep was not collected")
	}
	ents, _ := os.ReadDir(filepath.Join(cache, "sandbox"))
	if len(ents) != 2 {
		t.Fatalf("the cache holds %d entries, want the last two images", len(ents))
	}
}

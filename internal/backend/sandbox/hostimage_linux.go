package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// hostImageVersion changes whenever what prepareHostImage builds changes, so a skeleton
// built by an older virtx is never taken for a current one.
const hostImageVersion = "1"

// hostImageKeep is how long an image no process holds is kept after its last use
// (collectHostImages).
const hostImageKeep = time.Hour

// hostDirs are the host's directories the host image shows as they are (read-only
// lowers, each under an overlay of its own). /bin, /sbin and /lib* are symlinks into
// /usr on a merged-/usr host (Debian 12) and then come as those symlinks instead.
var hostDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"}

// etcCurated are the names under the host's /etc the host image copies. Nothing else of
// /etc is there: not shadow, gshadow, sudoers, ssh host keys, machine-id. Within these,
// files not readable by everyone (ssl/private) are left out too.
var etcCurated = []string{
	"passwd", "group", "resolv.conf", "nsswitch.conf", "host.conf", "gai.conf",
	"ld.so.conf", "ld.so.conf.d", "ld.so.cache", "alternatives",
	"ssl", "ca-certificates", "ca-certificates.conf",
	"os-release", "lsb-release", "debian_version", "issue",
	"localtime", "timezone",
	"profile", "profile.d", "bash.bashrc", "environment", "inputrc", "shells", "skel", "login.defs", "adduser.conf",
	"protocols", "services", "networks", "mime.types",
}

// hostEtc is the host's /etc (a test points it elsewhere).
var hostEtc = "/etc"

// etcNever are never copied, whatever a curated directory holds.
var etcNever = map[string]bool{"ssl/private": true}

// generated are files of the host image's /etc that describe the sandbox, not the host.
var generated = map[string]string{
	"hostname": Hostname + "\n",
	"hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t" + Hostname + "\n",
}

// hostImage is the prepared host image: a skeleton of / and a curated /etc in the cache
// directory, and the overlays a boot mounts from them.
type hostImage struct {
	dir      string    // $cache/sandbox/host-KEY
	lock     *os.File  // shared flock on dir/lock, held while this process may boot from it
	overlays []overlay // "/" first
}

func (h *hostImage) close() {
	if h.lock != nil {
		h.lock.Close()
		h.lock = nil
	}
}

// prepareHostImage returns the host image for this host as it is now, building it in
// cacheDir/sandbox when the host changed since the last one was built (or none was):
// the key is a hash of what the image is made from (the curated /etc's names, sizes,
// modes, owners and times, and how /usr, /bin, /lib* stand), so checking it costs a few
// dozen stat calls and no copying. Images of earlier keys that no process holds are
// removed.
func prepareHostImage(cacheDir string) (*hostImage, error) {
	if cacheDir == "" {
		return nil, errors.New("no cache directory: set VIRTX_HOME")
	}
	base := filepath.Join(cacheDir, "sandbox")
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, fmt.Errorf("cache directory: %w (set VIRTX_HOME to a writable directory)", err)
	}
	key, err := hostImageKey()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(base, "host-"+key)
	for attempt := 0; ; attempt++ {
		img, err := openHostImage(dir)
		if err == nil {
			return img, nil
		}
		if attempt > 0 || !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if err := buildHostImage(base, dir); err != nil {
			return nil, err
		}
		collectHostImages(base, dir)
	}
}

// openHostImage takes a shared lock on a built image (a building or collecting process
// holds it exclusively) and checks it is complete.
func openHostImage(dir string) (*hostImage, error) {
	lock, err := os.Open(filepath.Join(dir, "lock"))
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_SH); err != nil {
		lock.Close()
		return nil, fmt.Errorf("host image: flock: %w", err)
	}
	ready := filepath.Join(dir, "ready")
	if _, err := os.Stat(ready); err != nil {
		lock.Close() // collected under us, or never finished
		return nil, err
	}
	now := time.Now()
	os.Chtimes(ready, now, now) // its last use (collectHostImages); a read-only cache keeps the old time
	img := &hostImage{dir: dir, lock: lock}
	img.overlays = append(img.overlays, overlay{Target: "/", Lowers: []string{filepath.Join(dir, "root")}, Sub: "root"})
	for _, d := range hostDirs {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			img.overlays = append(img.overlays, overlay{Target: d, Lowers: []string{d}, Sub: strings.TrimPrefix(d, "/")})
		}
	}
	img.overlays = append(img.overlays, overlay{Target: "/etc", Lowers: []string{filepath.Join(dir, "etc")}, Sub: "etc"})
	return img, nil
}

// hostImageKey hashes what the host image is built from.
func hostImageKey() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "v%s uid %d gid %d\n", hostImageVersion, os.Geteuid(), os.Getegid())
	for _, d := range hostDirs {
		statInto(h, d)
	}
	for _, name := range etcCurated {
		p := filepath.Join(hostEtc, name)
		statInto(h, p)
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() {
			continue
		}
		statBelow(h, p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// statBelow hashes what is below directory p: every directory's own times (a file added,
// removed or replaced by rename — as dpkg and update-alternatives do — changes them) and
// every regular file's (an edit in place). Symlinks change only by replacement, so they
// are listed but not looked at. Entries are taken in the directory's own order, not
// sorted: a directory whose order changed was written to, which its times say anyway.
// (/etc/ssl/certs and /etc/alternatives hold hundreds of links: this is on the path of a
// server's first boot.)
func statBelow(h io.Writer, p string) {
	f, err := os.Open(p)
	if err != nil {
		return
	}
	ents, _ := f.ReadDir(-1)
	f.Close()
	for _, e := range ents {
		if t := e.Type(); t.IsDir() || t.IsRegular() {
			q := p + "/" + e.Name()
			statInto(h, q)
			if t.IsDir() {
				statBelow(h, q)
			}
		}
	}
}

func statInto(w io.Writer, p string) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		fmt.Fprintf(w, "%s -\n", p)
		return
	}
	link := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		link, _ = os.Readlink(p)
	}
	fmt.Fprintf(w, "%s %o %d %d %d %d %d.%d %d.%d %s\n", p, st.Mode, st.Uid, st.Gid, st.Size, st.Ino,
		st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec, link)
}

// buildHostImage builds the image in a directory of its own and renames it into place
// (a concurrent builder's identical result wins the rename).
func buildHostImage(base, dir string) error {
	tmp, err := os.MkdirTemp(base, "build-")
	if err != nil {
		return fmt.Errorf("host image: %w", err)
	}
	defer os.RemoveAll(tmp) // gone after the rename, or a failed build
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("host image: %w", err)
	}
	if err := buildRoot(filepath.Join(tmp, "root")); err != nil {
		return fmt.Errorf("host image: %w", err)
	}
	if err := buildEtc(filepath.Join(tmp, "etc")); err != nil {
		return fmt.Errorf("host image: %w", err)
	}
	for _, f := range []string{"lock", "ready"} {
		if err := os.WriteFile(filepath.Join(tmp, f), nil, 0o644); err != nil {
			return fmt.Errorf("host image: %w", err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, unix.ENOTEMPTY) {
		return fmt.Errorf("host image: %w", err)
	}
	return nil
}

// buildRoot makes the skeleton of /: mount points for the host's directories, /etc and
// the sandbox's own filesystems, the session's writable directories, and /bin, /sbin,
// /lib* as the symlinks they are on the host.
func buildRoot(root string) error {
	dirs := []struct {
		name string
		mode uint32
	}{
		{"", 0o755}, {"etc", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755},
		{"tmp", 0o1777}, {"root", 0o700}, {"run", 0o755}, {"run/lock", 0o1777},
		{"var", 0o755}, {"var/tmp", 0o1777}, {"home", 0o755}, {"mnt", 0o755}, {"srv", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(root, d.name)
		if err := os.Mkdir(p, 0o700); err != nil {
			return err
		}
		if err := unix.Chmod(p, d.mode); err != nil { // not os.Chmod: it drops 0o1000
			return err
		}
	}
	for _, l := range [][2]string{{"var/run", "../run"}, {"var/lock", "../run/lock"}} {
		if err := os.Symlink(l[1], filepath.Join(root, l[0])); err != nil {
			return err
		}
	}
	for _, d := range hostDirs {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
			continue
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(d)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, filepath.Join(root, d)); err != nil {
				return err
			}
		case fi.IsDir():
			if err := os.Mkdir(filepath.Join(root, d), fi.Mode().Perm()); err != nil {
				return err
			}
		}
	}
	return nil
}

// buildEtc copies the curated /etc, and writes the files that describe the sandbox.
func buildEtc(etc string) error {
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(etc, 0o755); err != nil {
		return err
	}
	for _, name := range etcCurated {
		src := filepath.Join(hostEtc, name)
		fi, err := os.Lstat(src)
		if err != nil {
			continue
		}
		if name == "resolv.conf" && fi.Mode()&fs.ModeSymlink != 0 {
			// Often a link into /run (systemd-resolved, resolvconf), which the sandbox
			// does not have: take what it says now.
			b, err := os.ReadFile(src)
			if err != nil {
				continue
			}
			if err := os.WriteFile(filepath.Join(etc, name), b, 0o644); err != nil {
				return err
			}
			continue
		}
		if err := copyEntry(src, filepath.Join(etc, name), name); err != nil {
			return err
		}
	}
	for name, content := range generated {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return os.Symlink("../proc/self/mounts", filepath.Join(etc, "mtab"))
}

// copyEntry copies one file, symlink or directory tree. Only what everyone may read is
// copied: a file without the world-read bit, or a directory without world read and
// search, is left out (with what is below it).
func copyEntry(src, dst, rel string) error {
	if etcNever[rel] {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return nil
	}
	mode := st.Mode & 0o7777
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return nil
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	case unix.S_IFDIR:
		if mode&0o005 != 0o005 {
			return nil
		}
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			return nil
		}
		for _, e := range entries {
			if err := copyEntry(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), rel+"/"+e.Name()); err != nil {
				return err
			}
		}
		if err := unix.Chmod(dst, mode); err != nil {
			return err
		}
	case unix.S_IFREG:
		if mode&0o004 == 0 {
			return nil
		}
		if err := copyFile(src, dst, mode); err != nil {
			return err
		}
	default:
		return nil
	}
	if os.Geteuid() == 0 {
		if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK {
			unix.Chmod(dst, mode) // chown clears set-id bits
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW)
	return nil
}

func copyFile(src, dst string, mode uint32) error {
	in, err := os.Open(src)
	if err != nil {
		return nil // unreadable after all: left out
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return unix.Chmod(dst, mode)
}

// collectHostImages removes images other than keep that no process holds, and build
// directories a killed builder left (older than a minute).
//
// An image used within hostImageKeep is kept too, held or not: two virtx builds whose
// keys differ (a packaged virtx and a development build, or two versions), used in turn
// on one cache, would otherwise each remove the other's image and rebuild its own at
// every first boot (~0.2 s each time).
func collectHostImages(base, keep string) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		p := filepath.Join(base, e.Name())
		switch {
		case strings.HasPrefix(e.Name(), "host-") && p != keep:
			if fi, err := os.Stat(filepath.Join(p, "ready")); err == nil && time.Since(fi.ModTime()) < hostImageKeep {
				continue // used lately
			}
			lock, err := os.Open(filepath.Join(p, "lock"))
			if err != nil {
				os.RemoveAll(p) // never finished
				continue
			}
			if unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
				os.Remove(filepath.Join(p, "ready"))
				os.RemoveAll(p)
			}
			lock.Close()
		case strings.HasPrefix(e.Name(), "build-"):
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Minute {
				os.RemoveAll(p)
			}
		}
	}
}

package vm

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/guest"
)

// hostImageDirs are the host's system directories the host image is made of. Each is
// bound read-only (or, where the host has a symlink such as /bin → usr/bin, the same
// symlink); those the host lacks are left out.
var hostImageDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "opt"}

// hostImageEtc is the curated /etc of the host image: what programs need to resolve
// users, hosts and libraries, trust certificates and know the system. Never
// /etc/shadow, ssh host keys, or anything else with secrets.
var hostImageEtc = []string{
	"passwd", "group", "nsswitch.conf", "ld.so.conf", "ld.so.conf.d", "ld.so.cache",
	"alternatives", "ssl", "ca-certificates", "ca-certificates.conf", "os-release",
	"debian_version", "localtime", "timezone", "profile", "profile.d", "bash.bashrc",
	"environment", "login.defs", "mime.types", "protocols", "services", "inputrc",
	"python3", "perl", "gai.conf", "host.conf", "shells", "issue",
}

// emptyDirs are the mount points and writable places the image has, empty.
var emptyDirs = []struct {
	name string
	perm os.FileMode
}{
	{"root", 0o700}, {"home", 0o755}, {"tmp", 0o1777}, {"var", 0o755}, {"var/tmp", 0o1777},
	{"var/lib", 0o755}, {"var/cache", 0o755}, {"var/log", 0o755}, {"proc", 0o555},
	{"sys", 0o555}, {"dev", 0o755}, {"run", 0o755}, {"mnt", 0o755}, {"srv", 0o755},
	{"media", 0o755},
}

// shareSpec is what one boot's share holds.
type shareSpec struct {
	dir      string // an empty directory on the host; the tmpfs goes over it
	trees    []shareTree
	config   *guest.Config
	snapshot []byte
	// image says the session is on an OCI image, whose root is its erofs disk (not the
	// share's business) under base/; layers are the image's layer directories (top
	// first), read only for the attributes of what base/ puts over them.
	image  bool
	layers []string
}

type shareTree struct {
	host string
	ro   bool
}

// buildShare fills the share's tmpfs. It runs in the spawner's private mount
// namespace: every mount here is seen by virtiofsd and nobody else.
func buildShare(s *shareSpec) error {
	if err := unix.Mount("tmpfs", s.dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", s.dir, err)
	}
	base := filepath.Join(s.dir, guest.ShareBase)
	if err := os.Mkdir(base, 0o755); err != nil {
		return err
	}
	if s.image {
		return buildImageShare(s, base)
	}
	if err := hostImage(base); err != nil {
		return err
	}
	hosts, _ := os.ReadFile("/etc/hosts")
	if len(hosts) == 0 {
		hosts = []byte(defaultHosts)
	}
	resolv := "# no network in this session\n"
	if s.config.Network {
		resolv = "nameserver " + guest.GuestNameserve + "\n"
	}
	if err := etcFiles(filepath.Join(base, "etc"), s.config.Hostname, hosts, resolv); err != nil {
		return err
	}
	return finishShare(s)
}

const defaultHosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

// hostImage fills base with the host image: the host's system dirs bound read-only,
// the empty dirs, and the curated /etc.
func hostImage(base string) error {
	for _, d := range hostImageDirs {
		src := "/" + d
		fi, err := os.Lstat(src)
		if err != nil {
			continue
		}
		dst := filepath.Join(base, d)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, dst); err != nil {
				return err
			}
		case fi.IsDir():
			if err := bindRO(src, dst, true); err != nil {
				return err
			}
		}
	}
	for _, d := range emptyDirs {
		p := filepath.Join(base, d.name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.perm); err != nil {
			return err
		}
	}
	etc := filepath.Join(base, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	for _, name := range hostImageEtc {
		if err := copyTree(filepath.Join("/etc", name), filepath.Join(etc, name)); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("host image /etc/%s: %w", name, err)
		}
	}
	return nil
}

// etcFiles writes the session's hosts (with its host name added), hostname and, when
// resolv is not "", resolv.conf into etc.
func etcFiles(etc, hostname string, hosts []byte, resolv string) error {
	hosts = append(hosts, []byte("127.0.1.1\t"+hostname+"\n")...)
	if err := os.WriteFile(filepath.Join(etc, "hosts"), hosts, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(etc, "hostname"), []byte(hostname+"\n"), 0o644); err != nil {
		return err
	}
	if resolv != "" {
		return os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte(resolv), 0o644)
	}
	return nil
}

// imageMountPoints are what base/ holds over an image's layers: the directories the
// guest mounts on, which an image may lack (an empty directory over the image's own
// merges with it).
var imageMountPoints = []string{"proc", "sys", "dev", "run"}

// buildImageShare fills an image session's share: base/ is only the top lower over
// the image (its erofs disk, which the guest stacks under it) — the mount points and
// the /etc files a session is given (hosts, hostname, and resolv.conf when it has a
// network, as docker gives them).
func buildImageShare(s *shareSpec, base string) error {
	for _, d := range imageMountPoints {
		if err := mkdirLike(s.layers, base, d); err != nil {
			return err
		}
	}
	// etc over the image's: made with the attributes of the image's own, so the merged
	// directory looks as the image made it; not at all where the image's /etc is no
	// directory.
	if fi, found := topEntry(s.layers, "etc"); !found || fi.IsDir() {
		if err := mkdirLike(s.layers, base, "etc"); err != nil {
			return err
		}
		resolv := ""
		if s.config.Network {
			resolv = "nameserver " + guest.GuestNameserve + "\n"
		}
		if err := etcFiles(filepath.Join(base, "etc"), s.config.Hostname, []byte(defaultHosts), resolv); err != nil {
			return err
		}
	}
	return finishShare(s)
}

// topEntry is what the image's topmost layer that has name holds there.
func topEntry(layers []string, name string) (os.FileInfo, bool) {
	for _, l := range layers {
		if fi, err := os.Lstat(filepath.Join(l, name)); err == nil {
			return fi, true
		}
	}
	return nil, false
}

// mkdirLike makes base/name with the mode and owner of the image's own name when it is
// a directory, else 0755 root.
func mkdirLike(layers []string, base, name string) error {
	p := filepath.Join(base, name)
	if err := os.Mkdir(p, 0o755); err != nil {
		return err
	}
	fi, found := topEntry(layers, name)
	if !found || !fi.IsDir() {
		return nil
	}
	if err := os.Chmod(p, fi.Mode()&(fs.ModePerm|fs.ModeSticky|fs.ModeSetuid|fs.ModeSetgid)); err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return os.Lchown(p, int(st.Uid), int(st.Gid))
	}
	return nil
}

// finishShare writes the session's trees, config and snapshot into the share and makes
// it read-only.
func finishShare(s *shareSpec) error {
	trees := filepath.Join(s.dir, guest.ShareTrees)
	if err := os.Mkdir(trees, 0o755); err != nil {
		return err
	}
	for i, t := range s.trees {
		dst := filepath.Join(trees, fmt.Sprint(i))
		if t.ro {
			if err := bindRO(t.host, dst, true); err != nil {
				return err
			}
			continue
		}
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(t.host, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s: %w", t.host, err)
		}
	}
	cfg, err := json.Marshal(s.config)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(s.dir, guest.ShareConfig), cfg, 0o444); err != nil {
		return err
	}
	if s.snapshot != nil {
		if err := os.WriteFile(filepath.Join(s.dir, guest.ShareSnapshot), s.snapshot, 0o444); err != nil {
			return err
		}
	}
	// The tmpfs itself read-only: the guest changes nothing in its image through the
	// share (its writes go to the overlay's upper on its own disk).
	if err := unix.Mount("", s.dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("remount the share read-only: %w", err)
	}
	return nil
}

// bindRO binds src at dst (created) and makes the whole bind, submounts included,
// read-only with mount_setattr, so no write through virtiofsd can reach src.
func bindRO(src, dst string, mkdir bool) error {
	if mkdir {
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(-1, dst, unix.AT_RECURSIVE, attr); err != nil {
		// Kernels before 5.12: the top mount read-only at least.
		if err2 := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err2 != nil {
			return fmt.Errorf("make %s read-only: %w", dst, err2)
		}
	}
	return nil
}

// copyTree copies a file, symlink or directory (recursively), keeping modes.
func copyTree(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return err
		}
		return os.Symlink(t, dst)
	case fi.IsDir():
		if err := os.Mkdir(dst, fi.Mode().Perm()); err != nil {
			return err
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".") && e.Name() != ".profile" {
				continue
			}
			if err := copyTree(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
				return err
			}
		}
		return nil
	case fi.Mode().IsRegular():
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, fi.Mode().Perm())
	}
	return nil
}

//go:build linux

package executor

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// OCI layer whiteout names.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	paxXattr       = "SCHILY.xattr."
)

// overlayXattr reports whether name is one of overlayfs's own xattrs, which
// never go into a layer and are never taken from one.
func overlayXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")
}

// WriteLayer writes the overlayfs upper directory upperDir to w as an OCI
// layer tar: a whiteout device becomes DIR/.wh.NAME, an opaque directory is
// followed by DIR/.wh..wh..opq, hard links become TypeLink entries to the
// first path, and mode, owner, mtime (in whole seconds) and xattrs other
// than overlayfs's own are kept. Entries are written in sorted order, so
// the same tree always gives the same bytes. upperDir itself is not an
// entry. Sockets are left out; a file whose name starts with ".wh." cannot
// be represented and is an error, as is an upper dir made with metacopy or
// redirect_dir on (its files are not whole).
func WriteLayer(w io.Writer, upperDir string) error {
	lw := &layerWriter{tw: tar.NewWriter(w), root: upperDir, links: map[[2]uint64]string{}}
	if err := lw.dir(""); err != nil {
		return err
	}
	return lw.tw.Close()
}

type layerWriter struct {
	tw    *tar.Writer
	root  string
	links map[[2]uint64]string // (dev, ino) of multiply linked files → first name
}

// dir writes the entries below the directory rel ("" for the root).
func (lw *layerWriter) dir(rel string) error {
	f, err := os.Open(filepath.Join(lw.root, rel))
	if err != nil {
		return fmt.Errorf("write layer: %w", err)
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return fmt.Errorf("write layer: %w", err)
	}
	slices.Sort(names)
	for _, name := range names {
		r := name
		if rel != "" {
			r = rel + "/" + name
		}
		if err := lw.entry(r, name); err != nil {
			return err
		}
	}
	return nil
}

func (lw *layerWriter) entry(rel, name string) error {
	full := filepath.Join(lw.root, rel)
	fail := func(err error) error { return fmt.Errorf("write layer: %s: %w", rel, err) }
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		return fail(err)
	}
	if strings.HasPrefix(name, whiteoutPrefix) {
		return fail(errors.New("a name starting with .wh. cannot be represented in a layer"))
	}
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, 0),
	}
	kind := st.Mode & unix.S_IFMT
	if kind == unix.S_IFCHR && st.Rdev == 0 {
		// An overlay whiteout. Several may share one inode; they are never
		// hard links of each other.
		hdr.Name = whiteoutName(rel, name)
		hdr.Typeflag = tar.TypeReg
		return lw.write(hdr, fail)
	}
	if kind == unix.S_IFSOCK {
		return nil
	}
	xattrs, opaque, err := readXattrs(full)
	if err != nil {
		return fail(err)
	}
	if len(xattrs) > 0 {
		hdr.PAXRecords = map[string]string{}
		for k, v := range xattrs {
			hdr.PAXRecords[paxXattr+k] = v
		}
	}
	if kind != unix.S_IFDIR && st.Nlink > 1 {
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := lw.links[key]; ok {
			hdr.Typeflag = tar.TypeLink
			hdr.Linkname = first
			hdr.PAXRecords = nil
			return lw.write(hdr, fail)
		}
		lw.links[key] = rel
	}
	switch kind {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		hdr.Name = rel + "/"
		if err := lw.write(hdr, fail); err != nil {
			return err
		}
		if opaque {
			marker := &tar.Header{Name: rel + "/" + opaqueMarker, Typeflag: tar.TypeReg, ModTime: hdr.ModTime}
			if err := lw.write(marker, fail); err != nil {
				return err
			}
		}
		return lw.dir(rel)
	case unix.S_IFREG:
		hdr.Typeflag = tar.TypeReg
		hdr.Size = st.Size
		f, err := os.OpenFile(full, os.O_RDONLY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		if err := lw.write(hdr, fail); err != nil {
			return err
		}
		if _, err := io.CopyN(lw.tw, f, st.Size); err != nil {
			return fail(err)
		}
		return nil
	case unix.S_IFLNK:
		target, err := readlink(full)
		if err != nil {
			return fail(err)
		}
		hdr.Typeflag = tar.TypeSymlink
		hdr.Linkname = target
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if kind == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor = int64(unix.Major(st.Rdev))
		hdr.Devminor = int64(unix.Minor(st.Rdev))
	default:
		return fail(fmt.Errorf("unsupported file type %#o", kind))
	}
	return lw.write(hdr, fail)
}

func (lw *layerWriter) write(hdr *tar.Header, fail func(error) error) error {
	if err := lw.tw.WriteHeader(hdr); err != nil {
		return fail(err)
	}
	return nil
}

// whiteoutName is the layer name of a whiteout for rel (whose last element
// is name): the same directory, ".wh." + name.
func whiteoutName(rel, name string) string {
	return rel[:len(rel)-len(name)] + whiteoutPrefix + name
}

// readXattrs returns the xattrs of the file at p (not following a
// symlink) other than overlayfs's own, and whether overlayfs marked it an
// opaque directory. Overlay xattrs meaning the upper file is not whole
// (metacopy, redirect) are an error.
func readXattrs(p string) (map[string]string, bool, error) {
	names, err := listXattrs(p)
	if err != nil {
		return nil, false, err
	}
	var out map[string]string
	opaque := false
	for _, name := range names {
		v, err := getXattr(p, name)
		if err == unix.ENODATA {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("xattr %s: %w", name, err)
		}
		if overlayXattr(name) {
			switch strings.TrimPrefix(strings.TrimPrefix(name, "trusted."), "user.") {
			case "overlay.opaque":
				opaque = opaque || string(v) == "y"
			case "overlay.metacopy", "overlay.redirect":
				return nil, false, fmt.Errorf("upper dir has %s: mount the overlay with metacopy=off,redirect_dir=off", name)
			}
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[name] = string(v)
	}
	return out, opaque, nil
}

func listXattrs(p string) ([]string, error) {
	for {
		n, err := unix.Llistxattr(p, nil)
		if err == unix.ENOTSUP {
			return nil, nil
		}
		if err != nil || n == 0 {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = unix.Llistxattr(p, buf)
		if err == unix.ERANGE {
			continue // grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				names = append(names, s)
			}
		}
		slices.Sort(names)
		return names, nil
	}
}

func getXattr(p, name string) ([]byte, error) {
	for {
		n, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = unix.Lgetxattr(p, name, buf)
		if err == unix.ERANGE {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// ApplyLayer unpacks the OCI layer tar r into the overlayfs upper directory
// upperDir (empty or not), the inverse of WriteLayer: DIR/.wh.NAME becomes
// a whiteout (a 0/0 character device) named NAME, replacing whatever was
// there, DIR/.wh..wh..opq sets trusted.overlay.opaque=y on DIR, and every
// other entry is created with its mode, mtime, xattrs (overlayfs's own are
// ignored) and, when running as root, owner. Entries that would land
// outside upperDir — an absolute name, a ".." element, a parent path
// through a symlink, a hard link whose target is any of those — are refused
// with an error and nothing is written outside upperDir. Whiteouts and the
// trusted. opaque xattr need root (CAP_MKNOD, CAP_SYS_ADMIN); for a
// rootless overlay (mounted with userxattr) use ApplyLayerXattrPrefix with
// "user.".
func ApplyLayer(r io.Reader, upperDir string) error {
	return ApplyLayerXattrPrefix(r, upperDir, "trusted.")
}

// ApplyLayerXattrPrefix is ApplyLayer with the namespace of overlayfs's
// xattrs given: "trusted." (the default) or "user." (an overlay mounted
// with userxattr).
func ApplyLayerXattrPrefix(r io.Reader, upperDir, prefix string) error {
	if prefix != "trusted." && prefix != "user." {
		return invalidArg("apply layer: xattr prefix %q is neither trusted. nor user.", prefix)
	}
	root, err := unix.Open(upperDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "apply layer", Path: upperDir, Err: err}
	}
	defer unix.Close(root)
	a := &applier{root: root, rootPath: upperDir, opaqueXattr: prefix + "overlay.opaque", asRoot: unix.Geteuid() == 0}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("apply layer: %w", err)
		}
		if err := a.apply(hdr, tr); err != nil {
			return fmt.Errorf("apply layer: %s: %w", hdr.Name, err)
		}
	}
	return a.finish()
}

type applier struct {
	root        int    // fd of the upper dir
	rootPath    string // its path
	opaqueXattr string
	asRoot      bool
	dirs        []dirMeta // directories whose mode and mtime are set last
}

// dirMeta is what is set on a directory once everything below it is in
// place (creating entries changes its mtime; its mode may forbid writing).
type dirMeta struct {
	parts []string
	mode  uint32
	mtime time.Time
}

// errEscape is the cause of every refused entry.
var errEscape = errors.New("refusing an entry outside the layer's root")

// splitName checks a tar entry name and splits it into its elements. A
// leading "./" and trailing "/" are allowed; an absolute name, a ".."
// element or a NUL byte are refused. The root itself gives no elements.
func splitName(name string) ([]string, error) {
	if strings.HasPrefix(name, "/") || strings.IndexByte(name, 0) >= 0 {
		return nil, errEscape
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return nil, errEscape
		}
		parts = append(parts, p)
	}
	return parts, nil
}

// openDir opens the directory parts below the root, one element at a time
// with O_NOFOLLOW, so a symlink anywhere on the way is refused rather than
// followed; with create, missing directories are made (0755). The caller
// closes the fd.
func (a *applier) openDir(parts []string, create bool) (int, error) {
	cur, err := unix.Openat(a.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for i, p := range parts {
		next, err := unix.Openat(cur, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ENOENT && create {
			if err = unix.Mkdirat(cur, p, 0o755); err == nil || err == unix.EEXIST {
				next, err = unix.Openat(cur, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			}
		}
		unix.Close(cur)
		if err != nil {
			if err == unix.ELOOP || err == unix.ENOTDIR {
				return -1, fmt.Errorf("%s is a symlink or not a directory: %w", strings.Join(parts[:i+1], "/"), errEscape)
			}
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

func (a *applier) apply(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil // archive-wide PAX records: nothing to create
	}
	parts, err := splitName(hdr.Name)
	if err != nil || len(parts) == 0 {
		return err // the root entry itself is skipped
	}
	base := parts[len(parts)-1]
	parent, err := a.openDir(parts[:len(parts)-1], true)
	if err != nil {
		return err
	}
	defer unix.Close(parent)

	switch {
	case base == opaqueMarker:
		return unix.Fsetxattr(parent, a.opaqueXattr, []byte("y"), 0)
	case strings.HasPrefix(base, whiteoutPrefix+whiteoutPrefix):
		return nil // other AUFS metadata (.wh..wh.plnk, ...): not ours
	case strings.HasPrefix(base, whiteoutPrefix):
		name := base[len(whiteoutPrefix):]
		if name == "" || name == "." || name == ".." {
			return errEscape
		}
		if err := removeAt(parent, name); err != nil {
			return err
		}
		if err := unix.Mknodat(parent, name, unix.S_IFCHR, 0); err != nil {
			return err
		}
		return a.meta(parent, name, hdr, nil)
	}

	mode := uint32(hdr.Mode) & 0o7777
	switch hdr.Typeflag {
	case tar.TypeDir:
		var st unix.Stat_t
		err := unix.Fstatat(parent, base, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := removeAt(parent, base); err != nil {
				return err
			}
			err = unix.ENOENT
		}
		if err == unix.ENOENT {
			err = unix.Mkdirat(parent, base, 0o700)
		}
		if err != nil {
			return err
		}
		dfd, err := unix.Openat(parent, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		if a.asRoot {
			if err := unix.Fchown(dfd, hdr.Uid, hdr.Gid); err != nil {
				return err
			}
		}
		if err := a.setXattrs(hdr, func(k string, v []byte) error { return unix.Fsetxattr(dfd, k, v, 0) }); err != nil {
			return err
		}
		a.dirs = append(a.dirs, dirMeta{parts: parts, mode: mode, mtime: hdr.ModTime})
		return nil

	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		if err := removeAt(parent, base); err != nil {
			return err
		}
		fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), base)
		defer f.Close()
		if _, err := io.Copy(f, r); err != nil {
			return err
		}
		// Owner first (chown clears set-id bits and capabilities), then
		// mode, then xattrs.
		if a.asRoot {
			if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
				return err
			}
		}
		if err := unix.Fchmod(fd, mode); err != nil {
			return err
		}
		if err := a.setXattrs(hdr, func(k string, v []byte) error { return unix.Fsetxattr(fd, k, v, 0) }); err != nil {
			return err
		}
		return setMtime(parent, base, hdr.ModTime)

	case tar.TypeLink:
		target, err := splitName(hdr.Linkname)
		if err != nil {
			return err
		}
		if len(target) == 0 {
			return fmt.Errorf("hard link to the root: %w", errEscape)
		}
		tdir, err := a.openDir(target[:len(target)-1], false)
		if err != nil {
			return err
		}
		defer unix.Close(tdir)
		if err := removeAt(parent, base); err != nil {
			return err
		}
		// flags 0: a symlink target is linked itself, never followed.
		return unix.Linkat(tdir, target[len(target)-1], parent, base, 0)

	case tar.TypeSymlink:
		if err := removeAt(parent, base); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, parent, base); err != nil {
			return err
		}
		return a.meta(parent, base, hdr, parts)

	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		if err := removeAt(parent, base); err != nil {
			return err
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknodat(parent, base, kind|0o600, int(dev)); err != nil {
			return err
		}
		return a.meta(parent, base, hdr, parts)
	}
	return fmt.Errorf("unsupported entry type %q", hdr.Typeflag)
}

// meta sets owner (as root), mode (not on a symlink), xattrs (when parts,
// the entry's elements, is given) and mtime on the non-regular,
// non-directory entry name in parent.
func (a *applier) meta(parent int, name string, hdr *tar.Header, parts []string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	symlink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	if a.asRoot {
		if err := unix.Fchownat(parent, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	if !symlink {
		// Not a symlink (checked above, and nothing else writes here), so
		// fchmodat, which follows one, acts on the node itself.
		if err := unix.Fchmodat(parent, name, uint32(hdr.Mode)&0o7777, 0); err != nil {
			return err
		}
	}
	if parts != nil {
		// There is no fd-based setxattr for a symlink or a device node; the
		// path was just walked without meeting a symlink.
		p := filepath.Join(append([]string{a.rootPath}, parts...)...)
		if err := a.setXattrs(hdr, func(k string, v []byte) error { return unix.Lsetxattr(p, k, v, 0) }); err != nil {
			return err
		}
	}
	return setMtime(parent, name, hdr.ModTime)
}

// setXattrs sets the entry's SCHILY.xattr PAX records with set, leaving
// out overlayfs's own. Not as root, xattrs the kernel refuses (trusted.*,
// security.*) are skipped.
func (a *applier) setXattrs(hdr *tar.Header, set func(string, []byte) error) error {
	var keys []string
	for k := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, paxXattr); ok && !overlayXattr(name) {
			keys = append(keys, name)
		}
	}
	slices.Sort(keys)
	for _, name := range keys {
		err := set(name, []byte(hdr.PAXRecords[paxXattr+name]))
		if err != nil && !(!a.asRoot && (err == unix.EPERM || err == unix.ENOTSUP)) {
			return fmt.Errorf("xattr %s: %w", name, err)
		}
	}
	return nil
}

func setMtime(dir int, name string, mtime time.Time) error {
	ts := unix.NsecToTimespec(mtime.UnixNano())
	return unix.UtimesNanoAt(dir, name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}

// finish sets the mode and mtime of the directories the layer named,
// deepest first. One a later entry removed or replaced is skipped.
func (a *applier) finish() error {
	for i := len(a.dirs) - 1; i >= 0; i-- {
		d := a.dirs[i]
		n := len(d.parts)
		parent, err := a.openDir(d.parts[:n-1], false)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, errEscape) {
				continue
			}
			return fmt.Errorf("apply layer: %s: %w", strings.Join(d.parts, "/"), err)
		}
		err = func() error {
			dfd, err := unix.Openat(parent, d.parts[n-1], unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == unix.ENOENT || err == unix.ELOOP || err == unix.ENOTDIR {
				return nil
			}
			if err != nil {
				return err
			}
			defer unix.Close(dfd)
			if err := unix.Fchmod(dfd, d.mode); err != nil {
				return err
			}
			return setMtime(parent, d.parts[n-1], d.mtime)
		}()
		unix.Close(parent)
		if err != nil {
			return fmt.Errorf("apply layer: %s: %w", strings.Join(d.parts, "/"), err)
		}
	}
	return nil
}

// removeAt removes name in dir, a directory with everything in it, never
// following a symlink. A missing name is not an error.
func removeAt(dir int, name string) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return err
	}
	fd, oerr := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if oerr != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	// Read all names before removing any: removing while reading can make
	// getdents skip entries.
	names, rerr := f.Readdirnames(-1)
	if rerr != nil {
		return rerr
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			return err
		}
	}
	return unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
}

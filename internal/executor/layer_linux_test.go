//go:build linux

package executor

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if unix.Geteuid() != 0 {
		t.Skip("needs root: whiteout devices and trusted.* xattrs")
	}
}

var layerTime = time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)

// entry is what a test compares of a tar entry.
type entry struct {
	Name     string
	Type     byte
	Mode     int64
	Uid, Gid int
	Mtime    int64
	Link     string
	Major    int64
	Minor    int64
	Content  string
	Xattrs   map[string]string
}

func (e entry) String() string {
	return fmt.Sprintf("%s type=%c mode=%#o %d:%d mtime=%d link=%q dev=%d/%d content=%q xattrs=%q",
		e.Name, e.Type, e.Mode, e.Uid, e.Gid, e.Mtime, e.Link, e.Major, e.Minor, e.Content, e.Xattrs)
}

func readEntries(t *testing.T, b []byte) []entry {
	t.Helper()
	var out []entry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("reading the layer: %v", err)
		}
		content, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		e := entry{Name: hdr.Name, Type: hdr.Typeflag, Mode: hdr.Mode, Uid: hdr.Uid, Gid: hdr.Gid,
			Mtime: hdr.ModTime.Unix(), Link: hdr.Linkname, Major: hdr.Devmajor, Minor: hdr.Devminor, Content: string(content)}
		for k, v := range hdr.PAXRecords {
			if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
				if e.Xattrs == nil {
					e.Xattrs = map[string]string{}
				}
				e.Xattrs[name] = v
			}
		}
		out = append(out, e)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// capV2 is a valid security.capability value granting CAP_NET_BIND_SERVICE.
func capV2() string {
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], 0x02000000|1) // VFS_CAP_REVISION_2 | effective
	binary.LittleEndian.PutUint32(b[4:], 1<<unix.CAP_NET_BIND_SERVICE)
	return string(b)
}

// setTimes sets every mtime under root (not root itself) to layerTime,
// deepest first so directories keep theirs.
func setTimes(t *testing.T, root string) {
	t.Helper()
	var paths []string
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if p != root {
			paths = append(paths, p)
		}
		return err
	}))
	ts := unix.NsecToTimespec(layerTime.UnixNano())
	for i := len(paths) - 1; i >= 0; i-- {
		must(t, unix.UtimesNanoAt(unix.AT_FDCWD, paths[i], []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
}

// buildUpper makes, by hand, an upper dir with every kind of entry.
func buildUpper(t *testing.T) string {
	t.Helper()
	u := t.TempDir()
	p := func(s string) string { return filepath.Join(u, s) }
	writeFile(t, p("a.txt"), "alpha", 0o640)
	must(t, os.Chown(p("a.txt"), 1000, 1001))
	must(t, unix.Lsetxattr(p("a.txt"), "user.test", []byte("v"), 0))
	must(t, unix.Lsetxattr(p("a.txt"), "trusted.keep", []byte("1"), 0))
	must(t, unix.Lsetxattr(p("a.txt"), "trusted.overlay.origin", []byte("xx"), 0))
	must(t, unix.Lsetxattr(p("a.txt"), "user.overlay.impure", []byte("y"), 0))
	must(t, os.Mkdir(p("bin"), 0o755))
	writeFile(t, p("bin/tool"), "tool", 0o755)
	must(t, os.Chmod(p("bin/tool"), 0o755|os.ModeSetuid))
	must(t, unix.Lsetxattr(p("bin/tool"), "security.capability", []byte(capV2()), 0))
	must(t, os.MkdirAll(p("d/e"), 0o750))
	writeFile(t, p("d/e/f.txt"), "f", 0o600)
	must(t, unix.Mknod(p("d/e/gone2"), unix.S_IFCHR, 0))
	must(t, os.Link(p("a.txt"), p("d/hard")))
	must(t, os.Symlink("../a.txt", p("d/link")))
	must(t, unix.Mkfifo(p("fifo"), 0o600))
	must(t, unix.Mknod(p("gone"), unix.S_IFCHR, 0))
	must(t, os.Link(p("gone"), p("gone-too"))) // overlayfs shares whiteout inodes
	must(t, unix.Mknod(p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(t, os.Chmod(p("null"), 0o666))
	must(t, os.Mkdir(p("opq"), 0o755))
	must(t, unix.Lsetxattr(p("opq"), "trusted.overlay.opaque", []byte("y"), 0))
	writeFile(t, p("opq/inside"), "in", 0o644)
	must(t, os.Mkdir(p("uopq"), 0o700))
	must(t, unix.Lsetxattr(p("uopq"), "user.overlay.opaque", []byte("y"), 0))
	must(t, os.Mkdir(p("notopq"), 0o755))
	must(t, unix.Lsetxattr(p("notopq"), "trusted.overlay.opaque", []byte("n"), 0))
	setTimes(t, u)
	return u
}

func wantUpperEntries() []entry {
	mt := layerTime.Unix()
	reg, dir := byte(tar.TypeReg), byte(tar.TypeDir)
	return []entry{
		{Name: "a.txt", Type: reg, Mode: 0o640, Uid: 1000, Gid: 1001, Mtime: mt, Content: "alpha",
			Xattrs: map[string]string{"trusted.keep": "1", "user.test": "v"}},
		{Name: "bin/", Type: dir, Mode: 0o755, Mtime: mt},
		{Name: "bin/tool", Type: reg, Mode: 0o4755, Mtime: mt, Content: "tool",
			Xattrs: map[string]string{"security.capability": capV2()}},
		{Name: "d/", Type: dir, Mode: 0o750, Mtime: mt},
		{Name: "d/e/", Type: dir, Mode: 0o750, Mtime: mt},
		{Name: "d/e/f.txt", Type: reg, Mode: 0o600, Mtime: mt, Content: "f"},
		{Name: "d/e/.wh.gone2", Type: reg, Mode: 0, Mtime: mt},
		{Name: "d/hard", Type: tar.TypeLink, Mode: 0o640, Uid: 1000, Gid: 1001, Mtime: mt, Link: "a.txt"},
		{Name: "d/link", Type: tar.TypeSymlink, Mode: 0o777, Mtime: mt, Link: "../a.txt"},
		{Name: "fifo", Type: tar.TypeFifo, Mode: 0o600, Mtime: mt},
		{Name: ".wh.gone", Type: reg, Mode: 0, Mtime: mt},
		{Name: ".wh.gone-too", Type: reg, Mode: 0, Mtime: mt},
		{Name: "notopq/", Type: dir, Mode: 0o755, Mtime: mt},
		{Name: "null", Type: tar.TypeChar, Mode: 0o666, Mtime: mt, Major: 1, Minor: 3},
		{Name: "opq/", Type: dir, Mode: 0o755, Mtime: mt},
		{Name: "opq/.wh..wh..opq", Type: reg, Mode: 0, Mtime: mt},
		{Name: "opq/inside", Type: reg, Mode: 0o644, Mtime: mt, Content: "in"},
		{Name: "uopq/", Type: dir, Mode: 0o700, Mtime: mt},
		{Name: "uopq/.wh..wh..opq", Type: reg, Mode: 0, Mtime: mt},
	}
}

func compareEntries(t *testing.T, got, want []entry) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%d entries, want %d", len(got), len(want))
	}
	for i := range max(len(got), len(want)) {
		var g, w entry
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g.String() != w.String() {
			t.Errorf("entry %d:\n got %v\nwant %v", i, g, w)
		}
	}
}

func writeLayer(t *testing.T, upper string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteLayer(&buf, upper); err != nil {
		t.Fatalf("WriteLayer: %v", err)
	}
	return buf.Bytes()
}

func TestWriteLayer(t *testing.T) {
	requireRoot(t)
	upper := buildUpper(t)
	b := writeLayer(t, upper)
	compareEntries(t, readEntries(t, b), wantUpperEntries())
	if again := writeLayer(t, upper); !bytes.Equal(again, b) {
		t.Error("two WriteLayer of one tree differ")
	}
	if bytes.Contains(b, []byte("overlay.")) {
		t.Error("an overlay xattr made it into the layer")
	}
}

func TestWriteLayerRefuses(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, u string)
	}{
		{"a name that reads as a whiteout", func(t *testing.T, u string) { writeFile(t, u+"/.wh.x", "", 0o644) }},
		{"metacopy", func(t *testing.T, u string) {
			writeFile(t, u+"/f", "", 0o644)
			must(t, unix.Lsetxattr(u+"/f", "trusted.overlay.metacopy", nil, 0))
		}},
		{"redirect", func(t *testing.T, u string) {
			must(t, os.Mkdir(u+"/d", 0o755))
			must(t, unix.Lsetxattr(u+"/d", "trusted.overlay.redirect", []byte("/x"), 0))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := t.TempDir()
			tc.setup(t, u)
			if err := WriteLayer(io.Discard, u); err == nil {
				t.Error("WriteLayer succeeded")
			}
		})
	}
	if err := WriteLayer(io.Discard, filepath.Join(t.TempDir(), "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing upper dir: %v", err)
	}
}

func TestLayerRoundTrip(t *testing.T) {
	requireRoot(t)
	b1 := writeLayer(t, buildUpper(t))
	upper2 := t.TempDir()
	if err := ApplyLayer(bytes.NewReader(b1), upper2); err != nil {
		t.Fatalf("ApplyLayer: %v", err)
	}
	b2 := writeLayer(t, upper2)
	compareEntries(t, readEntries(t, b2), readEntries(t, b1))
	if !bytes.Equal(b1, b2) {
		t.Error("round trip changed the layer's bytes")
	}

	// What overlayfs will read.
	var st unix.Stat_t
	must(t, unix.Lstat(upper2+"/gone", &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("gone is not a whiteout: mode %#o rdev %d", st.Mode, st.Rdev)
	}
	for _, d := range []string{"opq", "uopq"} {
		v := make([]byte, 8)
		n, err := unix.Lgetxattr(upper2+"/"+d, "trusted.overlay.opaque", v)
		if err != nil || string(v[:n]) != "y" {
			t.Errorf("%s: trusted.overlay.opaque = %q, %v", d, v[:n], err)
		}
	}
	if _, err := os.Lstat(upper2 + "/opq/.wh..wh..opq"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the opaque marker was written as a file: %v", err)
	}
	var a, h unix.Stat_t
	must(t, unix.Lstat(upper2+"/a.txt", &a))
	must(t, unix.Lstat(upper2+"/d/hard", &h))
	if a.Ino != h.Ino {
		t.Error("d/hard is not a hard link of a.txt")
	}

	// Rootless: the opaque marker goes to user.overlay.opaque.
	upper3 := t.TempDir()
	if err := ApplyLayerXattrPrefix(bytes.NewReader(b1), upper3, "user."); err != nil {
		t.Fatalf("ApplyLayerXattrPrefix: %v", err)
	}
	v := make([]byte, 8)
	if n, err := unix.Lgetxattr(upper3+"/opq", "user.overlay.opaque", v); err != nil || string(v[:n]) != "y" {
		t.Errorf("user.overlay.opaque = %q, %v", v[:n], err)
	}
	if _, err := unix.Lgetxattr(upper3+"/opq", "trusted.overlay.opaque", v); err != unix.ENODATA {
		t.Errorf("trusted.overlay.opaque set with the user. prefix: %v", err)
	}
	compareEntries(t, readEntries(t, writeLayer(t, upper3)), readEntries(t, b1))
	if err := ApplyLayerXattrPrefix(bytes.NewReader(b1), t.TempDir(), "security."); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad prefix: %v", err)
	}
}

// tarEntry is one entry of a hand-made tar.
type tarEntry struct {
	name, link string
	typ        byte
	content    string
	pax        map[string]string
}

func makeTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.content)),
			ModTime: layerTime, PAXRecords: e.pax}
		switch e.typ {
		case tar.TypeDir:
			hdr.Mode = 0o755
		case tar.TypeXGlobalHeader:
			hdr = &tar.Header{Typeflag: e.typ, PAXRecords: e.pax}
		}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		must(t, tw.WriteHeader(hdr))
		if _, err := tw.Write([]byte(e.content)); err != nil {
			t.Fatal(err)
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}

func TestApplyLayerOverExisting(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	outside := filepath.Join(root, "outside")
	upper := filepath.Join(root, "upper")
	must(t, os.MkdirAll(outside, 0o755))
	writeFile(t, outside+"/keep", "outside", 0o644)
	must(t, os.MkdirAll(upper+"/gone/deep", 0o755))
	writeFile(t, upper+"/gone/deep/x", "x", 0o644)
	must(t, os.Mkdir(upper+"/file-was-dir", 0o755))
	must(t, os.Symlink(outside, upper+"/d"))     // replaced by a directory, never followed
	must(t, os.Symlink(outside, upper+"/ln"))    // replaced by a file, never followed
	writeFile(t, upper+"/untouched", "u", 0o644) // not in the layer

	b := makeTar(t,
		tarEntry{typ: tar.TypeXGlobalHeader, pax: map[string]string{"comment": "global"}},
		tarEntry{name: "./", typ: tar.TypeDir},
		tarEntry{name: ".wh.gone", typ: tar.TypeReg},
		tarEntry{name: "file-was-dir", typ: tar.TypeReg, content: "now a file"},
		tarEntry{name: "d/", typ: tar.TypeDir},
		tarEntry{name: "d/keep", typ: tar.TypeReg, content: "inside"},
		tarEntry{name: "ln", typ: tar.TypeReg, content: "file"},
		tarEntry{name: "./implicit/parent/f", typ: tar.TypeReg, content: "p"},
		tarEntry{name: "x", typ: tar.TypeReg, content: "x", pax: map[string]string{
			"SCHILY.xattr.trusted.overlay.redirect": "/evil", "SCHILY.xattr.user.ok": "1"}},
	)
	if err := ApplyLayer(bytes.NewReader(b), upper); err != nil {
		t.Fatalf("ApplyLayer: %v", err)
	}
	var st unix.Stat_t
	must(t, unix.Lstat(upper+"/gone", &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("gone: mode %#o", st.Mode)
	}
	for p, want := range map[string]string{
		"file-was-dir": "now a file", "d/keep": "inside", "ln": "file", "implicit/parent/f": "p", "untouched": "u",
	} {
		fi, err := os.Lstat(filepath.Join(upper, p))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v %v", p, fi, err)
			continue
		}
		if got, _ := os.ReadFile(filepath.Join(upper, p)); string(got) != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if got, _ := os.ReadFile(outside + "/keep"); string(got) != "outside" {
		t.Errorf("wrote through a symlink: outside/keep = %q", got)
	}
	if _, err := unix.Lgetxattr(upper+"/x", "trusted.overlay.redirect", nil); err != unix.ENODATA {
		t.Errorf("an overlay xattr was taken from the layer: %v", err)
	}
	if _, err := unix.Lgetxattr(upper+"/x", "user.ok", nil); err != nil {
		t.Errorf("user.ok: %v", err)
	}
}

func TestApplyLayerRefusesEscapes(t *testing.T) {
	requireRoot(t)
	symlinkOut := func(outside string) tarEntry {
		return tarEntry{name: "ln", typ: tar.TypeSymlink, link: outside}
	}
	tests := []struct {
		name    string
		entries func(outside string) []tarEntry
	}{
		{"absolute", func(o string) []tarEntry { return []tarEntry{{name: o + "/pwned", typ: tar.TypeReg}} }},
		{"dot-dot", func(string) []tarEntry { return []tarEntry{{name: "../outside/pwned", typ: tar.TypeReg}} }},
		{"dot-dot inside", func(string) []tarEntry { return []tarEntry{{name: "a/../../outside/pwned", typ: tar.TypeReg}} }},
		{"through a symlink", func(o string) []tarEntry {
			return []tarEntry{symlinkOut(o), {name: "ln/pwned", typ: tar.TypeReg, content: "x"}}
		}},
		{"dir through a symlink", func(o string) []tarEntry {
			return []tarEntry{symlinkOut(o), {name: "ln/pwned/", typ: tar.TypeDir}}
		}},
		{"symlink deeper in the path", func(o string) []tarEntry {
			return []tarEntry{{name: "a/", typ: tar.TypeDir}, {name: "a/ln", typ: tar.TypeSymlink, link: o}, {name: "a/ln/b/pwned", typ: tar.TypeReg}}
		}},
		{"whiteout through a symlink", func(o string) []tarEntry {
			return []tarEntry{symlinkOut(o), {name: "ln/.wh.secret", typ: tar.TypeReg}}
		}},
		{"opaque through a symlink", func(o string) []tarEntry {
			return []tarEntry{symlinkOut(o), {name: "ln/.wh..wh..opq", typ: tar.TypeReg}}
		}},
		{"whiteout of dot-dot", func(string) []tarEntry { return []tarEntry{{name: "a/.wh...", typ: tar.TypeReg}} }},
		{"whiteout of dot", func(string) []tarEntry { return []tarEntry{{name: ".wh..", typ: tar.TypeReg}} }},
		{"hard link out", func(string) []tarEntry {
			return []tarEntry{{name: "hl", typ: tar.TypeLink, link: "../outside/secret"}}
		}},
		{"hard link absolute", func(o string) []tarEntry {
			return []tarEntry{{name: "hl", typ: tar.TypeLink, link: o + "/secret"}}
		}},
		{"hard link through a symlink", func(o string) []tarEntry {
			return []tarEntry{symlinkOut(o), {name: "hl", typ: tar.TypeLink, link: "ln/secret"}}
		}},
		{"hard link to the root", func(string) []tarEntry { return []tarEntry{{name: "hl", typ: tar.TypeLink, link: "./"}} }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			outside := filepath.Join(root, "outside")
			upper := filepath.Join(root, "upper")
			must(t, os.Mkdir(outside, 0o755))
			must(t, os.Mkdir(upper, 0o755))
			writeFile(t, outside+"/secret", "secret", 0o600)
			err := ApplyLayer(bytes.NewReader(makeTar(t, tc.entries(outside)...)), upper)
			if !errors.Is(err, errEscape) {
				t.Fatalf("ApplyLayer = %v, want a refusal", err)
			}
			names, _ := os.ReadDir(outside)
			if len(names) != 1 || names[0].Name() != "secret" {
				t.Errorf("outside changed: %v", names)
			}
			var st unix.Stat_t
			must(t, unix.Lstat(outside+"/secret", &st))
			if got, _ := os.ReadFile(outside + "/secret"); string(got) != "secret" || st.Nlink != 1 || st.Mode&0o7777 != 0o600 {
				t.Errorf("outside/secret changed: %q nlink=%d mode=%#o", got, st.Nlink, st.Mode)
			}
			if _, err := os.Lstat(filepath.Join(root, "pwned")); err == nil {
				t.Error("a file landed next to the upper dir")
			}
		})
	}
}

// TestOverlayLayer mounts a real overlay, changes it, and checks what
// WriteLayer makes of the upper dir, then that ApplyLayer gives a tree the
// overlay shows the same way.
func TestOverlayLayer(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	dirs := map[string]string{}
	for _, d := range []string{"lower", "upper", "work", "merged", "upper2", "work2"} {
		dirs[d] = filepath.Join(root, d)
		must(t, os.Mkdir(dirs[d], 0o755))
	}
	lower, merged := dirs["lower"], dirs["merged"]
	writeFile(t, lower+"/del", "to delete", 0o644)
	writeFile(t, lower+"/keep", "kept", 0o644)
	must(t, os.MkdirAll(lower+"/dir/sub", 0o755))
	writeFile(t, lower+"/dir/old", "old", 0o644)

	mount := func(upper, work string) {
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off,metacopy=off,index=off", lower, upper, work)
		if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
			t.Skipf("cannot mount an overlay here (%v): skipping the real-overlay layer test", err)
		}
	}
	unmount := func() { must(t, unix.Unmount(merged, 0)) }

	mount(dirs["upper"], dirs["work"])
	must(t, os.Remove(merged+"/del"))
	must(t, os.RemoveAll(merged+"/dir"))
	must(t, os.Mkdir(merged+"/dir", 0o755))
	writeFile(t, merged+"/dir/new", "new", 0o644)
	writeFile(t, merged+"/added", "added", 0o644)
	unmount()

	b := writeLayer(t, dirs["upper"])
	var got []string
	for _, e := range readEntries(t, b) {
		got = append(got, fmt.Sprintf("%s %c", e.Name, e.Type))
		if len(e.Xattrs) > 0 {
			t.Errorf("%s has xattrs %q", e.Name, e.Xattrs)
		}
	}
	want := []string{"added 0", ".wh.del 0", "dir/ 5", "dir/.wh..wh..opq 0", "dir/new 0"}
	if !slices.Equal(got, want) {
		t.Errorf("layer entries:\n got %q\nwant %q", got, want)
	}

	must(t, ApplyLayer(bytes.NewReader(b), dirs["upper2"]))
	mount(dirs["upper2"], dirs["work2"])
	defer unmount()
	view := map[string]string{}
	must(t, filepath.WalkDir(merged, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == merged {
			return err
		}
		rel, _ := filepath.Rel(merged, p)
		if d.IsDir() {
			view[rel+"/"] = ""
		} else {
			c, err := os.ReadFile(p)
			view[rel] = string(c)
			return err
		}
		return nil
	}))
	wantView := map[string]string{"added": "added", "keep": "kept", "dir/": "", "dir/new": "new"}
	if !maps.Equal(view, wantView) {
		t.Errorf("overlay over the applied layer shows %q, want %q", view, wantView)
	}
}

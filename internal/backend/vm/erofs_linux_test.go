package vm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/internal/store"
	"virtx.dev/virtx/protocol"
)

// requireErofs skips a test that makes image disks where it cannot (not root, no
// mkfs.erofs), naming what is missing; under CI=true it fails instead.
func requireErofs(t *testing.T) string {
	t.Helper()
	missing := func(msg string) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatal("prerequisite missing in CI: " + msg)
		}
		t.Skip("prerequisite missing: " + msg)
	}
	if os.Geteuid() != 0 {
		missing("root (the image store's layers carry trusted.overlay xattrs and whiteout devices)")
	}
	mkfs, err := findMkfsErofs()
	if err != nil {
		missing("mkfs.erofs: apt-get install erofs-utils")
	}
	return mkfs
}

// testImage stores a two-layer image named ref in cache's store: a bottom layer with
// every kind of file (owners, modes, mtimes, xattrs, a hard link, devices, a fifo, a
// symlink) and a top one with a whiteout, an opaque directory and a directory
// replaced by a file.
func testImage(t *testing.T, cache, ref string) {
	t.Helper()
	ctx := context.Background()
	bottom, top := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	write := func(root, name, body string, mode uint32) {
		t.Helper()
		p := filepath.Join(root, name)
		must(os.MkdirAll(filepath.Dir(p), 0o755))
		must(os.WriteFile(p, []byte(body), 0o600))
		must(unix.Chmod(p, mode)) // the raw mode: setuid as 0o4000, whatever the umask
	}
	write(bottom, "etc/hello", "hello\n", 0o640)
	must(os.Lchown(filepath.Join(bottom, "etc/hello"), 1000, 2000))
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	must(os.Chtimes(filepath.Join(bottom, "etc/hello"), old, old))
	must(unix.Lsetxattr(filepath.Join(bottom, "etc/hello"), "user.greeting", []byte("hi"), 0))
	write(bottom, "etc/removeme", "x\n", 0o644)
	write(bottom, "bin/tool", "#!/bin/sh\n", 0o4755)
	must(os.Link(filepath.Join(bottom, "bin/tool"), filepath.Join(bottom, "bin/tool2")))
	write(bottom, "bin/ping", "ping\n", 0o755)
	must(unix.Lsetxattr(filepath.Join(bottom, "bin/ping"), "security.capability",
		[]byte{1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0))
	must(os.MkdirAll(filepath.Join(bottom, "dev"), 0o755))
	must(unix.Mknod(filepath.Join(bottom, "dev/null"), unix.S_IFCHR, int(unix.Mkdev(1, 3))))
	must(unix.Chmod(filepath.Join(bottom, "dev/null"), 0o666))
	must(unix.Mknod(filepath.Join(bottom, "dev/sda"), unix.S_IFBLK, int(unix.Mkdev(8, 0))))
	must(unix.Chmod(filepath.Join(bottom, "dev/sda"), 0o660))
	must(unix.Mkfifo(filepath.Join(bottom, "dev/fifo"), 0o600))
	must(os.Symlink("../etc/hello", filepath.Join(bottom, "bin/hello")))
	write(bottom, "opt/data/a", "a\n", 0o644)
	write(bottom, "opt/data/sub/b", "b\n", 0o644)
	write(bottom, "opt/other/c", "c\n", 0o644)
	must(os.Chmod(filepath.Join(bottom, "opt/data"), 0o750))

	// The top layer as an overlay upper: a whiteout device, an opaque mark.
	must(os.MkdirAll(filepath.Join(top, "etc"), 0o755))
	must(unix.Mknod(filepath.Join(top, "etc/removeme"), unix.S_IFCHR, 0))
	write(top, "opt/data/new", "new\n", 0o644)
	must(os.Chmod(filepath.Join(top, "opt/data"), 0o711))
	must(unix.Lsetxattr(filepath.Join(top, "opt/data"), "trusted.overlay.opaque", []byte("y"), 0))
	write(top, "opt/other", "now a file\n", 0o644)

	s, err := store.Open(ctx, cache)
	must(err)
	base := ref + "-base"
	if _, err := s.Import(ctx, bottom, base); err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	must(executor.WriteLayer(&layer, top))
	if _, err := s.Commit(ctx, base, &layer, ref); err != nil {
		t.Fatal(err)
	}
	must(s.Remove(ctx, base)) // the top image keeps the bottom layer
}

// resolve resolves ref in b's store; the lease goes at the test's end.
func resolve(t *testing.T, b *Backend, ref string) (*store.Store, *store.Image) {
	t.Helper()
	ctx := context.Background()
	s, err := b.imageStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	im, err := s.Resolve(ctx, &protocol.ImageSource{Type: protocol.ImageRef, Ref: ref}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(im.Release)
	return s, im
}

func inode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// erofsMagic reads the superblock's magic of an erofs image.
func erofsMagic(t *testing.T, f *os.File) uint32 {
	t.Helper()
	b := make([]byte, 4)
	if _, err := f.ReadAt(b, 1024); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint32(b)
}

// listErofs mounts the erofs f in a mount namespace of its own (through a loop device)
// and answers one line per entry: type and mode, owner, size or device, mtime when not
// today, xattrs, symlink target, and which entries share an inode.
func listErofs(t *testing.T, f *os.File) []string {
	t.Helper()
	var lines []string
	var skip string
	err := theSpawner.inPrivateNS(func() error {
		ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			skip = fmt.Sprintf("no loop devices: %v", err)
			return nil
		}
		defer unix.Close(ctl)
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			skip = fmt.Sprintf("no free loop device: %v", err)
			return nil
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		lfd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			skip = fmt.Sprintf("%s: %v", dev, err)
			return nil
		}
		defer unix.Close(lfd)
		cfg := &unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_READ_ONLY
		if err := unix.IoctlLoopConfigure(lfd, cfg); err != nil {
			skip = fmt.Sprintf("LOOP_CONFIGURE %s: %v", dev, err)
			return nil
		}
		dir, err := os.MkdirTemp("", "erofs-test-")
		if err != nil {
			return err
		}
		defer os.Remove(dir)
		if err := unix.Mount(dev, dir, "erofs", unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("mount %s (erofs): %w", dev, err)
		}
		defer unix.Unmount(dir, unix.MNT_DETACH)
		inodes := map[uint64][]string{}
		err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			line := fmt.Sprintf("%s %o %d:%d", rel, st.Mode, st.Uid, st.Gid)
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				inodes[st.Ino] = append(inodes[st.Ino], rel)
				body, _ := os.ReadFile(p)
				line += fmt.Sprintf(" %q", body)
			case unix.S_IFCHR, unix.S_IFBLK:
				line += fmt.Sprintf(" %d,%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
			case unix.S_IFLNK:
				target, _ := os.Readlink(p)
				line += " -> " + target
			}
			if st.Mtim.Sec < time.Now().Add(-24*time.Hour).Unix() {
				line += " " + time.Unix(st.Mtim.Sec, 0).UTC().Format(time.DateOnly)
			}
			buf := make([]byte, 4096)
			if n, err := unix.Llistxattr(p, buf); err == nil && n > 0 {
				names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
				sort.Strings(names)
				for _, x := range names {
					v := make([]byte, 256)
					m, _ := unix.Lgetxattr(p, x, v)
					line += fmt.Sprintf(" %s=%q", x, v[:max(m, 0)])
				}
			}
			lines = append(lines, line)
			return nil
		})
		for _, names := range inodes {
			if len(names) > 1 {
				sort.Strings(names)
				lines = append(lines, "link "+strings.Join(names, " "))
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if skip != "" {
		t.Skip(skip)
	}
	sort.Strings(lines)
	return lines
}

// TestImageErofs: an image's erofs is its layers flattened, every kind of file kept as
// it is; it is made once and then found (by this server and another on the same
// cache), an older format of it goes, and removing the image removes it while an open
// one stays readable.
func TestImageErofs(t *testing.T) {
	mkfs := requireErofs(t)
	ctx := context.Background()
	cache := t.TempDir()
	testImage(t, cache, "test/img:1")
	b := New(cache)
	s, im := resolve(t, b, "test/img:1")
	stale := filepath.Join(filepath.Dir(s.DerivedPath(im.Digest, erofsName)), "vm-0.erofs")
	if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(stale, []byte("old"), 0o644)

	builds := erofsBuilds.Load()
	start := time.Now()
	f, err := b.imageDisk(ctx, s, im, mkfs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t.Logf("made in %v", time.Since(start))
	if got := erofsBuilds.Load() - builds; got != 1 {
		t.Fatalf("%d builds, want 1", got)
	}
	if m := erofsMagic(t, f); m != 0xE0F5E1E2 {
		t.Fatalf("not an erofs: magic %#x", m)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the older format's erofs is still there: %v", err)
	}
	if fi, err := os.Stat(s.DerivedPath(im.Digest, erofsName)); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("the cached erofs: %v %v", fi, err)
	}
	tmps, _ := os.ReadDir(filepath.Join(cache, "images", "tmp"))
	runs, _ := os.ReadDir(runRoot(cache))
	if len(tmps)+len(runs) != 0 {
		t.Errorf("the build left %v in tmp/ and %v in the run dir", tmps, runs)
	}

	want := []string{
		". 40755 0:0",
		"bin 40755 0:0",
		"bin/hello 120777 0:0 -> ../etc/hello",
		`bin/ping 100755 0:0 "ping\n" security.capability="\x01\x00\x00\x02\x00 \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"`,
		`bin/tool 104755 0:0 "#!/bin/sh\n"`,
		`bin/tool2 104755 0:0 "#!/bin/sh\n"`,
		"dev 40755 0:0",
		"dev/fifo 10600 0:0",
		"dev/null 20666 0:0 1,3",
		"dev/sda 60660 0:0 8,0",
		"etc 40755 0:0",
		`etc/hello 100640 1000:2000 "hello\n" 2001-02-03 user.greeting="hi"`,
		"link bin/tool bin/tool2",
		"opt 40755 0:0",
		"opt/data 40711 0:0",
		`opt/data/new 100644 0:0 "new\n"`,
		`opt/other 100644 0:0 "now a file\n"`,
	}
	if got := listErofs(t, f); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the erofs holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Found, not made again: by this server, and by another on the same cache.
	other := New(cache)
	s2, im2 := resolve(t, other, "test/img:1")
	for _, c := range []struct {
		b  *Backend
		s  *store.Store
		im *store.Image
	}{{b, s, im}, {other, s2, im2}} {
		g, err := c.b.imageDisk(ctx, c.s, c.im, mkfs)
		if err != nil {
			t.Fatal(err)
		}
		if inode(t, g) != inode(t, f) {
			t.Errorf("another erofs: inode %d, first %d", inode(t, g), inode(t, f))
		}
		g.Close()
	}
	if got := erofsBuilds.Load() - builds; got != 1 {
		t.Errorf("%d builds, want 1", got)
	}

	// Removing the image removes its erofs; the open file stays whole.
	if err := s.Remove(ctx, "test/img:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(s.DerivedPath(im.Digest, erofsName))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the erofs of a removed image is still in the cache: %v", err)
	}
	if m := erofsMagic(t, f); m != 0xE0F5E1E2 {
		t.Errorf("the open erofs after the removal: magic %#x", m)
	}
	locks, _ := filepath.Glob(filepath.Join(cache, "images", "locks", "derived-*"))
	if len(locks) != 0 {
		t.Errorf("lock files left: %v", locks)
	}
}

// TestImageErofsConcurrent: servers (backends with stores of their own, as two
// processes have) asking for the same image's erofs at once make it once, and all get
// that one file.
func TestImageErofsConcurrent(t *testing.T) {
	mkfs := requireErofs(t)
	cache := t.TempDir()
	testImage(t, cache, "test/img:1")
	type asker struct {
		b  *Backend
		s  *store.Store
		im *store.Image
	}
	var askers []asker
	for i := 0; i < 2; i++ {
		b := New(cache)
		s, im := resolve(t, b, "test/img:1")
		askers = append(askers, asker{b, s, im}, asker{b, s, im})
	}
	builds := erofsBuilds.Load()
	files := make([]*os.File, len(askers))
	errs := make([]error, len(askers))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, a := range askers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			files[i], errs[i] = a.b.imageDisk(context.Background(), a.s, a.im, mkfs)
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("asker %d: %v", i, err)
		}
		defer files[i].Close()
		if inode(t, files[i]) != inode(t, files[0]) {
			t.Errorf("asker %d got another file", i)
		}
	}
	if got := erofsBuilds.Load() - builds; got != 1 {
		t.Errorf("%d builds, want 1", got)
	}
	m, _ := filepath.Glob(filepath.Join(cache, "images", "derived", "*", "*"))
	if len(m) != 1 {
		t.Errorf("derived files: %v", m)
	}
}

// TestImageErofsLayers: an image with a layer twice (overlayfs refuses a directory
// twice) and an image of one layer both make an erofs.
func TestImageErofsLayers(t *testing.T) {
	mkfs := requireErofs(t)
	ctx := context.Background()
	cache := t.TempDir()
	one := t.TempDir()
	os.WriteFile(filepath.Join(one, "f"), []byte("f\n"), 0o644)
	s, err := store.Open(ctx, cache)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, one, "test/one:1"); err != nil {
		t.Fatal(err)
	}
	var empty bytes.Buffer
	if err := executor.WriteLayer(&empty, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	emptyLayer := empty.Bytes()
	if _, err := s.Commit(ctx, "test/one:1", bytes.NewReader(emptyLayer), "test/two:1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(ctx, "test/two:1", bytes.NewReader(emptyLayer), "test/three:1"); err != nil {
		t.Fatal(err)
	}
	b := New(cache)
	for _, ref := range []string{"test/one:1", "test/three:1"} {
		s, im := resolve(t, b, ref)
		if ref == "test/three:1" && (len(im.Lowers) != 3 || im.Lowers[0] != im.Lowers[1]) {
			t.Fatalf("%s: want the empty layer twice on top: %v", ref, im.Lowers)
		}
		f, err := b.imageDisk(ctx, s, im, mkfs)
		if err != nil {
			t.Fatalf("%s (%d layers): %v", ref, len(im.Lowers), err)
		}
		got := listErofs(t, f)
		f.Close()
		if want := []string{". 40755 0:0", `f 100644 0:0 "f\n"`}; strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("%s: %q", ref, got)
		}
	}
}

// TestMkfsErofsMissing: without mkfs.erofs an image is BOOT_FAILED naming the package.
func TestMkfsErofsMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := exec.LookPath("mkfs.erofs"); err == nil {
		t.Skip("mkfs.erofs found on an empty PATH")
	}
	_, err := findMkfsErofs()
	if !errors.Is(err, backend.ErrBootFailed) || !strings.Contains(err.Error(), "apt-get install erofs-utils") {
		t.Fatalf("%v", err)
	}
	if os.Geteuid() != 0 {
		return
	}
	b := New(t.TempDir())
	_, err = b.Admit(context.Background(), &backend.Spec{Image: &protocol.ImageSource{Type: protocol.ImageRef, Ref: "test/img:1"}})
	if !errors.Is(err, backend.ErrBootFailed) || !strings.Contains(err.Error(), "apt-get install erofs-utils") {
		t.Fatalf("Admit: %v", err)
	}
}

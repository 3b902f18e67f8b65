package vm

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSessionDisk: a session disk made from the template is a whole, clean ext4 of the
// size asked, sparse, and the same bytes as a freshly formatted one would hold in every
// place the template has data; the template is made once per size and reused.
func TestSessionDisk(t *testing.T) {
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Skip("mkfs.ext4 is not installed (apt-get install e2fsprogs)")
	}
	cache, run := t.TempDir(), t.TempDir()
	ctx := context.Background()
	f, err := newSessionDisk(ctx, cache, run, mkfs, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tmpls, _ := filepath.Glob(filepath.Join(cache, "vm", "disk", "ext4-*"))
	if len(tmpls) != 1 {
		t.Fatalf("templates: %v", tmpls)
	}
	st, _ := f.Stat()
	if st.Size() != 2<<30 {
		t.Fatalf("size %d", st.Size())
	}
	var s unix.Stat_t
	unix.Fstat(int(f.Fd()), &s)
	if s.Blocks*512 > 64<<20 {
		t.Fatalf("the disk is not sparse: %d bytes allocated", s.Blocks*512)
	}
	if ents, _ := os.ReadDir(run); len(ents) != 0 {
		t.Fatalf("the disk has a name in the run dir: %v", ents)
	}
	// Same bytes as the template where it has data, and e2fsck finds it clean.
	tf, err := os.Open(tmpls[0])
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	extents := 0
	for off := int64(0); ; {
		data, err := unix.Seek(int(tf.Fd()), off, unix.SEEK_DATA)
		if err != nil {
			break
		}
		hole, _ := unix.Seek(int(tf.Fd()), data, unix.SEEK_HOLE)
		want, got := make([]byte, hole-data), make([]byte, hole-data)
		tf.ReadAt(want, data)
		f.ReadAt(got, data)
		if !bytes.Equal(want, got) {
			t.Fatalf("the disk differs from its template in [%d, %d)", data, hole)
		}
		extents++
		off = hole
	}
	if extents == 0 {
		t.Fatal("the template has no data")
	}
	if fsck, err := exec.LookPath("e2fsck"); err == nil {
		cmd := exec.Command(fsck, "-fn", "/dev/fd/3")
		cmd.ExtraFiles = []*os.File{f}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("e2fsck: %v: %s", err, out)
		}
	}
	// A second disk reuses the template; its writes are its own.
	before, _ := os.Stat(tmpls[0])
	g, err := newSessionDisk(ctx, cache, run, mkfs, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.WriteAt([]byte("scribble"), 0); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(tmpls[0])
	if !os.SameFile(before, after) || after.Size() != before.Size() {
		t.Fatal("the template was made again")
	}
	head := make([]byte, 8)
	f.ReadAt(head, 0)
	if string(head) == "scribble" {
		t.Fatal("one disk's write shows in another")
	}
}

//go:build linux

package executor

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	content := "0123456789"
	writeFile(t, p, content, 0o644)
	e := newTestExecutor(t, Config{})
	small := newTestExecutor(t, Config{ReadLimit: 4})
	tests := []struct {
		name           string
		e              *Executor
		offset, length int64
		want           string
	}{
		{"all", e, 0, -1, content},
		{"from offset", e, 3, -1, "3456789"},
		{"window", e, 3, 4, "3456"},
		{"length past end", e, 8, 100, "89"},
		{"zero length", e, 2, 0, ""},
		{"at end", e, 10, -1, ""},
		{"past end", e, 1000, 5, ""},
		{"capped by ReadLimit", small, 0, -1, "0123"},
		{"capped window", small, 5, 100, "5678"},
		{"under ReadLimit", small, 2, 3, "234"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, size, err := tc.e.Read(context.Background(), p, tc.offset, tc.length)
			if err != nil {
				t.Fatal(err)
			}
			if string(data) != tc.want || size != int64(len(content)) || data == nil {
				t.Errorf("Read = %q (nil: %v), %d; want %q, %d", data, data == nil, size, tc.want, len(content))
			}
		})
	}
	// Through a symlink, and an empty file.
	os.Symlink("f", filepath.Join(dir, "link"))
	writeFile(t, filepath.Join(dir, "empty"), "", 0o644)
	if data, size, err := e.Read(context.Background(), filepath.Join(dir, "link"), 0, -1); err != nil || string(data) != content || size != 10 {
		t.Errorf("Read(link) = %q, %d, %v", data, size, err)
	}
	if data, size, err := e.Read(context.Background(), filepath.Join(dir, "empty"), 0, -1); err != nil || len(data) != 0 || size != 0 {
		t.Errorf("Read(empty) = %q, %d, %v", data, size, err)
	}
}

func TestReadErrors(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "file"), "x", 0o644)
	os.Symlink("nowhere", filepath.Join(dir, "dangling"))
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := newTestExecutor(t, Config{})
	tests := []struct {
		name   string
		path   string
		offset int64
		want   []error
	}{
		{"missing", dir + "/nope", 0, []error{fs.ErrNotExist, unix.ENOENT}},
		{"missing dir above", dir + "/nope/x", 0, []error{fs.ErrNotExist}},
		{"file above", dir + "/file/x", 0, []error{fs.ErrNotExist, unix.ENOTDIR}},
		{"dangling symlink", dir + "/dangling", 0, []error{fs.ErrNotExist}},
		{"directory", dir, 0, []error{unix.EISDIR}},
		{"relative", "file", 0, []error{ErrInvalidArgument}},
		{"negative offset", dir + "/file", -1, []error{ErrInvalidArgument}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data, _, err := e.Read(context.Background(), tc.path, tc.offset, -1)
			if err == nil {
				t.Fatalf("Read = %q, no error", data)
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("error %v does not match %v", err, w)
				}
			}
		})
	}
	// A FIFO does not hang the read: it has no size, so nothing is read.
	if data, size, err := e.Read(context.Background(), dir+"/fifo", 0, -1); err != nil || len(data) != 0 || size != 0 {
		t.Errorf("Read(fifo) = %q, %d, %v", data, size, err)
	}
	if _, _, err := e.Read(context.Background(), dir, 0, -1); errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a directory reads as missing: %v", err)
	}
}

func TestWrite(t *testing.T) {
	e := newTestExecutor(t, Config{})
	tests := []struct {
		name      string
		before    *string // nil: no file
		data      string
		offset    int64
		hasOffset bool
		want      string
	}{
		{"create", nil, "hello", 0, false, "hello"},
		{"create empty", nil, "", 0, false, ""},
		{"replace truncates", ptr("a long old content"), "new", 0, false, "new"},
		{"replace with empty", ptr("old"), "", 0, false, ""},
		{"overwrite in the middle", ptr("0123456789"), "ab", 3, true, "012ab56789"},
		{"overwrite at 0 keeps the rest", ptr("0123456789"), "ab", 0, true, "ab23456789"},
		{"overwrite past end", ptr("0123456789"), "ab", 9, true, "012345678ab"},
		{"beyond end zero fills", ptr("01"), "ab", 5, true, "01\x00\x00\x00ab"},
		{"empty beyond end extends", ptr("01"), "", 4, true, "01\x00\x00"},
		{"empty inside leaves", ptr("0123"), "", 2, true, "0123"},
		{"create at offset", nil, "ab", 2, true, "\x00\x00ab"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "f")
			if tc.before != nil {
				writeFile(t, p, *tc.before, 0o600)
			}
			size, err := e.Write(context.Background(), p, []byte(tc.data), tc.offset, tc.hasOffset)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(p)
			if string(got) != tc.want || size != int64(len(tc.want)) {
				t.Errorf("file %q size %d, want %q", got, size, tc.want)
			}
			fi, _ := os.Stat(p)
			wantMode := os.FileMode(0o644)
			if tc.before != nil {
				wantMode = 0o600 // an existing file keeps its mode
			}
			if fi.Mode().Perm() != wantMode {
				t.Errorf("mode %v, want %v", fi.Mode().Perm(), wantMode)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "file"), "x", 0o644)
	os.Symlink("nowhere/x", filepath.Join(dir, "dangling"))
	e := newTestExecutor(t, Config{})
	tests := []struct {
		name      string
		path      string
		offset    int64
		hasOffset bool
		want      []error
	}{
		{"missing dir above", dir + "/nope/x", 0, false, []error{fs.ErrNotExist}},
		{"file above", dir + "/file/x", 0, false, []error{fs.ErrNotExist, unix.ENOTDIR}},
		{"dangling symlink into a missing dir", dir + "/dangling", 0, false, []error{fs.ErrNotExist}},
		{"directory", dir, 0, false, []error{unix.EISDIR}},
		{"directory at offset", dir, 0, true, []error{unix.EISDIR}},
		{"root", "/", 0, false, []error{unix.EISDIR}},
		{"relative", "f", 0, false, []error{ErrInvalidArgument}},
		{"negative offset", dir + "/g", -1, true, []error{ErrInvalidArgument}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Write(context.Background(), tc.path, []byte("data"), tc.offset, tc.hasOffset)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("error %v does not match %v", err, w)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "g")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused write created its file: %v", err)
	}
}

func TestWriteReadOnly(t *testing.T) {
	dir := t.TempDir()
	ro := filepath.Join(dir, "ro")
	rw := filepath.Join(dir, "rw")
	for _, d := range []string{ro + "/sub", rw, dir + "/ro2"} {
		os.MkdirAll(d, 0o755)
	}
	writeFile(t, ro+"/file", "original", 0o644)
	os.Symlink(ro+"/file", rw+"/link")        // file in the ro tree
	os.Symlink("../ro", rw+"/dirlink")        // the ro tree itself
	os.Symlink(ro+"/sub/new", rw+"/dangling") // not yet a file in the ro tree
	os.Symlink("dangling", rw+"/chain")       // a chain ending there
	os.Symlink(ro, dir+"/rolink")             // another spelling of the root
	os.Symlink("../rw/target", ro+"/out")     // out of the ro tree
	e := newTestExecutor(t, Config{ReadOnly: []string{ro}})
	viaLink := newTestExecutor(t, Config{ReadOnly: []string{dir + "/rolink/"}})

	for _, tc := range []struct {
		name string
		e    *Executor
		path string
	}{
		{"inside", e, ro + "/file"},
		{"new file inside", e, ro + "/sub/new"},
		{"the root itself", e, ro},
		{"symlink to a file inside", e, rw + "/link"},
		{"through a symlinked dir", e, rw + "/dirlink/file"},
		{"dangling symlink into it", e, rw + "/dangling"},
		{"symlink chain into it", e, rw + "/chain"},
		{"root given through a symlink", viaLink, ro + "/file"},
		{"root given through a symlink, symlink in", viaLink, rw + "/link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, hasOffset := range []bool{false, true} {
				_, err := tc.e.Write(context.Background(), tc.path, []byte("changed"), 0, hasOffset)
				if !errors.Is(err, ErrReadOnly) || !errors.Is(err, unix.EROFS) {
					t.Errorf("Write(%s, hasOffset=%v) error = %v, want ErrReadOnly", tc.path, hasOffset, err)
				}
			}
			if got, _ := os.ReadFile(ro + "/file"); string(got) != "original" {
				t.Errorf("read-only file changed: %q", got)
			}
			if _, err := os.Lstat(ro + "/sub/new"); err == nil {
				t.Error("read-only tree got a new file")
			}
		})
	}
	// Writable: a sibling whose name starts the same, and a symlink inside
	// the ro tree that points out of it.
	for _, p := range []string{dir + "/ro2/f", ro + "/out"} {
		if _, err := e.Write(context.Background(), p, []byte("ok"), 0, false); err != nil {
			t.Errorf("Write(%s) = %v", p, err)
		}
	}
	if got, _ := os.ReadFile(rw + "/target"); string(got) != "ok" {
		t.Errorf("write through ro/out landed elsewhere: %q", got)
	}
}

func TestWriteThenRead(t *testing.T) {
	e := newTestExecutor(t, Config{})
	p := filepath.Join(t.TempDir(), "big")
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if size, err := e.Write(context.Background(), p, data, 0, false); err != nil || size != int64(len(data)) {
		t.Fatalf("Write = %d, %v", size, err)
	}
	got, size, err := e.Read(context.Background(), p, 0, -1)
	if err != nil || size != int64(len(data)) || !bytes.Equal(got, data) {
		t.Fatalf("Read = %d bytes, size %d, %v", len(got), size, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := e.Read(ctx, p, 0, -1); !errors.Is(err, context.Canceled) {
		t.Errorf("Read with a done ctx: %v", err)
	}
	if _, err := e.Write(ctx, p, nil, 0, false); !errors.Is(err, context.Canceled) {
		t.Errorf("Write with a done ctx: %v", err)
	}
}

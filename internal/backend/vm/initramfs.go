package vm

import (
	"bufio"
	"fmt"
	"io"
	"strings"
)

// cpioWriter writes the "newc" cpio format the kernel unpacks an initramfs from. It is
// ours rather than a library's because the kernel reads only this one format, and only
// the few entry kinds written here (directories, regular files, symlinks): a 110-byte
// ASCII-hex header, the name, padding to 4 bytes, the data, padding to 4 bytes, and a
// TRAILER!!! entry at the end. That is shorter than the adapter a general library would
// need, and it keeps the archive's bytes ours to reason about.
type cpioWriter struct {
	w   *bufio.Writer
	ino uint32
	n   int64 // bytes written, for padding
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20)} }

const (
	cpioDir     = 0o040000
	cpioFile    = 0o100000
	cpioSymlink = 0o120000
)

func (c *cpioWriter) write(b []byte) error {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return err
}

func (c *cpioWriter) pad() error {
	if r := c.n % 4; r != 0 {
		return c.write(make([]byte, 4-r))
	}
	return nil
}

// entry writes one header, name and body.
func (c *cpioWriter) entry(name string, mode uint32, body []byte) error {
	if strings.HasPrefix(name, "/") {
		name = name[1:]
	}
	c.ino++
	nlink := 1
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(body), 0, 0, 0, 0, len(name)+1, 0)
	if err := c.write([]byte(hdr)); err != nil {
		return err
	}
	if err := c.write(append([]byte(name), 0)); err != nil {
		return err
	}
	if err := c.pad(); err != nil {
		return err
	}
	if err := c.write(body); err != nil {
		return err
	}
	return c.pad()
}

func (c *cpioWriter) Dir(name string, perm uint32) error { return c.entry(name, cpioDir|perm, nil) }

func (c *cpioWriter) File(name string, perm uint32, data []byte) error {
	return c.entry(name, cpioFile|perm, data)
}

func (c *cpioWriter) Symlink(name, target string) error {
	return c.entry(name, cpioSymlink|0o777, []byte(target))
}

// Close writes the trailer and flushes.
func (c *cpioWriter) Close() error {
	c.ino = 0
	if err := c.entry("TRAILER!!!", 0, nil); err != nil {
		return err
	}
	return c.w.Flush()
}

//go:build linux

package store

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY returns a pseudo-terminal's controlling side and its terminal.
func openPTY(t *testing.T) (ptmx, tty *os.File) {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	requirePrereq(t, err == nil, fmt.Sprintf("/dev/ptmx: %v", err), "a pseudo-terminal device")
	must(t, unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0))
	n, err := unix.IoctlGetInt(int(ptmx.Fd()), unix.TIOCGPTN)
	must(t, err)
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	must(t, err)
	must(t, unix.IoctlSetWinsize(int(tty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: 100}))
	return ptmx, tty
}

// TestPullProgress: a terminal gets progress bars, anything else a line per layer.
func TestPullProgress(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	img := threeLayers(t)
	ref := reg.push(t, "t/three:1", img)
	ctx := context.Background()

	var lines bytes.Buffer
	_, err := openStore(t, t.TempDir(), WithProgress(&lines)).Pull(ctx, ref)
	must(t, err)
	if n := strings.Count(lines.String(), "\n"); n != 3 || strings.Count(lines.String(), ": pulled ") != 3 {
		t.Errorf("not a terminal: want one line per layer, got:\n%s", lines.String())
	}

	ptmx, tty := openPTY(t)
	defer ptmx.Close()
	var screen bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&screen, ptmx); close(done) }()
	_, err = openStore(t, t.TempDir(), WithProgress(tty)).Pull(ctx, ref)
	tty.Close()
	must(t, err)
	<-done // EIO once the terminal side is closed and drained
	layers, _ := img.Layers()
	d, _ := layers[0].Digest()
	if !strings.Contains(screen.String(), d.Hex[:12]) || !strings.Contains(screen.String(), "done") {
		t.Errorf("terminal: want a bar per layer ending in done, got:\n%q", screen.String())
	}
}

//go:build linux

package store

import (
	"os"

	"golang.org/x/sys/unix"
)

// isTerminal reports whether f is a terminal bars can be drawn on: one with a width (a
// pseudo-terminal nobody sized has none, and bars on it would draw nothing).
func isTerminal(f *os.File) bool {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	return err == nil && ws.Col > 0
}

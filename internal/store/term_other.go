//go:build !linux

package store

import "os"

// isTerminal is false where the store is unsupported: progress is a line per layer.
func isTerminal(f *os.File) bool { return false }

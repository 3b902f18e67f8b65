//go:build !linux

package linux

// DropExecutablePages fails: unsupported here.
func DropExecutablePages() (int64, error) { return 0, wrap("madvise", "", ErrUnsupported) }

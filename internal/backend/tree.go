package backend

import (
	"fmt"
	"net/url"
	"os"
	"path"

	"virtx.dev/virtx/protocol"
)

// FileTree is the host directory a `file://` tree names (mount i, counted from 0), for
// the backend called name. Any other scheme is ErrUnsupportedMount naming the entry, as is
// a file URL that is not `file:///absolute/path` (or `file://localhost/…`).
func FileTree(name string, i int, m protocol.Mount) (string, error) {
	if s := m.Scheme(); s != "file" {
		return "", fmt.Errorf("%w: mount %d (%s): the %s backend has no provider for %s:// trees (only file://)", ErrUnsupportedMount, i+1, m.URL, name, s)
	}
	u, err := url.Parse(m.URL)
	if err != nil || (u.Host != "" && u.Host != "localhost") || !path.IsAbs(u.Path) {
		return "", fmt.Errorf("%w: mount %d (%s): want file:///absolute/path", ErrUnsupportedMount, i+1, m.URL)
	}
	return path.Clean(u.Path), nil
}

// TreeDir is FileTree at boot: the directory must be there, else ErrMountFailed naming
// the entry (the mount is well formed; the environment is what has to change).
func TreeDir(name string, i int, m protocol.Mount) (string, error) {
	p, err := FileTree(name, i, m)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrMountFailed, err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("%w: mount %d (%s): %v", ErrMountFailed, i+1, m, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%w: mount %d (%s): %s is not a directory", ErrMountFailed, i+1, m, p)
	}
	return p, nil
}

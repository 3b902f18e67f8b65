package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"virtx.dev/virtx/internal/backend"
)

// Derived answers, open read-only, the file name made from the stored image digest by
// make: derived/<manifest hex>/<name>, made once and shared by every process that asks
// (the vm backend's erofs of an image's layers is one). build writes the file at the
// path it is given (in tmp/, not yet visible); the file is then renamed into place, so
// nobody sees it half made.
//
// Two askers at once build it once: the second waits on locks/derived-<hex>-<name> and
// finds it there. The gc lock is held shared throughout, so the collector cannot run
// between a build and its publication; once the image leaves the index, the next
// collection deletes derived/<hex>/ whole. The answer is an open file so that a
// collection after it harms nobody: the caller reads the unlinked file for as long as it
// keeps it open. An image the index no longer names (removed after the caller resolved
// it) is built all the same, but into tmp/ only and unlinked at once, so nothing is left
// for a collector to miss. name must be a plain file name.
func (s *Store) Derived(ctx context.Context, digest, name string, build func(ctx context.Context, path string) error) (*os.File, error) {
	d, err := v1.NewHash(digest)
	if err != nil {
		return nil, fmt.Errorf("%w: derived %s of %s: %v", backend.ErrUnknownImage, name, digest, err)
	}
	if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") {
		return nil, fmt.Errorf("derived %q of %s: not a plain file name", name, digest)
	}
	gc, err := s.gcShared(ctx)
	if err != nil {
		return nil, err
	}
	defer gc.unlock()
	final := s.derivedPath(d, name)
	if f, err := os.Open(final); err == nil {
		return f, nil
	}
	l, err := lockPath(ctx, s.lockFile("derived-"+d.Hex+"-"+name), exclusive)
	if err != nil {
		return nil, err
	}
	defer l.unlock()
	if f, err := os.Open(final); err == nil {
		return f, nil // the other builder's
	}
	_, live, err := s.lookupDigest(d)
	if err != nil {
		return nil, err
	}
	prefix := "derived-" + d.Hex + "-" + name
	s.clearTemps(prefix)
	tmp := filepath.Join(s.root, "tmp", prefix+"."+randomHex())
	start := time.Now()
	if err := build(ctx, tmp); err != nil {
		os.Remove(tmp)
		return nil, err
	}
	f, err := os.Open(tmp)
	if err != nil {
		return nil, fmt.Errorf("derived %s of %s: %w", name, digest, err)
	}
	if !live {
		os.Remove(tmp)
		s.log.Debug("image store: derived file of an image no longer stored; not kept", "digest", d, "name", name)
		return f, nil
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("derived %s of %s: %w", name, digest, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("derived %s of %s: %w", name, digest, err)
	}
	s.log.Debug("image store: derived file made", "digest", d, "name", name, "took", time.Since(start))
	return f, nil
}

// DerivedPath is where Derived keeps name of the image digest ("" for a digest that is
// none): for tests and for cleaning up a derived file's older formats.
func (s *Store) DerivedPath(digest, name string) string {
	d, err := v1.NewHash(digest)
	if err != nil {
		return ""
	}
	return s.derivedPath(d, name)
}

func (s *Store) derivedPath(d v1.Hash, name string) string {
	return filepath.Join(s.root, "derived", d.Hex, name)
}

// collectDerived deletes the derived files of every image not in live (manifest hexes).
// The caller holds the gc lock exclusive, so no Derived is building or publishing.
func (s *Store) collectDerived(live map[string]bool) (n int) {
	ents, _ := os.ReadDir(filepath.Join(s.root, "derived"))
	for _, e := range ents {
		if live[e.Name()] {
			continue
		}
		if err := removeTree(filepath.Join(s.root, "derived", e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("image store: cannot remove a derived file of a removed image", "dir", e.Name(), "err", err)
			continue
		}
		locks, _ := filepath.Glob(s.lockFile("derived-" + e.Name() + "-*"))
		for _, l := range locks {
			os.Remove(l)
		}
		n++
	}
	return n
}

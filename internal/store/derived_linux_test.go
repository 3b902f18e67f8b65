package store

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestDerived: a derived file is made once (two stores on one cache asking at once
// included), published whole, kept while its image is, and collected with it; a failed
// build leaves nothing; an image gone from the index gets its file, unlinked.
func TestDerived(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	cache := t.TempDir()
	s1, s2 := openStore(t, cache), openStore(t, cache)
	src := t.TempDir()
	must(t, os.WriteFile(filepath.Join(src, "f"), []byte("f\n"), 0o644))
	info, err := s1.Import(ctx, src, "test/one:1")
	must(t, err)

	var builds atomic.Int32
	build := func(ctx context.Context, p string) error {
		builds.Add(1)
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the build's path exists already: %v", err)
		}
		if !strings.HasPrefix(p, filepath.Join(cache, "images", "tmp")+"/") {
			t.Errorf("built at %s, not in tmp/", p)
		}
		return os.WriteFile(p, []byte("derived"), 0o644)
	}
	var wg sync.WaitGroup
	files := make([]*os.File, 6)
	for i := range files {
		s := s1
		if i%2 == 1 {
			s = s2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := s.Derived(ctx, info.Digest, "x-1.bin", build)
			if err != nil {
				t.Error(err)
				return
			}
			files[i] = f
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if n := builds.Load(); n != 1 {
		t.Errorf("%d builds, want 1", n)
	}
	for _, f := range files {
		defer f.Close()
	}
	p := s1.DerivedPath(info.Digest, "x-1.bin")
	if got := readFile(t, p); got != "derived" {
		t.Errorf("%s: %q", p, got)
	}

	// A failed build: an error and nothing left.
	boom := errors.New("boom")
	if _, err := s1.Derived(ctx, info.Digest, "y.bin", func(ctx context.Context, p string) error {
		os.WriteFile(p, []byte("half"), 0o644)
		return boom
	}); !errors.Is(err, boom) {
		t.Errorf("a failed build: %v", err)
	}
	if _, err := os.Stat(s1.DerivedPath(info.Digest, "y.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed build was published: %v", err)
	}
	for _, bad := range []string{"", "../z", "a/b", ".hidden"} {
		if _, err := s1.Derived(ctx, info.Digest, bad, build); err == nil {
			t.Errorf("name %q accepted", bad)
		}
	}

	// GC keeps it while the image is there, and takes it with the image.
	st, err := s1.GC(ctx)
	must(t, err)
	if st.Derived != 0 {
		t.Errorf("a collection with the image still there took %d derived dirs", st.Derived)
	}
	must(t, s2.Remove(ctx, "test/one:1"))
	if _, err := os.Stat(filepath.Dir(p)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the derived files outlived their image: %v", err)
	}
	if b, err := io.ReadAll(io.NewSectionReader(files[0], 0, 100)); err != nil || string(b) != "derived" {
		t.Errorf("an open derived file after the removal: %q %v", b, err)
	}
	if locks, _ := filepath.Glob(filepath.Join(cache, "images", "locks", "derived-*")); len(locks) != 0 {
		t.Errorf("lock files left: %v", locks)
	}

	// An image the index no longer has: built, answered, kept nowhere.
	f, err := s1.Derived(ctx, info.Digest, "x-1.bin", build)
	must(t, err)
	defer f.Close()
	if b, _ := io.ReadAll(f); string(b) != "derived" {
		t.Errorf("the file of a removed image: %q", b)
	}
	if m, _ := filepath.Glob(filepath.Join(cache, "images", "derived", "*")); len(m) != 0 {
		t.Errorf("kept for a removed image: %v", m)
	}
	if m, _ := filepath.Glob(filepath.Join(cache, "images", "tmp", "*")); len(m) != 0 {
		t.Errorf("left in tmp/: %v", m)
	}
}

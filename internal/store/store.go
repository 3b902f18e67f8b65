package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/image"
	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/protocol"
)

// Annotations the store writes on index.json descriptors.
const (
	annotationRef   = "org.opencontainers.image.ref.name"
	annotationChain = "dev.virtx.build.chain"
)

// Store is an image store rooted in a cache dir. It is safe for concurrent use by
// goroutines and by processes sharing the directory.
type Store struct {
	root      string // <cache>/images
	cacheDir  string
	log       *slog.Logger
	progress  io.Writer
	runner    StepRunner
	context   string // build context for BuildImage
	keychain  authn.Keychain
	transport http.RoundTripper
	platform  v1.Platform
	mirrors   Mirrors
	noPull    bool
}

// Option configures Open.
type Option func(*Store)

// WithLogger logs to l (default: slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// WithProgress writes pull progress and build steps to w (default os.Stderr). A terminal
// gets progress bars; anything else a line per layer.
func WithProgress(w io.Writer) Option { return func(s *Store) { s.progress = w } }

// WithStepRunner runs the RUN steps of builds started through BuildImage and Resolve
// when they are given no runner of their own.
func WithStepRunner(r StepRunner) Option { return func(s *Store) { s.runner = r } }

// WithBuildContext is the directory COPY sources are read from in builds that name none
// (build_image over the protocol). Default: the process's working directory.
func WithBuildContext(dir string) Option { return func(s *Store) { s.context = dir } }

// WithKeychain resolves registry credentials (default authn.DefaultKeychain:
// ~/.docker/config.json and its helpers).
func WithKeychain(k authn.Keychain) Option { return func(s *Store) { s.keychain = k } }

// WithTransport is the HTTP transport for registries (default http.DefaultTransport).
func WithTransport(t http.RoundTripper) Option { return func(s *Store) { s.transport = t } }

// WithPlatform is the platform picked from a multi-platform index (default: this host).
func WithPlatform(p v1.Platform) Option { return func(s *Store) { s.platform = p } }

// WithMirrors replaces the mirrors read from $VIRTX_REGISTRY_MIRRORS and
// <cache>/mirrors.conf.
func WithMirrors(m Mirrors) Option { return func(s *Store) { s.mirrors = m } }

// WithoutPull makes Resolve and builds use only what the store holds: an unknown ref is
// ErrUnknownImage instead of a pull.
func WithoutPull() Option { return func(s *Store) { s.noPull = true } }

// Open opens (creating it when missing) the store in cacheDir/images; cacheDir ""
// means console.CacheDir().
func Open(ctx context.Context, cacheDir string, opts ...Option) (*Store, error) {
	if cacheDir == "" {
		d, err := console.CacheDir()
		if err != nil {
			return nil, fmt.Errorf("open image store: %w", err)
		}
		cacheDir = d
	}
	s := &Store{
		cacheDir: cacheDir,
		root:     filepath.Join(cacheDir, "images"),
		log:      slog.Default(),
		progress: os.Stderr,
		keychain: authn.DefaultKeychain,
		platform: hostPlatform(),
	}
	mirrors, err := LoadMirrors(cacheDir)
	if err != nil {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	s.mirrors = mirrors
	for _, o := range opts {
		o(s)
	}
	if s.context == "" {
		if wd, err := os.Getwd(); err == nil {
			s.context = wd
		}
	}
	for _, d := range []string{"blobs/sha256", "layers", "buildcache", "locks", "tmp"} {
		if err := os.MkdirAll(filepath.Join(s.root, d), 0o755); err != nil {
			return nil, fmt.Errorf("open image store: %w", err)
		}
	}
	if err := s.writeIfMissing("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`+"\n")); err != nil {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	if err := s.writeIfMissing("index.json", mustJSON(emptyIndex())); err != nil {
		return nil, fmt.Errorf("open image store: %w", err)
	}
	return s, nil
}

// Root is the store's directory (<cache>/images).
func (s *Store) Root() string { return s.root }

func (s *Store) writeIfMissing(name string, data []byte) error {
	p := filepath.Join(s.root, name)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	// Link, not rename: a store another process has just started using keeps its file.
	f, err := s.tempFile("init")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		os.Chmod(f.Name(), 0o644)
		err = os.Link(f.Name(), p)
	}
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// atomicWrite writes data to p through a temporary file and a rename.
func (s *Store) atomicWrite(p string, data []byte) error {
	f, err := s.tempFile("write")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), p); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// tempFile makes a file in tmp/ named after prefix (a digest hex while fetching one, so
// the next fetcher of that digest can clear what a killed one left).
func (s *Store) tempFile(prefix string) (*os.File, error) {
	return os.CreateTemp(filepath.Join(s.root, "tmp"), prefix+".*")
}

func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// clearTemps removes what an earlier, killed writer of the digest hex left in tmp/. The
// caller holds that digest's lock.
func (s *Store) clearTemps(hexd string) {
	matches, _ := filepath.Glob(filepath.Join(s.root, "tmp", hexd+".*"))
	for _, m := range matches {
		os.RemoveAll(m)
	}
}

func (s *Store) blobPath(d v1.Hash) string {
	return filepath.Join(s.root, "blobs", d.Algorithm, d.Hex)
}

func (s *Store) layerDir(diffID v1.Hash) string { return filepath.Join(s.root, "layers", diffID.Hex) }

func (s *Store) lockFile(name string) string { return filepath.Join(s.root, "locks", name) }

// gcShared holds the collector off for the duration of an operation.
func (s *Store) gcShared(ctx context.Context) (*fileLock, error) {
	return lockPath(ctx, s.lockFile("gc"), shared)
}

// ---- the index ----

func emptyIndex() *v1.IndexManifest {
	return &v1.IndexManifest{SchemaVersion: 2, MediaType: "application/vnd.oci.image.index.v1+json", Manifests: []v1.Descriptor{}}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func (s *Store) readIndex() (*v1.IndexManifest, error) {
	b, err := os.ReadFile(filepath.Join(s.root, "index.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return emptyIndex(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	var idx v1.IndexManifest
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("read index %s: %w", filepath.Join(s.root, "index.json"), err)
	}
	return &idx, nil
}

// updateIndex applies change to the index under the index lock and replaces index.json.
func (s *Store) updateIndex(ctx context.Context, change func(*v1.IndexManifest) error) error {
	l, err := lockPath(ctx, s.lockFile("index"), exclusive)
	if err != nil {
		return err
	}
	defer l.unlock()
	idx, err := s.readIndex()
	if err != nil {
		return err
	}
	if err := change(idx); err != nil {
		return err
	}
	if err := s.atomicWrite(filepath.Join(s.root, "index.json"), mustJSON(idx)); err != nil {
		return fmt.Errorf("write index: %w", err)
	}
	return nil
}

// record makes ref (canonical, or "" for none) name the image desc (whose blobs are all
// in place), moving it off any other image, and keeps chain alive with it.
func (s *Store) record(ctx context.Context, desc v1.Descriptor, ref string, chain []string) error {
	return s.updateIndex(ctx, func(idx *v1.IndexManifest) error {
		var out, moved []v1.Descriptor
		for _, d := range idx.Manifests {
			r := d.Annotations[annotationRef]
			if ref != "" && r == ref {
				if d.Digest != desc.Digest {
					moved = append(moved, d)
				}
				continue // the ref moves
			}
			if d.Digest == desc.Digest && r == ref {
				continue // replaced below
			}
			out = append(out, d)
		}
		nd := v1.Descriptor{MediaType: desc.MediaType, Size: desc.Size, Digest: desc.Digest, Annotations: map[string]string{}}
		if ref != "" {
			nd.Annotations[annotationRef] = ref
			// An unnamed entry for the same image is now redundant.
			out = slices.DeleteFunc(out, func(d v1.Descriptor) bool {
				return d.Digest == desc.Digest && d.Annotations[annotationRef] == ""
			})
		} else if slices.ContainsFunc(out, func(d v1.Descriptor) bool { return d.Digest == desc.Digest }) {
			// Already held under a name; nothing to add but the chain.
			for i := range out {
				if out[i].Digest == desc.Digest && len(chain) > 0 {
					out[i].Annotations = withChain(out[i].Annotations, chain)
				}
			}
			idx.Manifests = out
			return nil
		}
		if len(chain) > 0 {
			nd.Annotations = withChain(nd.Annotations, chain)
		} else {
			// Keep a chain an earlier record of this image had.
			for _, d := range idx.Manifests {
				if d.Digest == desc.Digest && d.Annotations[annotationChain] != "" {
					nd.Annotations[annotationChain] = d.Annotations[annotationChain]
					break
				}
			}
		}
		if len(nd.Annotations) == 0 {
			nd.Annotations = nil
		}
		out = append(out, nd)
		// An image whose last name moved away stays, unnamed, as docker keeps a dangling
		// image: its digest still names it until it is removed.
		for _, m := range moved {
			if !slices.ContainsFunc(out, func(d v1.Descriptor) bool { return d.Digest == m.Digest }) {
				delete(m.Annotations, annotationRef)
				if len(m.Annotations) == 0 {
					m.Annotations = nil
				}
				out = append(out, m)
			}
		}
		idx.Manifests = out
		return nil
	})
}

func withChain(a map[string]string, chain []string) map[string]string {
	if a == nil {
		a = map[string]string{}
	}
	a[annotationChain] = strings.Join(chain, " ")
	return a
}

// lookupRef returns the manifest digest a canonical ref names.
func (s *Store) lookupRef(ref string) (v1.Hash, bool, error) {
	idx, err := s.readIndex()
	if err != nil {
		return v1.Hash{}, false, err
	}
	for _, d := range idx.Manifests {
		if d.Annotations[annotationRef] == ref {
			return d.Digest, true, nil
		}
	}
	return v1.Hash{}, false, nil
}

// lookupDigest reports whether the index holds the image with manifest digest d.
func (s *Store) lookupDigest(d v1.Hash) (v1.Descriptor, bool, error) {
	idx, err := s.readIndex()
	if err != nil {
		return v1.Descriptor{}, false, err
	}
	for _, m := range idx.Manifests {
		if m.Digest == d {
			return m, true, nil
		}
	}
	return v1.Descriptor{}, false, nil
}

// ---- listing and removal ----

// ImageInfo is one image the store holds.
type ImageInfo struct {
	Digest string   // manifest digest
	Refs   []string // familiar spelling ("alpine:3.20"), sorted
	Size   int64    // config and layer blobs, as stored
}

// List returns the images in the index, by digest.
func (s *Store) List(ctx context.Context) ([]ImageInfo, error) {
	idx, err := s.readIndex()
	if err != nil {
		return nil, err
	}
	byDigest := map[v1.Hash]*ImageInfo{}
	var order []v1.Hash
	for _, d := range idx.Manifests {
		info, ok := byDigest[d.Digest]
		if !ok {
			in := s.info(d.Digest)
			info = &in
			byDigest[d.Digest] = info
			order = append(order, d.Digest)
		}
		if r := d.Annotations[annotationRef]; r != "" {
			info.Refs = append(info.Refs, image.Familiar(r))
		}
	}
	out := make([]ImageInfo, 0, len(order))
	for _, d := range order {
		slices.Sort(byDigest[d].Refs)
		out = append(out, *byDigest[d])
	}
	return out, nil
}

// info describes the stored image d with the given (canonical) refs.
func (s *Store) info(d v1.Hash, refs ...string) ImageInfo {
	in := ImageInfo{Digest: d.String()}
	if m, err := s.manifest(d); err == nil {
		in.Size = m.Config.Size
		for _, l := range m.Layers {
			in.Size += l.Size
		}
	}
	for _, r := range refs {
		if r != "" {
			in.Refs = append(in.Refs, image.Familiar(r))
		}
	}
	return in
}

// ListImages answers list_images.
func (s *Store) ListImages(ctx context.Context) ([]protocol.ImageEntry, error) {
	infos, err := s.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]protocol.ImageEntry, len(infos))
	for i, in := range infos {
		out[i] = protocol.ImageEntry{Digest: in.Digest, Refs: in.Refs}
	}
	return out, nil
}

// RemoveImage answers remove_image: see Remove.
func (s *Store) RemoveImage(ctx context.Context, src *protocol.ImageSource) error {
	switch src.Type {
	case protocol.ImageRef:
		return s.Remove(ctx, src.Ref)
	case protocol.ImageDigest:
		return s.Remove(ctx, src.Digest)
	case protocol.ImageRecipe:
		d, ok, err := s.cachedRecipe(ctx, src.Recipe)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %s: not built", backend.ErrUnknownImage, src)
		}
		return s.Remove(ctx, d.String())
	}
	return fmt.Errorf("%w: image source type %q", backend.ErrInvalidSpec, src.Type)
}

// Remove drops a ref (the image goes when its last ref does) or a digest (every ref to
// it), then collects what nothing references. An unknown name wraps
// backend.ErrUnknownImage.
func (s *Store) Remove(ctx context.Context, refOrDigest string) error {
	var match func(v1.Descriptor) bool
	var canon string
	if protocol.ValidDigest(refOrDigest) {
		h, _ := v1.NewHash(refOrDigest)
		match = func(d v1.Descriptor) bool { return d.Digest == h }
	} else {
		c, err := image.Normalize(refOrDigest)
		if err != nil {
			return fmt.Errorf("%w: %v", backend.ErrUnknownImage, err)
		}
		canon = c
		match = func(d v1.Descriptor) bool { return d.Annotations[annotationRef] == canon }
	}
	found := false
	err := s.updateIndex(ctx, func(idx *v1.IndexManifest) error {
		n := len(idx.Manifests)
		idx.Manifests = slices.DeleteFunc(idx.Manifests, match)
		found = len(idx.Manifests) < n
		return nil
	})
	if err != nil {
		return fmt.Errorf("remove %s: %w", refOrDigest, err)
	}
	if !found {
		return fmt.Errorf("%w: %s", backend.ErrUnknownImage, refOrDigest)
	}
	if _, err := s.GC(ctx); err != nil {
		return fmt.Errorf("remove %s: %w", refOrDigest, err)
	}
	return nil
}

// GCStats says what a collection removed.
type GCStats struct {
	Blobs, Layers, CacheEntries int
	Derived                     int // images whose derived files (Derived) went
	Skipped                     int // layers in use by a session, left for a later collection
}

// GC deletes the blobs, unpacked layers, build-cache entries and derived files no image
// in the index references (directly, or through a build chain), and everything in tmp/.
// It waits for running pulls, builds and Derived to finish.
func (s *Store) GC(ctx context.Context) (GCStats, error) {
	var st GCStats
	l, err := lockPath(ctx, s.lockFile("gc"), exclusive)
	if err != nil {
		return st, err
	}
	defer l.unlock()
	idx, err := s.readIndex()
	if err != nil {
		return st, err
	}
	liveManifests := map[v1.Hash]bool{}
	for _, d := range idx.Manifests {
		liveManifests[d.Digest] = true
		for _, c := range strings.Fields(d.Annotations[annotationChain]) {
			if h, err := v1.NewHash(c); err == nil {
				liveManifests[h] = true
			}
		}
	}
	liveBlobs := map[string]bool{}
	liveLayers := map[string]bool{}
	liveHex := map[string]bool{}
	for m := range liveManifests {
		liveHex[m.Hex] = true
		man, err := s.manifest(m)
		if err != nil {
			s.log.Warn("image store: a live image's manifest is unreadable; keeping everything it may need", "digest", m, "err", err)
			continue
		}
		liveBlobs[m.Hex] = true
		liveBlobs[man.Config.Digest.Hex] = true
		for _, ld := range man.Layers {
			liveBlobs[ld.Digest.Hex] = true
		}
		cfg, err := s.configFile(man.Config.Digest)
		if err != nil {
			continue
		}
		for _, id := range cfg.RootFS.DiffIDs {
			liveLayers[id.Hex] = true
		}
	}
	// Build cache entries pointing at images that are gone.
	entries, _ := os.ReadDir(filepath.Join(s.root, "buildcache"))
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(s.root, "buildcache", e.Name()))
		h, herr := v1.NewHash(strings.TrimSpace(string(b)))
		if err != nil || herr != nil || !liveManifests[h] {
			if os.Remove(filepath.Join(s.root, "buildcache", e.Name())) == nil {
				st.CacheEntries++
			}
		}
	}
	blobs, _ := os.ReadDir(filepath.Join(s.root, "blobs", "sha256"))
	for _, b := range blobs {
		if !liveBlobs[b.Name()] {
			if os.Remove(filepath.Join(s.root, "blobs", "sha256", b.Name())) == nil {
				st.Blobs++
			}
			os.Remove(s.lockFile("blob-" + b.Name()))
		}
	}
	layers, _ := os.ReadDir(filepath.Join(s.root, "layers"))
	for _, e := range layers {
		name := e.Name()
		if liveLayers[name] {
			continue
		}
		ll, ok, err := tryLockPath(s.lockFile("layer-"+name), exclusive)
		if err != nil {
			return st, err
		}
		if !ok {
			st.Skipped++ // a session holds it
			continue
		}
		if err := removeTree(filepath.Join(s.root, "layers", name)); err != nil {
			ll.unlock()
			return st, fmt.Errorf("gc: %w", err)
		}
		os.Remove(s.lockFile("layer-" + name))
		ll.unlock()
		st.Layers++
	}
	st.Derived = s.collectDerived(liveHex)
	tmps, _ := os.ReadDir(filepath.Join(s.root, "tmp"))
	for _, t := range tmps {
		removeTree(filepath.Join(s.root, "tmp", t.Name()))
	}
	s.log.Debug("image store: collected", "blobs", st.Blobs, "layers", st.Layers, "cache", st.CacheEntries, "derived", st.Derived, "in use", st.Skipped)
	return st, nil
}

// removeTree removes a directory tree, making read-only directories writable first.
func removeTree(p string) error {
	err := os.RemoveAll(p)
	if err == nil {
		return nil
	}
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(q, 0o755)
		}
		return nil
	})
	return os.RemoveAll(p)
}

func (s *Store) manifest(d v1.Hash) (*v1.Manifest, error) {
	f, err := os.Open(s.blobPath(d))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return v1.ParseManifest(f)
}

func (s *Store) configFile(d v1.Hash) (*v1.ConfigFile, error) {
	f, err := os.Open(s.blobPath(d))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return v1.ParseConfigFile(f)
}

// has reports whether every blob of the image d is in the store.
func (s *Store) has(d v1.Hash) bool {
	m, err := s.manifest(d)
	if err != nil {
		return false
	}
	if _, err := os.Stat(s.blobPath(m.Config.Digest)); err != nil {
		return false
	}
	for _, l := range m.Layers {
		if _, err := os.Stat(s.blobPath(l.Digest)); err != nil {
			return false
		}
	}
	return true
}

var _ backend.ImageStore = (*Store)(nil)

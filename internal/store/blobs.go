package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"hash"
	"io"
	"os"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// hashingWriter writes to a file while hashing what it writes.
type hashingWriter struct {
	f *os.File
	h hash.Hash
	n int64
}

func (w *hashingWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.h.Write(p[:n])
	w.n += int64(n)
	return n, err
}

func (w *hashingWriter) digest() v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(w.h.Sum(nil))}
}

// fetchBlob puts the blob want into blobs/ unless it is there: under the blob's lock,
// read from open into tmp/, check the digest, rename. Two processes fetching one blob
// fetch it once.
func (s *Store) fetchBlob(ctx context.Context, want v1.Hash, open func() (io.ReadCloser, error)) (fetched bool, err error) {
	if want.Algorithm != "sha256" {
		return false, fmt.Errorf("blob %s: only sha256 digests are supported", want)
	}
	if _, err := os.Stat(s.blobPath(want)); err == nil {
		return false, nil
	}
	l, err := lockPath(ctx, s.lockFile("blob-"+want.Hex), exclusive)
	if err != nil {
		return false, err
	}
	defer l.unlock()
	if _, err := os.Stat(s.blobPath(want)); err == nil {
		return false, nil // somebody else fetched it while we waited
	}
	s.clearTemps(want.Hex)
	f, err := s.tempFile(want.Hex)
	if err != nil {
		return false, fmt.Errorf("blob %s: %w", want, err)
	}
	defer os.Remove(f.Name()) // after a successful rename this is a no-op
	rc, err := open()
	if err != nil {
		f.Close()
		return false, fmt.Errorf("blob %s: %w", want, err)
	}
	hw := &hashingWriter{f: f, h: sha256.New()}
	_, err = io.Copy(hw, ctxReader{ctx, rc})
	rc.Close()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("blob %s: %w", want, err)
	}
	if got := hw.digest(); got != want {
		return false, fmt.Errorf("blob %s: content has digest %s", want, got)
	}
	os.Chmod(f.Name(), 0o444)
	if err := os.Rename(f.Name(), s.blobPath(want)); err != nil {
		return false, fmt.Errorf("blob %s: %w", want, err)
	}
	return true, nil
}

// putBlob stores data, whose digest it computes, and returns it.
func (s *Store) putBlob(ctx context.Context, data []byte) (v1.Hash, error) {
	sum := sha256.Sum256(data)
	d := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	_, err := s.fetchBlob(ctx, d, func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	return d, err
}

// putStream stores what r yields as a blob and returns its digest and size.
func (s *Store) putStream(ctx context.Context, r io.Reader) (v1.Hash, int64, error) {
	f, err := s.tempFile("stream-" + randomHex())
	if err != nil {
		return v1.Hash{}, 0, err
	}
	defer os.Remove(f.Name())
	hw := &hashingWriter{f: f, h: sha256.New()}
	_, err = io.Copy(hw, ctxReader{ctx, r})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return v1.Hash{}, 0, fmt.Errorf("store blob: %w", err)
	}
	d := hw.digest()
	_, err = s.fetchBlob(ctx, d, func() (io.ReadCloser, error) { return os.Open(f.Name()) })
	return d, hw.n, err
}

// ctxReader stops a copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// writeImage stores img's layers, config and manifest (in that order: a manifest is
// never there before what it names) and returns its descriptor. It does not touch the
// index. prog, when not nil, reports layer downloads.
func (s *Store) writeImage(ctx context.Context, img v1.Image, prog progress) (v1.Descriptor, error) {
	layers, err := img.Layers()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("image layers: %w", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(layers))
	sem := make(chan struct{}, 3)
	for i, l := range layers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[i] = s.writeLayerBlob(ctx, l, prog)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return v1.Descriptor{}, err
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("image config: %w", err)
	}
	if _, err := s.putBlob(ctx, rawCfg); err != nil {
		return v1.Descriptor{}, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("image manifest: %w", err)
	}
	mt, err := img.MediaType()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("image manifest: %w", err)
	}
	d, err := s.putBlob(ctx, raw)
	if err != nil {
		return v1.Descriptor{}, err
	}
	if want, err := img.Digest(); err == nil && want != d {
		return v1.Descriptor{}, fmt.Errorf("image manifest: has digest %s, want %s", d, want)
	}
	return v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: d}, nil
}

func (s *Store) writeLayerBlob(ctx context.Context, l v1.Layer, prog progress) error {
	d, err := l.Digest()
	if err != nil {
		return fmt.Errorf("layer digest: %w", err)
	}
	if _, err := os.Stat(s.blobPath(d)); err == nil {
		return nil
	}
	size, _ := l.Size()
	var lp layerProgress = nopLayerProgress{}
	if prog != nil {
		lp = prog.layer(d.String(), size)
	}
	fetched, err := s.fetchBlob(ctx, d, func() (io.ReadCloser, error) {
		rc, err := l.Compressed()
		if err != nil {
			return nil, err
		}
		return readCloser{lp.wrap(rc), rc}, nil
	})
	lp.done(fetched, err)
	return err
}

type readCloser struct {
	io.Reader
	io.Closer
}

// ---- a layer backed by an uncompressed tar blob ----

// blobLayer is a v1.Layer over an uncompressed tar in blobs/: its digest is its diff_id.
// (go-containerregistry's tarball layers gzip what they are given.)
type blobLayer struct {
	s      *Store
	digest v1.Hash
	size   int64
	mt     types.MediaType
}

func (l *blobLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *blobLayer) DiffID() (v1.Hash, error)            { return l.digest, nil }
func (l *blobLayer) Size() (int64, error)                { return l.size, nil }
func (l *blobLayer) MediaType() (types.MediaType, error) { return l.mt, nil }
func (l *blobLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.s.blobPath(l.digest)) }
func (l *blobLayer) Uncompressed() (io.ReadCloser, error) {
	return os.Open(l.s.blobPath(l.digest))
}

// storeLayerTar stores the uncompressed layer tar r and returns it as a layer whose media
// type suits a manifest of type manifestType.
func (s *Store) storeLayerTar(ctx context.Context, r io.Reader, manifestType types.MediaType) (*blobLayer, error) {
	d, n, err := s.putStream(ctx, r)
	if err != nil {
		return nil, err
	}
	mt := types.OCIUncompressedLayer
	if manifestType == types.DockerManifestSchema2 {
		mt = types.DockerUncompressedLayer
	}
	return &blobLayer{s: s, digest: d, size: n, mt: mt}, nil
}

// ---- reading a stored image ----

// storedImage is an image read from blobs/ by manifest digest, whether or not the index
// names it (go-containerregistry's layout reader wants it in index.json; a build's
// intermediate images are not).
type storedImage struct {
	s      *Store
	digest v1.Hash
	raw    []byte
	man    *v1.Manifest
}

func (s *Store) image(d v1.Hash) (v1.Image, error) {
	raw, err := os.ReadFile(s.blobPath(d))
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", d, err)
	}
	man, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", d, err)
	}
	return partial.CompressedToImage(&storedImage{s: s, digest: d, raw: raw, man: man})
}

func (i *storedImage) RawManifest() ([]byte, error) { return i.raw, nil }

func (i *storedImage) MediaType() (types.MediaType, error) {
	if i.man.MediaType != "" {
		return i.man.MediaType, nil
	}
	return types.OCIManifestSchema1, nil
}

func (i *storedImage) RawConfigFile() ([]byte, error) {
	return os.ReadFile(i.s.blobPath(i.man.Config.Digest))
}

func (i *storedImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	for _, l := range i.man.Layers {
		if l.Digest == h {
			return &storedBlob{s: i.s, desc: l}, nil
		}
	}
	if i.man.Config.Digest == h {
		return &storedBlob{s: i.s, desc: i.man.Config}, nil
	}
	return nil, fmt.Errorf("image %s has no blob %s", i.digest, h)
}

type storedBlob struct {
	s    *Store
	desc v1.Descriptor
}

func (b *storedBlob) Digest() (v1.Hash, error)            { return b.desc.Digest, nil }
func (b *storedBlob) Size() (int64, error)                { return b.desc.Size, nil }
func (b *storedBlob) MediaType() (types.MediaType, error) { return b.desc.MediaType, nil }
func (b *storedBlob) Compressed() (io.ReadCloser, error)  { return os.Open(b.s.blobPath(b.desc.Digest)) }

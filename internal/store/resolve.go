package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"virtx.dev/virtx/image"
	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

// Image is an image ready for a session: its layers unpacked, leased until Release.
type Image struct {
	Digest string   // manifest digest, "sha256:…"
	Lowers []string // unpacked layer directories, top first: overlayfs lowerdir order
	Layers []Layer  // the same layers, bottom first, with their diff_ids
	Config Config

	leases []*fileLock
}

// Layer is one unpacked layer.
type Layer struct {
	DiffID string // "sha256:…" of the uncompressed tar
	Dir    string // layers/<hex>: read-only by convention; never write into it
}

// Config is what a session takes from the image config.
type Config struct {
	Env        []string // KEY=VALUE, in order
	WorkingDir string   // "" when the image sets none
	Entrypoint []string
	Cmd        []string
}

// Release drops the image's leases on its layers, after which the collector may delete
// layers no image references. Call it when the session that mounted them is gone.
func (im *Image) Release() {
	for _, l := range im.leases {
		l.unlock()
	}
	im.leases = nil
}

// Resolve makes the image src names ready: a ref found in the store (else pulled), a
// digest the store holds, or a recipe built (or found in the build cache) with runner
// doing its RUN steps (nil: the store's WithStepRunner). An unknown ref or digest wraps
// backend.ErrUnknownImage and names it. The caller Releases the result.
func (s *Store) Resolve(ctx context.Context, src *protocol.ImageSource, runner StepRunner) (*Image, error) {
	if src == nil {
		return nil, fmt.Errorf("%w: no image source", backend.ErrInvalidSpec)
	}
	gc, err := s.gcShared(ctx)
	if err != nil {
		return nil, err
	}
	defer gc.unlock()
	var d v1.Hash
	switch src.Type {
	case protocol.ImageRef:
		d, err = s.refDigest(ctx, src.Ref, true)
	case protocol.ImageDigest:
		d, err = v1.NewHash(src.Digest)
		if err == nil {
			var ok bool
			if _, ok, err = s.lookupDigest(d); err == nil && !ok {
				err = fmt.Errorf("%w: %s: not in the image store", backend.ErrUnknownImage, src.Digest)
			}
		} else {
			err = fmt.Errorf("%w: %s: %v", backend.ErrUnknownImage, src.Digest, err)
		}
	case protocol.ImageRecipe:
		if runner == nil {
			runner = s.runner
		}
		d, err = s.build(ctx, src.Recipe, BuildOptions{Runner: runner, Context: s.context, Out: s.progress})
	default:
		err = fmt.Errorf("%w: image source type %q", backend.ErrInvalidSpec, src.Type)
	}
	if err != nil {
		return nil, err
	}
	return s.open(ctx, d)
}

// refDigest returns the image a ref names, pulling it when the store has none (and pull
// is allowed). A failure wraps backend.ErrUnknownImage.
func (s *Store) refDigest(ctx context.Context, ref string, pull bool) (v1.Hash, error) {
	r, err := image.ParseReference(ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("%w: %v", backend.ErrUnknownImage, err)
	}
	if d, ok, err := s.lookupRef(r.String()); err != nil || ok {
		return d, err
	}
	if r.Digest != "" {
		h, _ := v1.NewHash(r.Digest)
		if _, ok, err := s.lookupDigest(h); err != nil || ok {
			return h, err
		}
	}
	if !pull || s.noPull {
		return v1.Hash{}, fmt.Errorf("%w: %s: not in the image store", backend.ErrUnknownImage, ref)
	}
	d, err := s.pull(ctx, r)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("%w: %s: %v", backend.ErrUnknownImage, ref, err)
	}
	return d, nil
}

// open unpacks (once) and leases the layers of the stored image d. The caller holds the
// gc lock shared.
func (s *Store) open(ctx context.Context, d v1.Hash) (_ *Image, err error) {
	man, err := s.manifest(d)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: manifest: %v", backend.ErrUnknownImage, d, err)
	}
	cfg, err := s.configFile(man.Config.Digest)
	if err != nil {
		return nil, fmt.Errorf("image %s: config: %w", d, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(man.Layers) {
		return nil, fmt.Errorf("image %s: %d layers but %d diff_ids", d, len(man.Layers), len(cfg.RootFS.DiffIDs))
	}
	im := &Image{Digest: d.String(), Config: Config{
		Env: cfg.Config.Env, WorkingDir: cfg.Config.WorkingDir,
		Entrypoint: cfg.Config.Entrypoint, Cmd: cfg.Config.Cmd,
	}}
	defer func() {
		if err != nil {
			im.Release()
		}
	}()
	var limg v1.Image
	for i, desc := range man.Layers {
		diffID := cfg.RootFS.DiffIDs[i]
		lease, err := s.unpack(ctx, diffID, func() (io.ReadCloser, error) {
			if limg == nil {
				if limg, err = s.image(d); err != nil {
					return nil, err
				}
			}
			l, err := limg.LayerByDigest(desc.Digest)
			if err != nil {
				return nil, err
			}
			return l.Uncompressed()
		})
		if err != nil {
			return nil, fmt.Errorf("image %s: layer %d (%s): %w", d, i+1, desc.Digest, err)
		}
		im.leases = append(im.leases, lease)
		im.Layers = append(im.Layers, Layer{DiffID: diffID.String(), Dir: s.layerDir(diffID)})
	}
	for i := len(im.Layers) - 1; i >= 0; i-- {
		im.Lowers = append(im.Lowers, im.Layers[i].Dir)
	}
	return im, nil
}

// unpack makes layers/<diffID hex> from the uncompressed tar open yields, unless it is
// there, and returns a shared lease on it. The caller holds the gc lock shared.
func (s *Store) unpack(ctx context.Context, diffID v1.Hash, open func() (io.ReadCloser, error)) (*fileLock, error) {
	dir := s.layerDir(diffID)
	lockName := s.lockFile("layer-" + diffID.Hex)
	if _, err := os.Stat(dir); err == nil {
		return lockPath(ctx, lockName, shared)
	}
	l, err := lockPath(ctx, lockName, exclusive)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(dir); err == nil {
		return l, l.downgrade()
	}
	start := time.Now()
	if err := s.unpackLocked(ctx, diffID, open); err != nil {
		l.unlock()
		return nil, err
	}
	s.log.Debug("image store: unpacked layer", "diff_id", diffID, "took", time.Since(start))
	if err := l.downgrade(); err != nil {
		l.unlock()
		return nil, err
	}
	return l, nil
}

func (s *Store) unpackLocked(ctx context.Context, diffID v1.Hash, open func() (io.ReadCloser, error)) error {
	s.clearTemps("layer-" + diffID.Hex)
	tmp := filepath.Join(s.root, "tmp", "layer-"+diffID.Hex+"."+randomHex())
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			removeTree(tmp)
		}
	}()
	rc, err := open()
	if err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	defer rc.Close()
	h := sha256.New()
	tee := io.TeeReader(ctxReader{ctx, rc}, h)
	if err := executor.ApplyLayer(tee, tmp); err != nil {
		return fmt.Errorf("unpack: %w", err)
	}
	if _, err := io.Copy(io.Discard, tee); err != nil { // the tar's padding, so the hash is whole
		return fmt.Errorf("unpack: %w", err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID.String() {
		return fmt.Errorf("unpack: layer content has diff_id %s, the config says %s", got, diffID)
	}
	if err := os.Rename(tmp, s.layerDir(diffID)); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil
		}
		return fmt.Errorf("unpack: %w", err)
	}
	ok = true
	return nil
}

package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/store"
)

// images is what the Backend keeps of the image store: the store, opened on the cache
// dir at first use, and the images resolved for sessions, each leased (its layers kept
// from the collector) and its erofs disk held open until no session of this server can
// boot it any more.
type images struct {
	once  sync.Once
	store *store.Store
	err   error

	mu   sync.Mutex
	held []heldImage
}

type heldImage struct {
	spec *backend.Spec
	im   *store.Image
	disk *os.File // the image's erofs (imageDisk), read-only
}

// imageStore opens the store in the cache dir, once.
func (b *Backend) imageStore(ctx context.Context) (*store.Store, error) {
	im := &b.imgs
	im.once.Do(func() {
		im.store, im.err = store.Open(context.WithoutCancel(ctx), b.cacheDir, store.WithLogger(b.log))
	})
	return im.store, im.err
}

// admitImage resolves spec's image (pulling a ref the store lacks, building a recipe
// without RUN steps), makes (once per image, for every server of this cache) its erofs
// disk, and holds both for the session; it answers the session's cwd: the image's
// working directory, "/" when it sets none.
func (b *Backend) admitImage(ctx context.Context, spec *backend.Spec) (string, error) {
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%w: image %s: the vm backend runs images only when the server is root: the image store's layers carry trusted.overlay xattrs and 0/0 whiteout devices, which only root writes and reads; run `virtx serve` as root, or leave image out for the host image", backend.ErrUnsupportedImage, spec.Image)
	}
	if h := b.heldImage(spec); h != nil {
		return imageCwd(h.im), nil
	}
	mkfs, err := findMkfsErofs()
	if err != nil {
		return "", fmt.Errorf("image %s: %w", spec.Image, err)
	}
	s, err := b.imageStore(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: image %s: the image store: %v", backend.ErrBootFailed, spec.Image, err)
	}
	im, err := s.Resolve(ctx, spec.Image, nil)
	if err != nil {
		if errors.Is(err, store.ErrNoStepRunner) {
			return "", fmt.Errorf("%w: image %s: the vm backend does not run a recipe's RUN steps; build the image with `virtx image build` (or on a sandbox server) and name it by digest or ref: %v", backend.ErrUnsupportedImage, spec.Image, err)
		}
		return "", fmt.Errorf("image %s: %w", spec.Image, err)
	}
	disk, err := b.imageDisk(ctx, s, im, mkfs)
	if err != nil {
		im.Release()
		return "", fmt.Errorf("image %s: %w", spec.Image, err)
	}
	b.imgs.mu.Lock()
	b.imgs.held = append(b.imgs.held, heldImage{spec, im, disk})
	b.imgs.mu.Unlock()
	return imageCwd(im), nil
}

// heldImage is the image resolved for spec, nil if none.
func (b *Backend) heldImage(spec *backend.Spec) *heldImage {
	b.imgs.mu.Lock()
	defer b.imgs.mu.Unlock()
	for i := range b.imgs.held {
		if b.imgs.held[i].spec == spec {
			h := b.imgs.held[i]
			return &h
		}
	}
	return nil
}

// releaseImages drops the leases of every session's image but those of keep: an init
// that succeeded replaces the session, so the images of the others are no one's.
func (b *Backend) releaseImages(keep ...*backend.Spec) {
	b.imgs.mu.Lock()
	defer b.imgs.mu.Unlock()
	var held []heldImage
next:
	for _, h := range b.imgs.held {
		for _, k := range keep {
			if h.spec == k {
				held = append(held, h)
				continue next
			}
		}
		h.im.Release()
		h.disk.Close()
	}
	b.imgs.held = held
}

func imageCwd(im *store.Image) string {
	if im.Config.WorkingDir == "" {
		return "/"
	}
	return im.Config.WorkingDir
}

// imageEnv is a command's environment on an image: the image config's Env, with PATH,
// HOME and HOSTNAME added when it sets none (as docker does).
func imageEnv(env []string, hostname string) []string {
	out := append([]string(nil), env...)
	have := map[string]bool{}
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		have[k] = true
	}
	for _, d := range []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root", "HOSTNAME=" + hostname,
	} {
		if k, _, _ := strings.Cut(d, "="); !have[k] {
			out = append(out, d)
		}
	}
	return out
}

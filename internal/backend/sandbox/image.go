package sandbox

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/store"
	"virtx.dev/virtx/protocol"
)

// errRootlessImages is why a server that is not root refuses images: the store's layers
// mark opaque directories with trusted.overlay.opaque, which only root writes and only a
// root overlay reads.
const errRootlessImages = "the sandbox runs images only when the server is root: the image store unpacks layers with trusted.overlay xattrs (opaque directories) and 0/0 whiteout devices, which a server without privileges can neither write nor stack; run `virtx serve` as root, or leave image out for this host's own image"

// images is what the Backend keeps of the image store: the store, opened on the cache
// dir at first use, and the images resolved for sessions, leased until the session is
// gone.
type images struct {
	once  sync.Once
	store *store.Store
	err   error

	mu    sync.Mutex
	held  map[*backend.Spec]*store.Image // by the spec of the init that asked for it
	order []*backend.Spec
}

// imageStore opens the store in the cache dir (once), with this backend running its
// builds' RUN steps.
func (b *Backend) imageStore(ctx context.Context) (*store.Store, error) {
	im := &b.imgs
	im.once.Do(func() {
		im.store, im.err = store.Open(context.WithoutCancel(ctx), b.cacheDir, store.WithStepRunner(b), store.WithLogger(b.log))
	})
	return im.store, im.err
}

// BuildImage answers build_image (backend.ImageStore): RUN steps run in sandboxes.
func (b *Backend) BuildImage(ctx context.Context, recipe *protocol.Recipe, ref string) (protocol.BuildImageResult, error) {
	if b.rootless && hasRun(recipe) {
		return protocol.BuildImageResult{}, fmt.Errorf("%w: %s", backend.ErrUnsupportedImage, errRootlessImages)
	}
	s, err := b.imageStore(ctx)
	if err != nil {
		return protocol.BuildImageResult{}, fmt.Errorf("the image store: %w", err)
	}
	return s.BuildImage(ctx, recipe, ref)
}

// ListImages answers list_images.
func (b *Backend) ListImages(ctx context.Context) ([]protocol.ImageEntry, error) {
	s, err := b.imageStore(ctx)
	if err != nil {
		return nil, fmt.Errorf("the image store: %w", err)
	}
	return s.ListImages(ctx)
}

// RemoveImage answers remove_image. A session running on the image keeps its layers
// (its lease) until it ends.
func (b *Backend) RemoveImage(ctx context.Context, src *protocol.ImageSource) error {
	s, err := b.imageStore(ctx)
	if err != nil {
		return fmt.Errorf("the image store: %w", err)
	}
	return s.RemoveImage(ctx, src)
}

func hasRun(r *protocol.Recipe) bool {
	if r == nil {
		return false
	}
	for _, s := range r.Steps {
		if s.Kind == protocol.StepRun {
			return true
		}
	}
	return false
}

// admitImage resolves spec's image through the store (pulling a ref it lacks, building
// a recipe it has not built) and holds it for the session; it answers the session's
// cwd: the image's working directory, "/" when it sets none. A spec already resolved
// (Boot admits again) is not resolved twice.
func (b *Backend) admitImage(ctx context.Context, spec *backend.Spec) (string, error) {
	if b.rootless {
		return "", fmt.Errorf("%w: image %s: %s", backend.ErrUnsupportedImage, spec.Image, errRootlessImages)
	}
	if im := b.heldImage(spec); im != nil {
		return imageCwd(im), nil
	}
	s, err := b.imageStore(ctx)
	if err != nil {
		return "", fmt.Errorf("%w: image %s: the image store: %v", backend.ErrBootFailed, spec.Image, err)
	}
	im, err := s.Resolve(ctx, spec.Image, b)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", spec.Image, err)
	}
	b.imgs.mu.Lock()
	if b.imgs.held == nil {
		b.imgs.held = map[*backend.Spec]*store.Image{}
	}
	if old := b.imgs.held[spec]; old != nil {
		old.Release()
	} else {
		b.imgs.order = append(b.imgs.order, spec)
	}
	b.imgs.held[spec] = im
	b.imgs.mu.Unlock()
	return imageCwd(im), nil
}

// heldImage is the image resolved for spec, nil if none.
func (b *Backend) heldImage(spec *backend.Spec) *store.Image {
	b.imgs.mu.Lock()
	defer b.imgs.mu.Unlock()
	return b.imgs.held[spec]
}

// releaseImages drops the leases of every session's image but those of keep (the
// session being admitted or booted, and the one still booted): an init replaces the
// session, so the others' images are no one's any more. Close passes none.
func (b *Backend) releaseImages(keep ...*backend.Spec) {
	b.imgs.mu.Lock()
	defer b.imgs.mu.Unlock()
	var order []*backend.Spec
next:
	for _, s := range b.imgs.order {
		for _, k := range keep {
			if s == k {
				order = append(order, s)
				continue next
			}
		}
		b.imgs.held[s].Release()
		delete(b.imgs.held, s)
	}
	b.imgs.order = order
}

func imageCwd(im *store.Image) string {
	if im.Config.WorkingDir == "" {
		return "/"
	}
	return im.Config.WorkingDir
}

// imageEnv is a command's environment on an image: the image config's Env, with PATH,
// HOME and HOSTNAME added when it sets none (as docker does).
func imageEnv(env []string) []string {
	out := append([]string(nil), env...)
	have := map[string]bool{}
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		have[k] = true
	}
	for _, d := range defaultEnv {
		if k, _, _ := strings.Cut(d, "="); !have[k] {
			out = append(out, d)
		}
	}
	return out
}

// admitted finishes an Admit that refused nothing: it resolves spec's image, if it has
// one, and lets go of the images of sessions this one replaces (all but the one still
// booted, which goes at the next boot).
func (b *Backend) admitted(ctx context.Context, spec *backend.Spec) (string, error) {
	cwd := DefaultCwd
	if spec.Image != nil {
		var err error
		if cwd, err = b.admitImage(ctx, spec); err != nil {
			return "", err
		}
	}
	b.mu.Lock()
	var booted *backend.Spec
	if b.state != nil {
		booted = b.state.spec
	}
	b.mu.Unlock()
	b.releaseImages(spec, booted)
	return cwd, nil
}

package cli

import (
	"context"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/internal/backend/sandbox"
	"virtx.dev/virtx/internal/store"
)

// `virtx image build` runs RUN steps in sandboxes (this binary's own __sandbox-init), as
// build_image does in `virtx serve --backend sandbox`.
func init() {
	imageStepRunner = func(ctx context.Context) (store.StepRunner, func(), error) {
		if err := sandbox.Available(); err != nil {
			return nil, nil, err
		}
		opts := []sandbox.Option{sandbox.WithLogger(logger("").With("backend", "sandbox"))}
		if dir, err := console.CacheDir(); err == nil {
			opts = append(opts, sandbox.WithCacheDir(dir))
		}
		b := sandbox.New(opts...)
		return b, func() { b.Close() }, nil
	}
}

package server

import (
	"context"
	"fmt"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/protocol"
)

// The image methods need no init. A backend that keeps no images (host) answers build
// with UNSUPPORTED_IMAGE, lists none, and knows none to remove.

func (s *Server) store() (backend.ImageStore, bool) {
	st, ok := s.backend.(backend.ImageStore)
	return st, ok
}

func (s *Server) buildImage(ctx context.Context, p *protocol.BuildImageParams) (protocol.Payload, error) {
	st, ok := s.store()
	if !ok {
		return nil, fmt.Errorf("%w: the %s backend keeps no images (its commands run on this machine's own filesystem); serve with --backend sandbox or vm to build", backend.ErrUnsupportedImage, s.backend.Name())
	}
	res, err := st.BuildImage(ctx, p.Recipe, p.Ref)
	if err != nil {
		return nil, err
	}
	return &res, nil
}

func (s *Server) listImages(ctx context.Context) (protocol.Payload, error) {
	res := &protocol.ListImagesResult{Images: []protocol.ImageEntry{}}
	if st, ok := s.store(); ok {
		imgs, err := st.ListImages(ctx)
		if err != nil {
			return nil, err
		}
		res.Images = append(res.Images, imgs...)
	}
	return res, nil
}

func (s *Server) removeImage(ctx context.Context, p *protocol.RemoveImageParams) error {
	st, ok := s.store()
	if !ok {
		return fmt.Errorf("%w: %s: the %s backend keeps no images", backend.ErrUnknownImage, p.Image, s.backend.Name())
	}
	return st.RemoveImage(ctx, p.Image)
}

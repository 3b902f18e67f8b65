package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/linux"
	"virtx.dev/virtx/protocol"
)

// unknownImageKind is what Admit answers for an image the store lacks: UNKNOWN_IMAGE as
// root, UNSUPPORTED_IMAGE rootless (the store's layers need root).
func unknownImageKind() error {
	if os.Geteuid() != 0 {
		return backend.ErrUnsupportedImage
	}
	return backend.ErrUnknownImage
}

func TestImageEnv(t *testing.T) {
	got := strings.Join(imageEnv([]string{"PATH=/bin", "A=b"}), " ")
	if want := "PATH=/bin A=b HOME=/root HOSTNAME=" + Hostname; got != want {
		t.Errorf("imageEnv: %q, want %q", got, want)
	}
}

// TestImageLowerMany: more layers than one lowerdir= option holds (with the store's
// 100-character paths) stack through lowerdir+.
func TestImageLowerMany(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: an overlay in the trusted. namespace")
	}
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 40), "layers")
	var lowers []string
	for i := range 60 {
		l := filepath.Join(dir, strings.Repeat("0", 62)+string(rune('a'+i/26))+string(rune('a'+i%26)))
		if err := os.MkdirAll(l, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(l, "f"), []byte{byte(i)}, 0o644)
		lowers = append(lowers, l)
	}
	if n := len(strings.Join(lowers, ":")); n < 4096 {
		t.Fatalf("only %d bytes of lowerdir", n)
	}
	fd, err := imageLower(lowers)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	b, err := os.ReadFile(linux.FdPath(fd) + "/f")
	if err != nil || len(b) != 1 || b[0] != 0 {
		t.Fatalf("the top layer's f: %v %v", b, err)
	}
}

// TestImageRootlessRefused: a server that is not root refuses images at init, and RUN
// steps, saying why, without pulling or building anything.
func TestImageRootlessRefused(t *testing.T) {
	b := New(WithCacheDir(t.TempDir()))
	b.rootless = true
	defer b.Close()
	spec := &backend.Spec{Image: &protocol.ImageSource{Type: protocol.ImageRef, Ref: "docker.io/library/alpine:3.20"}}
	_, err := b.admitImage(context.Background(), spec) // Admit's image part: the rest is others' to refuse
	if !errors.Is(err, backend.ErrUnsupportedImage) || !strings.Contains(err.Error(), "root") {
		t.Fatalf("rootless image: %v, want unsupported image saying why", err)
	}
	if _, err := b.RunStep(context.Background(), nil, nil, "/", "true", nil); !errors.Is(err, backend.ErrUnsupportedImage) {
		t.Fatalf("rootless RUN: %v", err)
	}
}

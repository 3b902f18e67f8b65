package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/store"
)

// erofsName is the name of an image's erofs among the store's derived files of that
// image. The number is the format of its making: bump it whenever buildErofs makes a
// different file from the same layers, and the old one goes at the next use.
const erofsName = "vm-1.erofs"

// erofsPackage is the Debian package that has mkfs.erofs.
const erofsPackage = "erofs-utils"

// erofsBuilds counts the erofs images this process made (tests).
var erofsBuilds atomic.Int64

// findMkfsErofs finds mkfs.erofs or says which package brings it.
func findMkfsErofs() (string, error) {
	p, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return "", fmt.Errorf("%w: mkfs.erofs is not installed (the vm backend gives a guest an OCI image as an erofs disk made by it): run `apt-get install %s`", backend.ErrBootFailed, erofsPackage)
	}
	return p, nil
}

// imageDisk answers the erofs of im, open read-only: the store's derived file of the
// image, made by buildErofs the first time any server asks for it. The caller keeps it
// open for as long as a session may boot on the image (the store's collector may
// unlink it once the image is removed; the open file is what QEMU reads).
func (b *Backend) imageDisk(ctx context.Context, s *store.Store, im *store.Image, mkfs string) (*os.File, error) {
	f, err := s.Derived(ctx, im.Digest, erofsName, func(ctx context.Context, out string) error {
		return b.buildErofs(ctx, mkfs, im.Lowers, out)
	})
	if err != nil {
		if errors.Is(err, backend.ErrBootFailed) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: image %s: its erofs disk: %v", backend.ErrBootFailed, im.Digest, err)
	}
	// Older formats of the same image's erofs: nobody will make or use them again.
	if olds, _ := filepath.Glob(filepath.Join(filepath.Dir(s.DerivedPath(im.Digest, erofsName)), "vm-*.erofs")); len(olds) > 0 {
		for _, o := range olds {
			if filepath.Base(o) != erofsName {
				os.Remove(o)
			}
		}
	}
	return f, nil
}

// buildErofs writes to out one erofs filesystem of the image whose layer directories
// are lowers (top first), flattened: the layers are stacked as a read-only overlay in
// a mount namespace of its own, so the kernel's overlayfs applies the whiteouts (0/0
// character devices) and opaque directories (trusted.overlay.opaque) exactly as a
// session's root would, and mkfs.erofs reads the merged tree. Overlayfs hides its own
// trusted.overlay.* attributes and the whiteouts; everything else — modes, owners,
// mtimes (--preserve-mtime), other xattrs (security.capability included), device
// nodes, fifos, symlinks, and hard links (one inode, found by mkfs.erofs from the
// lower's device and inode numbers) — goes into the image as it is. No compression:
// the guest reads it under TCG, where decompressing would cost its CPU at every read.
//
// The namespace holds a tmpfs with the layers as symlinks 0 … N-1 and an empty bottom
// layer (overlayfs wants two lowers without an upper), named relative to it so that
// no count of layers outgrows mount(2)'s one page of options. mkfs.erofs is the only
// process in that namespace: when it exits, the namespace and its mounts are gone, and
// nothing was ever mounted where the host sees it.
func (b *Backend) buildErofs(ctx context.Context, mkfs string, lowers []string, out string) error {
	start := time.Now()
	run, err := newRunDir(b.cacheDir)
	if err != nil {
		return fmt.Errorf("%w: erofs: run dir: %v", backend.ErrBootFailed, err)
	}
	defer os.RemoveAll(run)
	src := filepath.Join(run, "erofs")
	if err := os.Mkdir(src, 0o755); err != nil {
		return fmt.Errorf("%w: erofs: %v", backend.ErrBootFailed, err)
	}
	var log bytes.Buffer
	cmd := exec.Command(mkfs, "--quiet", "--preserve-mtime", out, filepath.Join(src, "merged"))
	cmd.Stdout, cmd.Stderr = &log, &log
	build := func() error {
		if err := unix.Mount("tmpfs", src, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
			return fmt.Errorf("mount tmpfs on %s: %w", src, err)
		}
		names := make([]string, 0, len(lowers)+1)
		seen := map[string]bool{}
		for i, l := range lowers {
			// A layer the image has twice (empty layers often are): overlayfs refuses a
			// directory twice, and the lower one adds nothing — whatever it holds, the
			// upper one has above everything in between.
			if seen[l] {
				continue
			}
			seen[l] = true
			n := strconv.Itoa(i)
			if err := os.Symlink(l, filepath.Join(src, n)); err != nil {
				return err
			}
			names = append(names, n)
		}
		for _, d := range []string{"empty", "merged"} {
			if err := os.Mkdir(filepath.Join(src, d), 0o755); err != nil {
				return err
			}
		}
		if len(lowers) == 0 {
			cmd.Args[len(cmd.Args)-1] = filepath.Join(src, "empty") // an image of no layers
			return nil
		}
		names = append(names, "empty")
		// The thread's working directory is its own (unshare(CLONE_NEWNS) unshared its
		// fs_struct too), and setns back to the server's namespace resets it.
		if err := unix.Chdir(src); err != nil {
			return err
		}
		opts := "lowerdir=" + strings.Join(names, ":") + ",redirect_dir=off,metacopy=off"
		if err := unix.Mount("overlay", "merged", "overlay", unix.MS_RDONLY, opts); err != nil {
			return fmt.Errorf("mount the image's layers as an overlay: %w", err)
		}
		return nil
	}
	if err := theSpawner.inPrivateNS(build, cmd); err != nil {
		if cmd.Process != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		return fmt.Errorf("%w: erofs of the image's layers: %v", backend.ErrBootFailed, err)
	}
	_ = recordPid(run, "mkfs.erofs", cmd.Process.Pid)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		err = ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("%w: mkfs.erofs: %v: %s", backend.ErrBootFailed, err, bytes.TrimSpace(log.Bytes()))
	}
	// Read-only, as the store's blobs are: nothing writes a published image.
	if err := os.Chmod(out, 0o444); err != nil {
		return fmt.Errorf("%w: erofs: %v", backend.ErrBootFailed, err)
	}
	erofsBuilds.Add(1)
	b.log.Debug("vm: image erofs made", "layers", len(lowers), "took", time.Since(start))
	return nil
}

// imageDiskFD is the descriptor QEMU gets an image's erofs on (ExtraFiles[1]; the
// session disk is 3).
const imageDiskFD = 4

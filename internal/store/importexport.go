package store

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"

	"virtx.dev/virtx/image"
	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

// Import stores the image at src and names it ref ("" keeps the name the archive gives,
// if any). src is one of:
//
//   - an OCI image layout directory (it has an oci-layout file),
//   - any other directory: a root filesystem, which becomes a one-layer image,
//   - a `docker save` archive or an OCI archive (a tar of a layout, as `podman save
//     --format oci-archive` writes), plain, gzip or zstd,
//   - any other tar (plain, gzip or zstd): a root filesystem.
//
// A layout or archive holding several images takes the one whose name is ref, else the
// only one, else the one for this platform.
func (s *Store) Import(ctx context.Context, src, ref string) (ImageInfo, error) {
	var canon string
	if ref != "" {
		r, err := image.ParseReference(ref)
		if err != nil || r.Digest != "" {
			return ImageInfo{}, fmt.Errorf("import: ref %q: want name[:tag]", ref)
		}
		canon = r.String()
	}
	gc, err := s.gcShared(ctx)
	if err != nil {
		return ImageInfo{}, err
	}
	defer gc.unlock()
	scratchDir := filepath.Join(s.root, "tmp", "import."+randomHex())
	defer removeTree(scratchDir)
	img, named, err := s.importImage(ctx, src, canon, scratchDir)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("import %s: %w", src, err)
	}
	if canon == "" {
		canon = named
	}
	desc, err := s.writeImage(ctx, img, nil)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("import %s: %w", src, err)
	}
	if err := s.record(ctx, desc, canon, nil); err != nil {
		return ImageInfo{}, err
	}
	im, err := s.open(ctx, desc.Digest)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("import %s: %w", src, err)
	}
	im.Release()
	return s.info(desc.Digest, canon), nil
}

// importImage reads src as an image; named is a canonical name the source gives it.
// An archive is unpacked into scratchDir, which must outlive the image's use.
func (s *Store) importImage(ctx context.Context, src, canon, scratchDir string) (img v1.Image, named string, err error) {
	fi, err := os.Stat(src)
	if err != nil {
		return nil, "", err
	}
	if fi.IsDir() {
		if _, err := os.Stat(filepath.Join(src, "oci-layout")); err == nil {
			return s.fromLayout(src, canon)
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(executor.WriteLayer(pw, src)) }()
		img, err := s.fromRootfsTar(ctx, pr)
		pr.CloseWithError(errors.New("abandoned"))
		return img, "", err
	}
	kind, err := sniffArchive(src)
	if err != nil {
		return nil, "", err
	}
	switch kind {
	case "oci":
		if err := extractTar(src, scratchDir); err != nil {
			return nil, "", err
		}
		return s.fromLayout(scratchDir, canon)
	case "docker":
		file := src
		if c, _ := compression(src); c != "" {
			f, err := s.tempFile("import-" + randomHex())
			if err != nil {
				return nil, "", err
			}
			defer os.Remove(f.Name())
			r, err := openDecompressed(src)
			if err == nil {
				_, err = io.Copy(f, r)
				r.Close()
			}
			f.Close()
			if err != nil {
				return nil, "", err
			}
			file = f.Name()
		}
		return s.fromDockerArchive(ctx, file, canon)
	}
	r, err := openDecompressed(src)
	if err != nil {
		return nil, "", err
	}
	defer r.Close()
	img, err = s.fromRootfsTar(ctx, r)
	return img, "", err
}

// fromRootfsTar makes a one-layer image of a root filesystem tar.
func (s *Store) fromRootfsTar(ctx context.Context, r io.Reader) (v1.Image, error) {
	base, err := s.baseImage(ctx, scratch, true)
	if err != nil {
		return nil, err
	}
	mt, _ := base.MediaType()
	l, err := s.storeLayerTar(ctx, r, mt)
	if err != nil {
		return nil, err
	}
	return mutate.Append(base, mutate.Addendum{Layer: l, History: v1.History{Created: epoch, CreatedBy: "virtx image import"}, MediaType: l.mt})
}

// fromDockerArchive reads a `docker save` archive. Its layers are plain tars, which
// go-containerregistry would gzip to make a manifest; they are stored as they are instead,
// under an OCI manifest with the archive's config.
func (s *Store) fromDockerArchive(ctx context.Context, file, canon string) (v1.Image, string, error) {
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(file) })
	if err != nil {
		return nil, "", fmt.Errorf("docker archive: %w", err)
	}
	var tag *name.Tag
	named := ""
	for _, d := range m {
		for _, t := range d.RepoTags {
			nt, err := name.NewTag(t)
			if err != nil {
				continue
			}
			r, _ := image.ParseReference(t)
			if canon == "" || r.String() == canon {
				if tag == nil {
					tag, named = &nt, r.String()
				}
			}
		}
	}
	if tag == nil && len(m) > 1 {
		return nil, "", fmt.Errorf("docker archive holds %d images and none is named %s", len(m), image.Familiar(canon))
	}
	img, err := tarball.Image(func() (io.ReadCloser, error) { return os.Open(file) }, tag)
	if err != nil {
		return nil, "", fmt.Errorf("docker archive: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, "", fmt.Errorf("docker archive: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, "", fmt.Errorf("docker archive: %w", err)
	}
	out, err := s.baseImage(ctx, scratch, true)
	if err != nil {
		return nil, "", err
	}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, "", fmt.Errorf("docker archive: layer %d: %w", i+1, err)
		}
		bl, err := s.storeLayerTar(ctx, rc, types.OCIManifestSchema1)
		rc.Close()
		if err != nil {
			return nil, "", fmt.Errorf("docker archive: layer %d: %w", i+1, err)
		}
		if out, err = mutate.Append(out, mutate.Addendum{Layer: bl, MediaType: bl.mt}); err != nil {
			return nil, "", err
		}
	}
	out, err = mutate.ConfigFile(out, cf)
	return out, named, err
}

func (s *Store) fromLayout(dir, canon string) (v1.Image, string, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, "", fmt.Errorf("OCI layout: %w", err)
	}
	return s.pickImage(idx, canon)
}

// pickImage chooses an image from an index: the one named canon, else the only one,
// else the one for the store's platform.
func (s *Store) pickImage(idx v1.ImageIndex, canon string) (v1.Image, string, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, "", err
	}
	var cands []v1.Descriptor
	for _, d := range im.Manifests {
		n := descName(d)
		if canon != "" && n == canon {
			cands = []v1.Descriptor{d}
			break
		}
		cands = append(cands, d)
	}
	if len(cands) > 1 {
		var plat []v1.Descriptor
		for _, d := range cands {
			if d.Platform != nil && d.Platform.Satisfies(s.platform) {
				plat = append(plat, d)
			}
		}
		cands = plat
	}
	if len(cands) != 1 {
		return nil, "", fmt.Errorf("%d images to choose from: name the one to import", len(im.Manifests))
	}
	d := cands[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, "", err
		}
		img, _, err := s.pickImage(child, "")
		return img, descName(d), err
	}
	img, err := idx.Image(d.Digest)
	return img, descName(d), err
}

// descName is the canonical name an index descriptor carries, or "".
func descName(d v1.Descriptor) string {
	for _, k := range []string{"io.containerd.image.name", annotationRef} {
		if v := d.Annotations[k]; v != "" && strings.ContainsAny(v, "/:") {
			if r, err := image.ParseReference(v); err == nil && r.Digest == "" {
				return r.String()
			}
		}
	}
	return ""
}

// compression names the compression of file by its magic: "gzip", "zstd" or "".
func compression(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var m [4]byte
	n, _ := io.ReadFull(f, m[:])
	switch {
	case n >= 2 && m[0] == 0x1f && m[1] == 0x8b:
		return "gzip", nil
	case n == 4 && m == [4]byte{0x28, 0xb5, 0x2f, 0xfd}:
		return "zstd", nil
	}
	return "", nil
}

type multiCloser struct {
	io.Reader
	close func() error
}

func (m multiCloser) Close() error { return m.close() }

// openDecompressed opens file, decompressing gzip or zstd.
func openDecompressed(file string) (io.ReadCloser, error) {
	c, err := compression(file)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(f, 1<<20)
	switch c {
	case "gzip":
		z, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, err
		}
		return multiCloser{z, func() error { z.Close(); return f.Close() }}, nil
	case "zstd":
		z, err := zstd.NewReader(br)
		if err != nil {
			f.Close()
			return nil, err
		}
		return multiCloser{z, func() error { z.Close(); return f.Close() }}, nil
	}
	return multiCloser{br, f.Close}, nil
}

// sniffArchive says what a tar holds: "oci" (an oci-layout file at the top), "docker"
// (a manifest.json at the top) or "rootfs".
func sniffArchive(file string) (string, error) {
	r, err := openDecompressed(file)
	if err != nil {
		return "", err
	}
	defer r.Close()
	tr := tar.NewReader(r)
	kind := "rootfs"
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return kind, nil
		}
		if err != nil {
			return "", fmt.Errorf("%s: not a tar: %w", file, err)
		}
		switch path.Clean(strings.TrimPrefix(hdr.Name, "./")) {
		case "manifest.json":
			if kind != "oci" {
				kind = "docker"
			}
		case "oci-layout":
			kind = "oci" // newer docker saves carry both: the layout keeps the digests
		}
	}
}

// extractTar unpacks an OCI archive (regular files and directories only) into dir.
func extractTar(file, dir string) error {
	r, err := openDecompressed(file)
	if err != nil {
		return err
	}
	defer r.Close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		rel := path.Clean(strings.TrimPrefix(hdr.Name, "/"))
		if rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
			continue
		}
		p := filepath.Join(dir, filepath.FromSlash(rel))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
}

// ---- export ----

// Export writes the image refOrDigest names as an OCI archive: a tar of an OCI layout
// holding it, which `podman load` and `skopeo` read, with a docker manifest.json beside
// it so `docker load` reads it too. The image is named by the ref given, else its refs.
func (s *Store) Export(ctx context.Context, refOrDigest string, w io.Writer) error {
	gc, err := s.gcShared(ctx)
	if err != nil {
		return err
	}
	defer gc.unlock()
	var d v1.Hash
	var names []string
	if protocol.ValidDigest(refOrDigest) {
		d, _ = v1.NewHash(refOrDigest)
		desc, ok, err := s.lookupDigest(d)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: %s", backend.ErrUnknownImage, refOrDigest)
		}
		idx, _ := s.readIndex()
		for _, m := range idx.Manifests {
			if m.Digest == desc.Digest && m.Annotations[annotationRef] != "" {
				names = append(names, m.Annotations[annotationRef])
			}
		}
	} else {
		if d, err = s.refDigest(ctx, refOrDigest, false); err != nil {
			return err
		}
		canon, _ := image.Normalize(refOrDigest)
		names = []string{canon}
	}
	if err := s.writeArchive(d, names, w); err != nil {
		return fmt.Errorf("export %s: %w", refOrDigest, err)
	}
	return nil
}

func (s *Store) writeArchive(d v1.Hash, names []string, w io.Writer) error {
	man, err := s.manifest(d)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(s.blobPath(d))
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	file := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: epoch.Time}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	blob := func(h v1.Hash) error {
		f, err := os.Open(s.blobPath(h))
		if err != nil {
			return err
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: "blobs/sha256/" + h.Hex, Mode: 0o644, Size: st.Size(), Typeflag: tar.TypeReg, ModTime: epoch.Time}); err != nil {
			return err
		}
		_, err = io.Copy(tw, f)
		return err
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: dir, Mode: 0o755, Typeflag: tar.TypeDir, ModTime: epoch.Time}); err != nil {
			return err
		}
	}
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	idx := emptyIndex()
	mt := man.MediaType
	if mt == "" {
		mt = "application/vnd.oci.image.manifest.v1+json"
	}
	if len(names) == 0 {
		idx.Manifests = append(idx.Manifests, v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: d})
	}
	var tags []string
	for _, n := range names {
		idx.Manifests = append(idx.Manifests, v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: d,
			Annotations: map[string]string{annotationRef: n, "io.containerd.image.name": n}})
		if r, err := image.ParseReference(n); err == nil && r.Digest == "" {
			tags = append(tags, r.Familiar())
		}
	}
	if err := file("index.json", mustJSON(idx)); err != nil {
		return err
	}
	dm := []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: "blobs/sha256/" + man.Config.Digest.Hex, RepoTags: tags}}
	for _, l := range man.Layers {
		dm[0].Layers = append(dm[0].Layers, "blobs/sha256/"+l.Digest.Hex)
	}
	dmj, _ := json.Marshal(dm)
	if err := file("manifest.json", dmj); err != nil {
		return err
	}
	seen := map[v1.Hash]bool{}
	for _, h := range append([]v1.Hash{d, man.Config.Digest}, layerDigests(man)...) {
		if seen[h] {
			continue
		}
		seen[h] = true
		if err := blob(h); err != nil {
			return err
		}
	}
	return tw.Close()
}

func layerDigests(m *v1.Manifest) []v1.Hash {
	var out []v1.Hash
	for _, l := range m.Layers {
		out = append(out, l.Digest)
	}
	return out
}

// Commit stores base (a ref or digest the store holds) with the layer tar on top, named
// ref ("" for none): how a session's snapshot becomes an image to export or run on.
func (s *Store) Commit(ctx context.Context, base string, layer io.Reader, ref string) (ImageInfo, error) {
	var canon string
	if ref != "" {
		c, err := image.Normalize(ref)
		if err != nil {
			return ImageInfo{}, err
		}
		canon = c
	}
	gc, err := s.gcShared(ctx)
	if err != nil {
		return ImageInfo{}, err
	}
	defer gc.unlock()
	var d v1.Hash
	if protocol.ValidDigest(base) {
		d, _ = v1.NewHash(base)
		if _, ok, err := s.lookupDigest(d); err != nil || !ok {
			return ImageInfo{}, fmt.Errorf("%w: %s", backend.ErrUnknownImage, base)
		}
	} else if d, err = s.refDigest(ctx, base, false); err != nil {
		return ImageInfo{}, err
	}
	img, err := s.image(d)
	if err != nil {
		return ImageInfo{}, err
	}
	mt, _ := img.MediaType()
	l, err := s.storeLayerTar(ctx, layer, mt)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("commit: %w", err)
	}
	next, err := mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{Created: epoch, CreatedBy: "virtx snapshot"}, MediaType: l.mt})
	if err != nil {
		return ImageInfo{}, err
	}
	desc, err := s.writeImage(ctx, next, nil)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("commit: %w", err)
	}
	if err := s.record(ctx, desc, canon, nil); err != nil {
		return ImageInfo{}, err
	}
	return s.info(desc.Digest, canon), nil
}

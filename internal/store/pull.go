package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"virtx.dev/virtx/image"
)

// MirrorsEnv is the environment variable naming registry mirrors.
const MirrorsEnv = "VIRTX_REGISTRY_MIRRORS"

// MirrorsFile is the mirrors file in the cache dir.
const MirrorsFile = "mirrors.conf"

// Mirrors maps a registry ("docker.io", "ghcr.io", "127.0.0.1:5000") to the mirrors to
// try for it, in order, before the registry itself. A mirror is a URL: scheme (http or
// https), host[:port], and optionally a path that is put before the repository
// ("http://10.0.0.5:5000/hub" serves docker.io/library/alpine as hub/library/alpine).
type Mirrors map[string][]string

// ParseMirrors reads "REGISTRY=URL" pairs separated by commas, spaces or newlines, with
// "#" starting a comment that runs to the end of its line. A registry named more than once
// gets its mirrors in the order given; "index.docker.io" is "docker.io".
func ParseMirrors(s string) (Mirrors, error) {
	m := Mirrors{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		for _, f := range strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
			reg, u, ok := strings.Cut(f, "=")
			if !ok || reg == "" || u == "" {
				return nil, fmt.Errorf("registry mirror %q: want REGISTRY=URL", f)
			}
			pu, err := url.Parse(u)
			if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
				return nil, fmt.Errorf("registry mirror %q: want an http:// or https:// URL", f)
			}
			if reg == name.DefaultRegistry {
				reg = image.DockerHub
			}
			m[reg] = append(m[reg], strings.TrimRight(u, "/"))
		}
	}
	return m, nil
}

// LoadMirrors reads the mirrors from $VIRTX_REGISTRY_MIRRORS, then from
// <cacheDir>/mirrors.conf (the variable's mirrors are tried first).
func LoadMirrors(cacheDir string) (Mirrors, error) {
	m, err := ParseMirrors(os.Getenv(MirrorsEnv))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", MirrorsEnv, err)
	}
	b, err := os.ReadFile(filepath.Join(cacheDir, MirrorsFile))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	fm, err := ParseMirrors(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(cacheDir, MirrorsFile), err)
	}
	for k, v := range fm {
		m[k] = append(m[k], v...)
	}
	return m, nil
}

// sources are the references to try for r: each mirror, then r's own registry.
func (m Mirrors) sources(r image.Reference) ([]name.Reference, error) {
	var out []name.Reference
	suffix := ":" + r.Tag
	if r.Digest != "" {
		suffix = "@" + r.Digest
	}
	for _, mu := range m[r.Registry] {
		u, _ := url.Parse(mu)
		repo := r.Repository
		if p := strings.Trim(u.Path, "/"); p != "" {
			repo = p + "/" + repo
		}
		var opts []name.Option
		if u.Scheme == "http" {
			opts = append(opts, name.Insecure)
		}
		ref, err := name.ParseReference(u.Host+"/"+repo+suffix, opts...)
		if err != nil {
			return nil, fmt.Errorf("mirror %s for %s: %w", mu, r, err)
		}
		out = append(out, ref)
	}
	reg := r.Registry
	if reg == image.DockerHub {
		reg = name.DefaultRegistry
	}
	ref, err := name.ParseReference(reg + "/" + r.Repository + suffix)
	if err != nil {
		return nil, err
	}
	return append(out, ref), nil
}

func hostPlatform() v1.Platform {
	p := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if runtime.GOARCH == "arm64" {
		p.Variant = "v8"
	}
	return p
}

// Pull fetches ref (from a mirror when one is configured), stores and unpacks it, and
// points ref at it. It pulls even when the store already has ref, as docker pull does;
// layers the store has are not fetched again.
func (s *Store) Pull(ctx context.Context, ref string) (ImageInfo, error) {
	r, err := image.ParseReference(ref)
	if err != nil {
		return ImageInfo{}, err
	}
	gc, err := s.gcShared(ctx)
	if err != nil {
		return ImageInfo{}, err
	}
	defer gc.unlock()
	d, err := s.pull(ctx, r)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	im, err := s.open(ctx, d)
	if err != nil {
		return ImageInfo{}, fmt.Errorf("pull %s: %w", ref, err)
	}
	im.Release()
	return s.info(d, r.String()), nil
}

// pull fetches r and records it in the index; the caller holds the gc lock shared.
func (s *Store) pull(ctx context.Context, r image.Reference) (v1.Hash, error) {
	srcs, err := s.mirrors.sources(r)
	if err != nil {
		return v1.Hash{}, err
	}
	opts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(s.keychain),
		remote.WithPlatform(s.platform),
		remote.WithUserAgent("virtx"),
	}
	if s.transport != nil {
		opts = append(opts, remote.WithTransport(s.transport))
	}
	var errs []error
	for _, src := range srcs {
		img, err := remote.Image(src, opts...)
		if err != nil {
			s.log.Debug("image store: source failed", "ref", r, "source", src, "err", err)
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		if src.Context().RegistryStr() != r.Registry {
			s.log.Info("image store: pulling from mirror", "ref", r, "mirror", src)
		}
		prog := newProgress(s.progress, r.Familiar())
		desc, err := s.writeImage(ctx, img, prog)
		prog.wait()
		if err != nil {
			return v1.Hash{}, err // a broken transfer is not a reason to try elsewhere
		}
		if err := s.record(ctx, desc, r.String(), nil); err != nil {
			return v1.Hash{}, err
		}
		return desc.Digest, nil
	}
	return v1.Hash{}, errors.Join(errs...)
}

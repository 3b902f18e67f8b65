// Package image is the public side of virtx's images: how references are spelled and
// normalised, and the one-stage Dockerfile subset that becomes a protocol.Recipe.
//
// # References
//
// A reference names an image the way docker does: `alpine:3.20` is Docker Hub's
// `docker.io/library/alpine:3.20`, `myorg/tool` is `docker.io/myorg/tool:latest`,
// `ghcr.io/org/x@sha256:…` is pinned to one manifest. The store keeps references in
// their canonical form (Normalize) and shows them in their familiar one (Familiar), so
// `alpine:3.20` and `docker.io/library/alpine:3.20` are one name.
//
// # The Dockerfile subset
//
// ParseDockerfile reads FROM, RUN, COPY, ENV and WORKDIR (one stage) into a Recipe, the
// same wire format build_image takes; anything else is refused with an error naming
// `Dockerfile:LINE`, because an instruction accepted and ignored would be a build that
// silently differs from what docker makes of the same file.
package image

import (
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// DockerHub is the registry a reference without a host names, in canonical form.
const DockerHub = "docker.io"

// Reference is a parsed image reference.
type Reference struct {
	Registry   string // canonical host: "docker.io", "ghcr.io", "127.0.0.1:5000"
	Repository string // "library/alpine"
	Tag        string // "" when Digest is set and no tag was written
	Digest     string // "sha256:…" or ""
}

// ParseReference parses ref as docker does (Docker Hub shorthand, `library/`, default tag
// latest, `@sha256:` digests). A reference with both a tag and a digest keeps both; the
// digest is what is pulled.
func ParseReference(ref string) (Reference, error) {
	if ref == "" {
		return Reference{}, fmt.Errorf("image reference: empty")
	}
	base, digest, hasDigest := strings.Cut(ref, "@")
	var r Reference
	if hasDigest {
		d, err := name.NewDigest(stripTag(base) + "@" + digest)
		if err != nil {
			return Reference{}, fmt.Errorf("image reference %q: %w", ref, err)
		}
		r = fromRepo(d.Context())
		r.Digest = d.DigestStr()
		if stripTag(base) != base {
			t, err := name.NewTag(base)
			if err != nil {
				return Reference{}, fmt.Errorf("image reference %q: %w", ref, err)
			}
			r.Tag = t.TagStr()
		}
		return r, nil
	}
	t, err := name.NewTag(base)
	if err != nil {
		return Reference{}, fmt.Errorf("image reference %q: %w", ref, err)
	}
	r = fromRepo(t.Context())
	r.Tag = t.TagStr()
	return r, nil
}

// stripTag drops a ":tag" after the last "/" of s.
func stripTag(s string) string {
	slash := strings.LastIndexByte(s, '/')
	if colon := strings.LastIndexByte(s, ':'); colon > slash {
		return s[:colon]
	}
	return s
}

func fromRepo(repo name.Repository) Reference {
	reg := repo.RegistryStr()
	if reg == name.DefaultRegistry || reg == "docker.io" {
		reg = DockerHub
	}
	return Reference{Registry: reg, Repository: repo.RepositoryStr()}
}

// Name is the repository with its registry: "docker.io/library/alpine".
func (r Reference) Name() string { return r.Registry + "/" + r.Repository }

// String is the canonical reference: "docker.io/library/alpine:3.20",
// "ghcr.io/org/x@sha256:…".
func (r Reference) String() string {
	if r.Digest != "" {
		return r.Name() + "@" + r.Digest
	}
	return r.Name() + ":" + r.Tag
}

// Familiar is the reference as docker shows it: Docker Hub's host and `library/` left out.
func (r Reference) Familiar() string {
	s := r.String()
	if r.Registry == DockerHub {
		s = strings.TrimPrefix(strings.TrimPrefix(s, DockerHub+"/"), "library/")
	}
	return s
}

// Normalize returns ref in canonical form (see Reference.String).
func Normalize(ref string) (string, error) {
	r, err := ParseReference(ref)
	if err != nil {
		return "", err
	}
	return r.String(), nil
}

// Familiar returns ref as docker shows it, or ref unchanged when it does not parse.
func Familiar(ref string) string {
	r, err := ParseReference(ref)
	if err != nil {
		return ref
	}
	return r.Familiar()
}

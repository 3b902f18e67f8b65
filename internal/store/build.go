package store

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"virtx.dev/virtx/image"
	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/protocol"
)

// StepRunner runs a build's RUN step: `sh -c shellCmd` in a session whose root is the
// overlay of lowers (layer directories, top first) with a fresh upper directory, network
// on, env as its environment (KEY=VALUE) and workdir as its working directory, writing
// the command's stdout and stderr to output. It returns the session's change, the upper
// directory as an OCI layer tar (internal/executor.WriteLayer), which the store reads to
// EOF and closes. A command that exits non-zero is an error, and no layer.
type StepRunner interface {
	RunStep(ctx context.Context, lowers []string, env []string, workdir string, shellCmd string, output io.Writer) (layer io.ReadCloser, err error)
}

// ErrNoStepRunner is the error of a RUN step when nothing can run it.
var ErrNoStepRunner = errors.New("no session backend to run RUN steps")

// BuildOptions are a build's inputs beyond its recipe.
type BuildOptions struct {
	Ref     string     // the name the result gets; "" for none
	Context string     // the directory COPY sources are relative to
	Runner  StepRunner // runs RUN steps; nil fails a recipe that has one
	Out     io.Writer  // `step i/n: …` lines and RUN output; nil: discarded
}

// scratch is the base that is no image at all.
const scratch = "scratch"

// Build builds recipe (finding every step it can in the build cache), names the result
// opts.Ref when given, and returns it. A failed step fails the build with the step's
// output and caches nothing for that step.
func (s *Store) Build(ctx context.Context, recipe *protocol.Recipe, opts BuildOptions) (ImageInfo, error) {
	var canon string
	if opts.Ref != "" {
		r, err := image.ParseReference(opts.Ref)
		if err != nil || r.Digest != "" {
			return ImageInfo{}, fmt.Errorf("%w: build: ref %q: want name[:tag]", backend.ErrInvalidSpec, opts.Ref)
		}
		canon = r.String()
	}
	gc, err := s.gcShared(ctx)
	if err != nil {
		return ImageInfo{}, err
	}
	defer gc.unlock()
	opts.Ref = canon
	d, err := s.build(ctx, recipe, opts)
	if err != nil {
		return ImageInfo{}, err
	}
	return s.info(d, canon), nil
}

// BuildImage answers build_image: the store's runner and build context.
func (s *Store) BuildImage(ctx context.Context, recipe *protocol.Recipe, ref string) (protocol.BuildImageResult, error) {
	info, err := s.Build(ctx, recipe, BuildOptions{Ref: ref, Context: s.context, Runner: s.runner, Out: s.progress})
	if err != nil {
		return protocol.BuildImageResult{}, err
	}
	return protocol.BuildImageResult{Ref: ref, Digest: info.Digest}, nil
}

// build runs the recipe and records the result (under opts.Ref, canonical, or unnamed).
// The caller holds the gc lock shared.
func (s *Store) build(ctx context.Context, recipe *protocol.Recipe, opts BuildOptions) (v1.Hash, error) {
	d, _, err := s.buildSteps(ctx, recipe, opts, false)
	return d, err
}

// cachedRecipe finds the image recipe built to without building or pulling anything.
func (s *Store) cachedRecipe(ctx context.Context, recipe *protocol.Recipe) (v1.Hash, bool, error) {
	gc, err := s.gcShared(ctx)
	if err != nil {
		return v1.Hash{}, false, err
	}
	defer gc.unlock()
	d, ok, err := s.buildSteps(ctx, recipe, BuildOptions{Context: s.context}, true)
	if err != nil || !ok {
		return v1.Hash{}, false, nil
	}
	_, ok, err = s.lookupDigest(d)
	return d, ok, err
}

// buildSteps does the work of build; with dry, it pulls, runs and records nothing (a COPY
// layer is still stored, for the collector to take) and reports (false, nil error) at the
// first RUN step the cache does not hold.
func (s *Store) buildSteps(ctx context.Context, recipe *protocol.Recipe, opts BuildOptions, dry bool) (v1.Hash, bool, error) {
	if recipe == nil {
		return v1.Hash{}, false, fmt.Errorf("%w: build: no recipe", backend.ErrInvalidSpec)
	}
	if err := recipe.Validate(); err != nil {
		return v1.Hash{}, false, fmt.Errorf("%w: build: %v", backend.ErrInvalidSpec, err)
	}
	out := opts.Out
	if out == nil || dry {
		out = io.Discard
	}
	img, err := s.baseImage(ctx, recipe.Base, dry)
	if err != nil {
		return v1.Hash{}, false, err
	}
	cur, err := img.Digest()
	if err != nil {
		return v1.Hash{}, false, fmt.Errorf("build: base %s: %w", recipe.Base, err)
	}
	var chain []string
	n := len(recipe.Steps)
	for i, st := range recipe.Steps {
		cf, err := img.ConfigFile()
		if err != nil {
			return v1.Hash{}, false, fmt.Errorf("build: step %d/%d: config: %w", i+1, n, err)
		}
		fmt.Fprintf(out, "step %d/%d: %s\n", i+1, n, describeStep(st, cf.Config.WorkingDir))
		if st.Kind == protocol.StepRun {
			key := cacheKey(cur, st)
			if d, ok := s.cacheGet(key); ok {
				if img, err = s.image(d); err != nil {
					return v1.Hash{}, false, err
				}
				cur = d
				chain = append(chain, cur.String())
				continue
			}
			if dry {
				return v1.Hash{}, false, nil
			}
		}
		next, err := s.step(ctx, img, cur, cf, st, opts, out)
		if err != nil {
			return v1.Hash{}, false, fmt.Errorf("build: step %d/%d: %s: %w", i+1, n, st, err)
		}
		if dry {
			img = next
			if cur, err = next.Digest(); err != nil {
				return v1.Hash{}, false, err
			}
			continue
		}
		desc, err := s.writeImage(ctx, next, nil)
		if err != nil {
			return v1.Hash{}, false, fmt.Errorf("build: step %d/%d: %w", i+1, n, err)
		}
		if st.Kind == protocol.StepRun {
			if err := s.cachePut(cacheKey(cur, st), desc.Digest); err != nil {
				return v1.Hash{}, false, err
			}
		}
		cur = desc.Digest
		chain = append(chain, cur.String())
		if img, err = s.image(cur); err != nil {
			return v1.Hash{}, false, err
		}
	}
	if dry {
		return cur, true, nil
	}
	if _, err := os.Stat(s.blobPath(cur)); err != nil {
		// A recipe with no steps over scratch: the empty image is not stored yet.
		if _, err := s.writeImage(ctx, img, nil); err != nil {
			return v1.Hash{}, false, err
		}
	}
	raw, err := img.RawManifest()
	if err != nil {
		return v1.Hash{}, false, err
	}
	mt, _ := img.MediaType()
	if err := s.record(ctx, v1.Descriptor{MediaType: mt, Size: int64(len(raw)), Digest: cur}, opts.Ref, chain); err != nil {
		return v1.Hash{}, false, err
	}
	return cur, true, nil
}

// baseImage is the recipe's base: scratch, or a ref from the store (pulled when missing,
// unless dry).
func (s *Store) baseImage(ctx context.Context, base string, dry bool) (v1.Image, error) {
	if base == scratch {
		img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = s.platform.OS, s.platform.Architecture
		return mutate.ConfigFile(img, cf)
	}
	d, err := s.refDigest(ctx, base, !dry)
	if err != nil {
		return nil, fmt.Errorf("build: base: %w", err)
	}
	return s.image(d)
}

// describeStep is a step as `step i/n:` shows it; a RUN shows where it runs.
func describeStep(st protocol.Step, workdir string) string {
	if st.Kind == protocol.StepRun {
		if workdir == "" {
			workdir = "/"
		}
		return "cd " + shellQuote(workdir) + " && " + st.Run
	}
	return st.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// epoch is the creation time of what a build adds, so one recipe always gives one digest.
var epoch = v1.Time{Time: time.Unix(0, 0).UTC()}

// step applies one step to img (digest cur, config cf) and returns the new image,
// unwritten.
func (s *Store) step(ctx context.Context, img v1.Image, cur v1.Hash, cf *v1.ConfigFile, st protocol.Step, opts BuildOptions, out io.Writer) (v1.Image, error) {
	mt, err := img.MediaType()
	if err != nil {
		return nil, err
	}
	switch st.Kind {
	case protocol.StepEnv, protocol.StepWorkdir:
		cf = cf.DeepCopy()
		if st.Kind == protocol.StepEnv {
			cf.Config.Env = setEnv(cf.Config.Env, st.Key, st.Value)
		} else {
			cf.Config.WorkingDir = st.Workdir
		}
		cf.History = append(cf.History, v1.History{Created: epoch, CreatedBy: st.String(), EmptyLayer: true})
		return mutate.ConfigFile(img, cf)
	case protocol.StepCopy:
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(copyLayer(pw, opts.Context, st.Src, st.Dst)) }()
		l, err := s.storeLayerTar(ctx, pr, mt)
		pr.CloseWithError(errors.New("abandoned"))
		if err != nil {
			return nil, err
		}
		return mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{Created: epoch, CreatedBy: st.String()}, MediaType: l.mt})
	case protocol.StepRun:
		if opts.Runner == nil {
			return nil, fmt.Errorf("%w (this build has none: the store was opened without a StepRunner)", ErrNoStepRunner)
		}
		im, err := s.open(ctx, cur)
		if err != nil {
			return nil, err
		}
		defer im.Release()
		workdir := cf.Config.WorkingDir
		if workdir == "" {
			workdir = "/"
		}
		tail := &tailBuffer{max: 64 << 10}
		layer, err := opts.Runner.RunStep(ctx, im.Lowers, cf.Config.Env, workdir, st.Run, io.MultiWriter(out, tail))
		if err != nil {
			if t := strings.TrimRight(tail.String(), "\n"); t != "" {
				return nil, fmt.Errorf("%w; its output:\n%s", err, t)
			}
			return nil, err
		}
		l, err := s.storeLayerTar(ctx, layer, mt)
		layer.Close()
		if err != nil {
			return nil, err
		}
		return mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{Created: epoch, CreatedBy: "RUN " + st.Run}, MediaType: l.mt})
	}
	return nil, fmt.Errorf("unknown step kind %q", st.Kind)
}

func setEnv(env []string, k, v string) []string {
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if ek, _, _ := strings.Cut(e, "="); ek != k {
			out = append(out, e)
		}
	}
	return append(out, k+"="+v)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	buf bytes.Buffer
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf.Write(p)
	if t.buf.Len() > t.max {
		t.buf.Next(t.buf.Len() - t.max)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return t.buf.String() }

// ---- the build cache ----

// cacheKey is sha256 of the image so far and the step.
func cacheKey(cur v1.Hash, st protocol.Step) string {
	b, _ := json.Marshal(struct {
		V     int
		Image string
		Step  protocol.Step
	}{1, cur.String(), st})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func (s *Store) cacheGet(key string) (v1.Hash, bool) {
	b, err := os.ReadFile(filepath.Join(s.root, "buildcache", key))
	if err != nil {
		return v1.Hash{}, false
	}
	d, err := v1.NewHash(strings.TrimSpace(string(b)))
	if err != nil || !s.has(d) {
		return v1.Hash{}, false
	}
	return d, true
}

func (s *Store) cachePut(key string, d v1.Hash) error {
	return s.atomicWrite(filepath.Join(s.root, "buildcache", key), []byte(d.String()+"\n"))
}

// ---- COPY ----

// copyLayer writes the layer of `COPY src dst`: src (relative to the context dir, which
// it may not leave, also through a symlink) at dst, owned by root, modes and mtimes kept.
// A directory's contents go into dst; a file goes to dst, or into it when dst ends in /.
func copyLayer(w io.Writer, contextDir, src, dst string) error {
	if contextDir == "" {
		return fmt.Errorf("no build context")
	}
	ctxReal, err := filepath.EvalSymlinks(contextDir)
	if err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	real, err := filepath.EvalSymlinks(filepath.Join(ctxReal, filepath.FromSlash(src)))
	if err != nil {
		return fmt.Errorf("source %s: %w", src, err)
	}
	if rel, err := filepath.Rel(ctxReal, real); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return fmt.Errorf("source %s leaves the build context", src)
	}
	st, err := os.Stat(real)
	if err != nil {
		return fmt.Errorf("source %s: %w", src, err)
	}
	tw := tar.NewWriter(w)
	dstClean := strings.TrimPrefix(path.Clean(dst), "/")
	add := func(name string, fi fs.FileInfo, full string) error {
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = name, 0, 0, "", ""
		hdr.ModTime = fi.ModTime().Truncate(time.Second)
		hdr.AccessTime, hdr.ChangeTime, hdr.Format = time.Time{}, time.Time{}, tar.FormatPAX
		switch {
		case fi.Mode().IsDir():
			hdr.Name += "/"
		case fi.Mode()&fs.ModeSymlink != 0:
			if hdr.Linkname, err = os.Readlink(full); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
		default:
			return fmt.Errorf("%s: cannot copy a %s", full, fi.Mode().Type())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(full)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.CopyN(tw, f, fi.Size()); err != nil {
				return err
			}
		}
		return nil
	}
	if !st.IsDir() {
		name := dstClean
		if strings.HasSuffix(dst, "/") {
			name = path.Join(dstClean, path.Base(src))
		}
		if name == "" {
			return fmt.Errorf("COPY of a file to /: name the file")
		}
		if err := add(name, st, real); err != nil {
			return err
		}
		return tw.Close()
	}
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(real, p)
		name := path.Join(dstClean, filepath.ToSlash(rel))
		if rel == "." {
			if dstClean == "" {
				return nil
			}
			name = dstClean
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSocket != 0 {
			return nil
		}
		return add(name, fi, p)
	})
	if err != nil {
		return fmt.Errorf("source %s: %w", src, err)
	}
	return tw.Close()
}

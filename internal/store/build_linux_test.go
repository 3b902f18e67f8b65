package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/protocol"
)

// scriptRunner is the test's StepRunner: it really runs the step, with `sh -c` chrooted
// into an overlay of the lowers and a fresh upper directory, and returns the upper as the
// layer. It is what the sandbox backend will do, minus the namespaces; the real RUN
// runner comes with the store ↔ sandbox integration.
type scriptRunner struct {
	t     testing.TB
	mu    sync.Mutex
	calls int
	seen  []runCall
}

type runCall struct {
	cmd, workdir string
	env          []string
	lowers       int
}

func (r *scriptRunner) RunStep(ctx context.Context, lowers, env []string, workdir, cmd string, out io.Writer) (io.ReadCloser, error) {
	r.mu.Lock()
	r.calls++
	r.seen = append(r.seen, runCall{cmd: cmd, workdir: workdir, env: env, lowers: len(lowers)})
	r.mu.Unlock()
	base, err := os.MkdirTemp("", "virtx-store-run-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(base)
	upper, work, merged, empty := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged"), filepath.Join(base, "empty")
	for _, d := range []string{upper, work, merged, empty} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return nil, err
		}
	}
	if len(lowers) == 0 {
		lowers = []string{empty}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,metacopy=off,redirect_dir=off", strings.Join(lowers, ":"), upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		return nil, fmt.Errorf("overlay: %w", err)
	}
	defer unix.Unmount(merged, unix.MNT_DETACH)
	if err := os.MkdirAll(filepath.Join(merged, workdir), 0o755); err != nil {
		return nil, err
	}
	c := exec.CommandContext(ctx, "/bin/sh", "-c", cmd)
	c.Env, c.Dir, c.Stdout, c.Stderr = env, workdir, out, out
	c.SysProcAttr = &syscall.SysProcAttr{Chroot: merged}
	if err := c.Run(); err != nil {
		return nil, fmt.Errorf("sh -c: %w", err)
	}
	if err := unix.Unmount(merged, 0); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := executor.WriteLayer(&buf, upper); err != nil {
		return nil, err
	}
	return io.NopCloser(&buf), nil
}

// mountImage mounts the image's lowers read-only and returns the mount point.
func mountImage(t testing.TB, im *Image) string {
	t.Helper()
	mnt := t.TempDir()
	lowers := im.Lowers
	if len(lowers) == 1 {
		lowers = append(lowers, t.TempDir()) // a lower-only overlay wants two
	}
	must(t, unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lowers, ":")))
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	return mnt
}

func run(s string) protocol.Step { return protocol.Step{Kind: protocol.StepRun, Run: s} }
func env(k, v string) protocol.Step {
	return protocol.Step{Kind: protocol.StepEnv, Key: k, Value: v}
}
func workdir(d string) protocol.Step { return protocol.Step{Kind: protocol.StepWorkdir, Workdir: d} }
func copyStep(src, dst string) protocol.Step {
	return protocol.Step{Kind: protocol.StepCopy, Src: src, Dst: dst}
}

func baseStore(t testing.TB) (*Store, string) {
	requireRoot(t)
	reg := newRegistry(t)
	ref := reg.push(t, "t/base:1", threeLayers(t))
	return openStore(t, t.TempDir()), ref
}

func TestBuildCache(t *testing.T) {
	s, base := baseStore(t)
	ctx := context.Background()
	runner := &scriptRunner{t: t}
	recipe := &protocol.Recipe{Base: base, Steps: []protocol.Step{run("echo one > /one"), run("echo two > /two"), run("cat /two > /three")}}
	var out bytes.Buffer
	first, err := s.Build(ctx, recipe, BuildOptions{Runner: runner, Out: &out, Ref: "cached:1"})
	must(t, err)
	if runner.calls != 3 {
		t.Fatalf("first build ran %d steps, want 3", runner.calls)
	}
	for _, want := range []string{"step 1/3: cd '/opt/data' && echo one > /one\n", "step 3/3: cd '/opt/data' && cat /two > /three\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	// Rebuilding runs nothing, from this store and from another opened on the directory.
	start := time.Now()
	again, err := s.Build(ctx, recipe, BuildOptions{Runner: runner})
	took := time.Since(start)
	must(t, err)
	if runner.calls != 3 || again.Digest != first.Digest {
		t.Errorf("rebuild ran %d steps (want 0 more), digest %s vs %s", runner.calls-3, again.Digest, first.Digest)
	}
	if took > 100*time.Millisecond {
		t.Errorf("cached rebuild took %v, want < 100ms", took)
	}
	t.Logf("cached rebuild of 3 steps: %v", took)
	// Changing step 2 runs steps 2 and 3 only.
	recipe.Steps[1] = run("echo TWO > /two")
	changed, err := s.Build(ctx, recipe, BuildOptions{Runner: runner})
	must(t, err)
	if runner.calls != 5 || !slices.Equal([]string{runner.seen[3].cmd, runner.seen[4].cmd}, []string{"echo TWO > /two", "cat /two > /three"}) {
		t.Errorf("after changing step 2 the runner ran %d more: %+v", runner.calls-3, runner.seen[3:])
	}
	im, err := s.Resolve(ctx, &protocol.ImageSource{Type: protocol.ImageDigest, Digest: changed.Digest}, nil)
	must(t, err)
	defer im.Release()
	mnt := mountImage(t, im)
	if got := readFile(t, filepath.Join(mnt, "three")); got != "TWO\n" {
		t.Errorf("/three = %q", got)
	}
	if got := readFile(t, filepath.Join(mnt, "one")); got != "one\n" {
		t.Errorf("/one = %q", got)
	}
	if len(im.Lowers) != 6 {
		t.Errorf("%d lowers, want 6", len(im.Lowers))
	}
}

func TestBuildEnvWorkdirCopy(t *testing.T) {
	s, base := baseStore(t)
	ctx := context.Background()
	bctx := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(bctx, "dir/sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(bctx, "dir/x"), []byte("x\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(bctx, "dir/sub/y"), []byte("y\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(bctx, "tool"), []byte("#!/bin/sh\necho tool\n"), 0o755))
	must(t, os.Symlink("x", filepath.Join(bctx, "dir/link")))
	runner := &scriptRunner{t: t}
	recipe := &protocol.Recipe{Base: base, Steps: []protocol.Step{
		env("FOO", "bar"), env("GREETING", "hello"), workdir("/work"),
		copyStep("dir", "/app"), copyStep("tool", "/usr/local/bin/"), copyStep("dir/x", "/renamed"),
		run(`pwd > /pwd; echo "$FOO $GREETING" > /env; cat /app/x /app/sub/y /app/link > /cat; /usr/local/bin/tool > /tool`),
	}}
	info, err := s.Build(ctx, recipe, BuildOptions{Runner: runner, Context: bctx})
	must(t, err)
	if runner.calls != 1 {
		t.Fatalf("runner calls %d", runner.calls)
	}
	c := runner.seen[0]
	if c.workdir != "/work" || !slices.Equal(c.env, []string{"PATH=/bin", "FOO=bar", "GREETING=hello"}) || c.lowers != 6 {
		t.Errorf("the RUN step got workdir %q env %q and %d lowers", c.workdir, c.env, c.lowers)
	}
	im, err := s.Resolve(ctx, &protocol.ImageSource{Type: protocol.ImageDigest, Digest: info.Digest}, nil)
	must(t, err)
	defer im.Release()
	if im.Config.WorkingDir != "/work" || !slices.Equal(im.Config.Env, c.env) {
		t.Errorf("config %+v", im.Config)
	}
	mnt := mountImage(t, im)
	for p, want := range map[string]string{"pwd": "/work\n", "env": "bar hello\n", "cat": "x\ny\nx\n", "tool": "tool\n", "renamed": "x\n"} {
		if got := readFile(t, filepath.Join(mnt, p)); got != want {
			t.Errorf("/%s = %q, want %q", p, got, want)
		}
	}
	fi, err := os.Stat(filepath.Join(mnt, "app/sub/y"))
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("app/sub/y: %v %v", fi, err)
	}
	// COPY sources may not leave the context, also not through a symlink.
	must(t, os.Symlink("/etc", filepath.Join(bctx, "escape")))
	_, err = s.Build(ctx, &protocol.Recipe{Base: base, Steps: []protocol.Step{copyStep("escape/passwd", "/x")}}, BuildOptions{Context: bctx})
	if err == nil || !strings.Contains(err.Error(), "leaves the build context") {
		t.Errorf("escaping COPY: %v", err)
	}
}

func TestBuildFailedStepNotCached(t *testing.T) {
	s, base := baseStore(t)
	ctx := context.Background()
	runner := &scriptRunner{t: t}
	recipe := &protocol.Recipe{Base: base, Steps: []protocol.Step{run("echo fine > /f"), run("echo something broke; exit 3")}}
	var out bytes.Buffer
	for i := range 2 {
		_, err := s.Build(ctx, recipe, BuildOptions{Runner: runner, Out: &out, Ref: "bad:1"})
		if err == nil || !strings.Contains(err.Error(), "something broke") || !strings.Contains(err.Error(), "step 2/2") {
			t.Fatalf("build %d: %v, want the step's failure with its output", i, err)
		}
	}
	if runner.calls != 3 { // step 1 once (cached after), step 2 twice
		t.Errorf("runner calls %d, want 3", runner.calls)
	}
	list, _ := s.List(ctx)
	if len(list) != 1 {
		t.Errorf("a failed build is listed: %+v", list)
	}
}

func TestBuildWithoutRunner(t *testing.T) {
	s, base := baseStore(t)
	ctx := context.Background()
	_, err := s.Build(ctx, &protocol.Recipe{Base: base, Steps: []protocol.Step{env("A", "1"), run("true")}}, BuildOptions{})
	if !errors.Is(err, ErrNoStepRunner) || !strings.Contains(err.Error(), "step 2/2") {
		t.Errorf("RUN without a runner: %v", err)
	}
	// Everything but RUN needs no runner; scratch is a base.
	bctx := t.TempDir()
	must(t, os.WriteFile(filepath.Join(bctx, "f"), []byte("f\n"), 0o644))
	info, err := s.Build(ctx, &protocol.Recipe{Base: "scratch", Steps: []protocol.Step{copyStep("f", "/f"), env("A", "1")}}, BuildOptions{Context: bctx, Ref: "fromscratch"})
	must(t, err)
	im, err := s.Resolve(ctx, refSource("fromscratch:latest"), nil)
	must(t, err)
	defer im.Release()
	if im.Digest != info.Digest || len(im.Lowers) != 1 || readFile(t, filepath.Join(im.Lowers[0], "f")) != "f\n" {
		t.Errorf("scratch build: %+v", im)
	}
}

// TestBuildWhiteouts: a step that deletes a base file and one that replaces a base
// directory; later sessions see exactly that.
func TestBuildWhiteouts(t *testing.T) {
	s, base := baseStore(t)
	ctx := context.Background()
	recipe := &protocol.Recipe{Base: base, Steps: []protocol.Step{
		run("rm /etc/hello"),
		run("rm -rf /opt/data && mkdir /opt/data && echo fresh > /opt/data/fresh"),
	}}
	info, err := s.Build(ctx, recipe, BuildOptions{Runner: &scriptRunner{t: t}})
	must(t, err)
	im, err := s.Resolve(ctx, &protocol.ImageSource{Type: protocol.ImageDigest, Digest: info.Digest}, nil)
	must(t, err)
	defer im.Release()
	mnt := mountImage(t, im)
	for _, tc := range []struct{ path, want string }{
		{"etc/hello", ""},
		{"etc", "<dir>"},
		{"opt/data/a", ""},
		{"opt/data/sub", ""},
		{"opt/data/new", ""},
		{"opt/data/fresh", "fresh\n"},
		{"opt/other", "now a file\n"},
	} {
		fi, err := os.Lstat(filepath.Join(mnt, tc.path))
		switch {
		case tc.want == "":
			if err == nil {
				t.Errorf("%s: present, want deleted", tc.path)
			}
		case tc.want == "<dir>":
			if err != nil || !fi.IsDir() {
				t.Errorf("%s: %v, want a directory", tc.path, err)
			}
		default:
			if err != nil || readFile(t, filepath.Join(mnt, tc.path)) != tc.want {
				t.Errorf("%s: %v, want %q", tc.path, err, tc.want)
			}
		}
	}
}

func TestImageStoreMethods(t *testing.T) {
	s, base := baseStore(t)
	ctx := context.Background()
	bctx := t.TempDir()
	must(t, os.WriteFile(filepath.Join(bctx, "f"), []byte("f\n"), 0o644))
	s.context = bctx
	recipe := &protocol.Recipe{Base: base, Steps: []protocol.Step{copyStep("f", "/f"), env("A", "1")}}
	res, err := s.BuildImage(ctx, recipe, "myimg:1")
	must(t, err)
	if res.Ref != "myimg:1" || !protocol.ValidDigest(res.Digest) {
		t.Errorf("build_image result %+v", res)
	}
	entries, err := s.ListImages(ctx)
	must(t, err)
	var found bool
	for _, e := range entries {
		if e.Digest == res.Digest {
			found = slices.Equal(e.Refs, []string{"myimg:1"})
		}
	}
	if !found || len(entries) != 2 {
		t.Errorf("list_images %+v", entries)
	}
	// An ImageSource recipe resolves to the same build, without a runner.
	im, err := s.Resolve(ctx, &protocol.ImageSource{Type: protocol.ImageRecipe, Recipe: recipe}, nil)
	must(t, err)
	im.Release()
	if im.Digest != res.Digest {
		t.Errorf("recipe source %s, build_image %s", im.Digest, res.Digest)
	}
	must(t, s.RemoveImage(ctx, &protocol.ImageSource{Type: protocol.ImageRecipe, Recipe: recipe}))
	if err := s.RemoveImage(ctx, &protocol.ImageSource{Type: protocol.ImageRef, Ref: "myimg:1"}); err == nil {
		t.Errorf("the ref survived removing its recipe")
	}
	entries, _ = s.ListImages(ctx)
	if len(entries) != 1 {
		t.Errorf("after remove: %+v", entries)
	}
}

// BenchmarkCachedRebuild rebuilds a 3-step recipe whose every step is cached (the
// acceptance asks < 100 ms).
func BenchmarkCachedRebuild(b *testing.B) {
	s, base := baseStore(b)
	ctx := context.Background()
	recipe := &protocol.Recipe{Base: base, Steps: []protocol.Step{run("echo 1 > /1"), env("A", "1"), run("echo 2 > /2")}}
	_, err := s.Build(ctx, recipe, BuildOptions{Runner: &scriptRunner{t: b}})
	must(b, err)
	b.ResetTimer()
	for b.Loop() {
		if _, err := s.Build(ctx, recipe, BuildOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRefMoves: rebuilding under a ref moves it; the old build stays, unnamed, and its
// digest still names it until it is removed.
func TestRefMoves(t *testing.T) {
	s, base := baseStore(t)
	ctx := context.Background()
	a, err := s.Build(ctx, &protocol.Recipe{Base: base, Steps: []protocol.Step{env("V", "1")}}, BuildOptions{Ref: "x:1"})
	must(t, err)
	b, err := s.Build(ctx, &protocol.Recipe{Base: base, Steps: []protocol.Step{env("V", "2")}}, BuildOptions{Ref: "x:1"})
	must(t, err)
	list, _ := s.List(ctx)
	got := map[string][]string{}
	for _, in := range list {
		got[in.Digest] = in.Refs
	}
	if len(list) != 3 || !slices.Equal(got[b.Digest], []string{"x:1"}) || got[a.Digest] != nil {
		t.Errorf("list %+v", list)
	}
	im, err := s.Resolve(ctx, &protocol.ImageSource{Type: protocol.ImageDigest, Digest: a.Digest}, nil)
	must(t, err)
	im.Release()
	if !slices.Contains(im.Config.Env, "V=1") {
		t.Errorf("old build's env %v", im.Config.Env)
	}
	must(t, s.Remove(ctx, a.Digest))
	if list, _ := s.List(ctx); len(list) != 2 {
		t.Errorf("after removing the old build: %+v", list)
	}
}

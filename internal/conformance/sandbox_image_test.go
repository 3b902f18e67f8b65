package conformance

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"virtx.dev/virtx/protocol"
)

// Sessions and builds on OCI images in the sandbox, through the real binary, with images
// served by an in-process registry as the Docker Hub mirror (VIRTX_REGISTRY_MIRRORS):
// nothing here reaches the internet. The image store needs root (its layers carry
// trusted.overlay xattrs), so these tests do too.

// imgRegistry is an in-process registry that counts what it serves.
type imgRegistry struct {
	*httptest.Server
	requests atomic.Int64
}

func newImgRegistry(t testing.TB) *imgRegistry {
	r := &imgRegistry{}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

// push stores img in the registry as docker.io's repo:tag (the mirror's paths), and
// returns the ref a session names it by.
func (r *imgRegistry) push(t testing.TB, repoTag string, img v1.Image) string {
	ref, err := name.ParseReference(strings.TrimPrefix(r.URL, "http://") + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return "docker.io/" + repoTag
}

// imageEnv gives the test's servers a cache of their own and the registry as the mirror.
func imageEnv(t testing.TB, r *imgRegistry) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("prerequisite missing in CI: root (the image store's layers carry trusted.overlay xattrs)")
		}
		t.Skip("prerequisite missing: root (the image store's layers carry trusted.overlay xattrs)")
	}
	cache, tmp := t.TempDir(), t.TempDir()
	setenv(t, "VIRTX_HOME", cache)
	setenv(t, "TMPDIR", tmp)
	setenv(t, "VIRTX_REGISTRY_MIRRORS", "docker.io="+r.URL)
	return cache
}

func setenv(t testing.TB, k, v string) {
	old, had := os.LookupEnv(k)
	os.Setenv(k, v)
	t.Cleanup(func() {
		if had {
			os.Setenv(k, old)
		} else {
			os.Unsetenv(k)
		}
	})
}

// busyboxBin is Debian's static busybox, what the test images are made of.
func busyboxBin(t testing.TB) []byte {
	b, err := os.ReadFile("/bin/busybox")
	if err != nil || !bytes.HasPrefix(b, []byte("\x7fELF")) {
		if os.Getenv("CI") == "true" {
			t.Fatal("prerequisite missing in CI: /bin/busybox (apt-get install busybox-static)")
		}
		t.Skip("prerequisite missing: /bin/busybox (apt-get install busybox-static)")
	}
	return b
}

// ent is one entry of a test layer: a directory (name ends in /), a symlink (link set),
// a whiteout or opaque marker (.wh. names, empty), or a file.
type ent struct {
	name, body, link string
	mode             int64
}

func layer(t testing.TB, ents ...ent) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mt := time.Unix(1700000000, 0)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Mode: 0o644, ModTime: mt, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case strings.HasSuffix(e.name, "/"):
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		case e.link != "":
			h.Typeflag, h.Mode, h.Linkname = tar.TypeSymlink, 0o777, e.link
		}
		if e.mode != 0 {
			h.Mode = e.mode
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func ociImage(t testing.TB, env []string, workdir string, layers ...[]byte) v1.Image {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for _, l := range layers {
		var err error
		if img, err = mutate.AppendLayers(img, static.NewLayer(l, types.OCIUncompressedLayer)); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", hostArch()
	cf.Config.Env, cf.Config.WorkingDir = env, workdir
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func hostArch() string {
	var u syscall.Utsname
	syscall.Uname(&u)
	m := ""
	for _, c := range u.Machine {
		if c == 0 {
			break
		}
		m += string(rune(c))
	}
	switch m {
	case "x86_64":
		return "amd64"
	case "aarch64":
		return "arm64"
	}
	return m
}

// busyboxLayer is / with busybox as sh, ls, cat… and the directories a session needs.
func busyboxLayer(t testing.TB) []byte {
	bb := busyboxBin(t)
	ents := []ent{{name: "bin/"}, {name: "bin/busybox", body: string(bb), mode: 0o755}, {name: "tmp/", mode: 0o1777}, {name: "root/"}, {name: "etc/"}}
	for _, a := range []string{"sh", "ls", "cat", "echo", "rm", "mkdir", "head", "od", "sleep", "test", "pwd", "touch", "env", "stat", "true", "dd"} {
		ents = append(ents, ent{name: "bin/" + a, link: "busybox"})
	}
	return layer(t, ents...)
}

// threeLayerImage is the acceptance image: busybox; files and directories; a layer that
// deletes a base file, replaces a base directory (opaque) and a directory by a file.
func threeLayerImage(t testing.TB) v1.Image {
	l2 := layer(t, ent{name: "etc/hello", body: "hello\n"}, ent{name: "etc/removeme", body: "x\n"},
		ent{name: "opt/"}, ent{name: "opt/data/"}, ent{name: "opt/data/a", body: "a\n"}, ent{name: "opt/data/sub/"},
		ent{name: "opt/data/sub/b", body: "b\n"}, ent{name: "opt/other/"}, ent{name: "opt/other/c", body: "c\n"})
	l3 := layer(t, ent{name: "etc/.wh.removeme"}, ent{name: "opt/data/"}, ent{name: "opt/data/.wh..wh..opq"},
		ent{name: "opt/data/new", body: "new\n"}, ent{name: "opt/other", body: "now a file\n"})
	return ociImage(t, []string{"PATH=/bin", "GREETING=hi there"}, "/opt/data", busyboxLayer(t), l2, l3)
}

func refImage(ref string) *protocol.ImageSource {
	return &protocol.ImageSource{Type: protocol.ImageRef, Ref: ref}
}

func digestImage(d string) *protocol.ImageSource {
	return &protocol.ImageSource{Type: protocol.ImageDigest, Digest: d}
}

// TestSandboxImagePulledSession: a 3-layer image pulled at init is the session's root,
// its ENV the commands' environment and its WORKDIR init's cwd; a second server's session
// on it asks the registry nothing.
func TestSandboxImagePulledSession(t *testing.T) {
	requireSandbox(t)
	reg := newImgRegistry(t)
	imageEnv(t, reg)
	ref := reg.push(t, "virtx-test/three:1", threeLayerImage(t))
	check := func(p *peer) {
		cwd := p.init(&protocol.InitParams{Image: refImage(ref), Network: boolp(false)})
		if cwd != "/opt/data" {
			t.Errorf("init cwd %q, want the image's WORKDIR /opt/data", cwd)
		}
		if got := p.pwd(); got != "/opt/data" {
			t.Errorf("pwd %q", got)
		}
		if got := p.sh(`echo "$GREETING"; echo "$PATH"`); got != "hi there\n/bin\n" {
			t.Errorf("the image's ENV: %q", got)
		}
		for script, want := range map[string]string{
			"cat /etc/hello":                     "hello\n",
			"ls /opt/data":                       "new\n",
			"cat /opt/other":                     "now a file\n",
			"test -e /etc/removeme || echo gone": "gone\n",
			"test -e /usr/bin || echo no-host":   "no-host\n",
		} {
			if got := p.sh(script); got != want {
				t.Errorf("%s: %q, want %q", script, got, want)
			}
		}
	}
	check(startPeer(t, "sandbox"))
	before := reg.requests.Load()
	if before == 0 {
		t.Fatal("the registry served nothing: the image did not come from it")
	}
	check(startPeer(t, "sandbox"))
	if n := reg.requests.Load() - before; n != 0 {
		t.Errorf("the second session made %d registry requests, want 0", n)
	}
	// An unknown ref or digest is -32012 naming it.
	p := startPeer(t, "sandbox")
	e := p.fails(protocol.CodeUnknownImage, protocol.MethodInit, &protocol.InitParams{Image: refImage("docker.io/virtx-test/none:1")})
	if !strings.Contains(e.Message, "virtx-test/none:1") {
		t.Errorf("message does not name the ref: %q", e.Message)
	}
	d := "sha256:" + strings.Repeat("1", 64)
	e = p.fails(protocol.CodeUnknownImage, protocol.MethodInit, &protocol.InitParams{Image: digestImage(d)})
	if !strings.Contains(e.Message, d) {
		t.Errorf("message does not name the digest: %q", e.Message)
	}
	p.exec("true")
}

// stampSteps is a recipe of three RUN steps on base, each writing something no rerun
// repeats (so a step that ran again shows).
func stampSteps(base, second string) *protocol.Recipe {
	return &protocol.Recipe{Base: base, Steps: []protocol.Step{
		{Kind: protocol.StepRun, Run: "head -c 16 /dev/urandom | od -x > /s1"},
		{Kind: protocol.StepRun, Run: second},
		{Kind: protocol.StepRun, Run: "head -c 16 /dev/urandom | od -x > /s3"},
	}}
}

func build(p *peer, r *protocol.Recipe, ref string) string {
	p.t.Helper()
	return p.ok(protocol.MethodBuildImage, &protocol.BuildImageParams{Recipe: r, Ref: ref}).(*protocol.BuildImageResult).Digest
}

// stamps are the three steps' files, as a session on image d sees them.
func stamps(t *testing.T, d string) [3]string {
	p := startPeer(t, "sandbox")
	p.init(&protocol.InitParams{Image: digestImage(d), Network: boolp(false)})
	var out [3]string
	for i := range out {
		out[i] = p.sh(fmt.Sprintf("cat /s%d", i+1))
	}
	return out
}

// TestSandboxImageRecipeBuild: a 3-step recipe builds through build_image; the rebuild
// hits the cache for every step; changing step 2 reruns steps 2 and 3 only; a recipe at
// init is the same image.
func TestSandboxImageRecipeBuild(t *testing.T) {
	requireSandbox(t)
	reg := newImgRegistry(t)
	imageEnv(t, reg)
	base := reg.push(t, "virtx-test/bb:1", ociImage(t, []string{"PATH=/bin"}, "", busyboxLayer(t)))
	p := startPeer(t, "sandbox")
	r1 := stampSteps(base, "head -c 16 /dev/urandom | od -x > /s2")
	d1 := build(p, r1, "built:1")
	start := time.Now()
	if d := build(p, r1, "built:1"); d != d1 {
		t.Fatalf("rebuild gave %s, want the cached %s", d, d1)
	}
	t.Logf("cached rebuild: %v", time.Since(start))
	s1 := stamps(t, d1)
	r2 := stampSteps(base, "head -c 16 /dev/urandom | od -x > /s2; echo changed >> /s2")
	d2 := build(p, r2, "built:2")
	if d2 == d1 {
		t.Fatal("changing step 2 gave the same image")
	}
	s2 := stamps(t, d2)
	if s2[0] != s1[0] {
		t.Errorf("step 1 ran again: %q then %q", s1[0], s2[0])
	}
	if s2[1] == s1[1] || !strings.HasSuffix(s2[1], "changed\n") {
		t.Errorf("step 2 did not run again: %q then %q", s1[1], s2[1])
	}
	if s2[2] == s1[2] {
		t.Errorf("step 3 did not run again: %q", s2[2])
	}
	// A recipe at init is built (here: found in the cache) first.
	q := startPeer(t, "sandbox")
	q.init(&protocol.InitParams{Image: &protocol.ImageSource{Type: protocol.ImageRecipe, Recipe: r1}, Network: boolp(false)})
	if got := q.sh("cat /s1 /s2 /s3"); got != s1[0]+s1[1]+s1[2] {
		t.Errorf("a session on the recipe sees %q", got)
	}
	// A failed step fails the build with its output.
	m := p.call(protocol.MethodBuildImage, &protocol.BuildImageParams{Recipe: &protocol.Recipe{Base: base, Steps: []protocol.Step{{Kind: protocol.StepRun, Run: "echo oh-no-output; exit 3"}}}})
	if m.Err == nil || m.Err.Code != protocol.CodeInvalidParams || !strings.Contains(m.Err.Message, "oh-no-output") {
		t.Errorf("a failed step: %v, want -32602 with the step's output", m.Err)
	}
}

// TestSandboxImageWhiteouts: what RUN steps delete or replace in the base, a later
// session sees exactly so.
func TestSandboxImageWhiteouts(t *testing.T) {
	requireSandbox(t)
	reg := newImgRegistry(t)
	imageEnv(t, reg)
	l2 := layer(t, ent{name: "etc/base-file", body: "base\n"}, ent{name: "etc/keep", body: "keep\n"},
		ent{name: "opt/"}, ent{name: "opt/dir/"}, ent{name: "opt/dir/a", body: "a\n"}, ent{name: "opt/dir/sub/"}, ent{name: "opt/dir/sub/b", body: "b\n"},
		ent{name: "opt/todir", body: "file\n"}, ent{name: "opt/tofile/"}, ent{name: "opt/tofile/x", body: "x\n"})
	base := reg.push(t, "virtx-test/wh:1", ociImage(t, []string{"PATH=/bin"}, "", busyboxLayer(t), l2))
	p := startPeer(t, "sandbox")
	d := build(p, &protocol.Recipe{Base: base, Steps: []protocol.Step{
		{Kind: protocol.StepRun, Run: "rm /etc/base-file"},
		{Kind: protocol.StepRun, Run: "rm -rf /opt/dir && mkdir /opt/dir && echo new > /opt/dir/new"},
		{Kind: protocol.StepRun, Run: "rm /opt/todir && mkdir /opt/todir && echo in > /opt/todir/in && rm -rf /opt/tofile && echo now > /opt/tofile"},
	}}, "")
	s := startPeer(t, "sandbox")
	s.init(&protocol.InitParams{Image: digestImage(d), Network: boolp(false)})
	for _, c := range []struct{ name, script, want string }{
		{"deleted file", "test -e /etc/base-file || echo absent", "absent\n"},
		{"sibling kept", "cat /etc/keep", "keep\n"},
		{"replaced directory holds only the new", "ls -A /opt/dir", "new\n"},
		{"nested lower gone", "test -e /opt/dir/sub/b || echo absent", "absent\n"},
		{"file became directory", "cat /opt/todir/in", "in\n"},
		{"directory became file", "cat /opt/tofile", "now\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := s.sh(c.script); got != c.want {
				t.Errorf("%s: %q, want %q", c.script, got, c.want)
			}
		})
	}
}

// TestSandboxImageBuildKilled: SIGKILL of the server in the middle of a RUN step; the
// same build then succeeds, and list_images shows nothing broken.
func TestSandboxImageBuildKilled(t *testing.T) {
	requireSandbox(t)
	reg := newImgRegistry(t)
	imageEnv(t, reg)
	base := reg.push(t, "virtx-test/bb:1", ociImage(t, []string{"PATH=/bin"}, "", busyboxLayer(t)))
	r := &protocol.Recipe{Base: base, Steps: []protocol.Step{
		{Kind: protocol.StepRun, Run: "echo one > /one"},
		{Kind: protocol.StepRun, Run: "sleep 2; echo two > /two"},
	}}
	p := startPeer(t, "sandbox")
	params := &protocol.BuildImageParams{Recipe: r, Ref: "killed:1"}
	if err := protocol.WriteFramed(p.stdin, protocol.AppendRequest(protocol.NewFrameBuffer(protocol.SizeHint(params)), 0, protocol.MethodBuildImage, params)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.stderr.String(), "step 2/2") {
		if time.Now().After(deadline) {
			t.Fatalf("the build never reached step 2; stderr:\n%s", p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	p.cmd.Process.Kill()
	<-p.done
	q := startPeer(t, "sandbox")
	d := build(q, r, "killed:1")
	imgs := q.ok(protocol.MethodListImages, nil).(*protocol.ListImagesResult).Images
	found := false
	for _, im := range imgs {
		if im.Digest == d {
			found = true
		}
		s := startPeer(t, "sandbox")
		s.init(&protocol.InitParams{Image: digestImage(im.Digest), Network: boolp(false)})
		s.exec("true")
	}
	if !found {
		t.Errorf("list_images %+v lacks the built %s", imgs, d)
	}
	s := startPeer(t, "sandbox")
	s.init(&protocol.InitParams{Image: digestImage(d), Network: boolp(false)})
	if got := s.sh("cat /one /two"); got != "one\ntwo\n" {
		t.Errorf("the built image holds %q", got)
	}
}

// TestSandboxImageSnapshot: a snapshot of a session on an image, given to init on the
// same image, is the session's changes again.
func TestSandboxImageSnapshot(t *testing.T) {
	requireSandbox(t)
	reg := newImgRegistry(t)
	imageEnv(t, reg)
	ref := reg.push(t, "virtx-test/three:1", threeLayerImage(t))
	p := startPeer(t, "sandbox")
	p.init(&protocol.InitParams{Image: refImage(ref), Network: boolp(false)})
	p.sh("echo mine > /opt/data/mine; rm /etc/hello; rm -rf /opt/data && mkdir -p /opt/data && echo only > /opt/data/only")
	blob := p.ok(protocol.MethodSnapshot, nil).(*protocol.SnapshotResult).Blob
	q := startPeer(t, "sandbox")
	q.init(&protocol.InitParams{Image: refImage(ref), Snapshot: blob, Network: boolp(false)})
	if got := q.sh("ls -A /opt/data; test -e /etc/hello || echo no-hello"); got != "only\nno-hello\n" {
		t.Errorf("the session on the snapshot sees %q", got)
	}
}

// BenchmarkRecipeRebuildCached: build_image of a 3-step recipe every step of which the
// cache holds (goal: < 100 ms).
func BenchmarkRecipeRebuildCached(b *testing.B) {
	requireSandbox(b)
	reg := newImgRegistry(b)
	imageEnv(b, reg)
	base := reg.push(b, "virtx-test/bb:1", ociImage(b, []string{"PATH=/bin"}, "", busyboxLayer(b)))
	p := startPeer(b, "sandbox")
	r := stampSteps(base, "echo two > /s2")
	build(p, r, "bench:1")
	b.ResetTimer()
	for b.Loop() {
		build(p, r, "bench:1")
	}
}

// BenchmarkSandboxColdSessionImage: a cold session (a new server, init, one exec) on a
// cached ~100 MB image against one on the host image (goal: ≤ 1.2×).
func BenchmarkSandboxColdSessionImage(b *testing.B) {
	requireSandbox(b)
	reg := newImgRegistry(b)
	imageEnv(b, reg)
	layers := [][]byte{busyboxLayer(b)}
	for l := range 4 { // 4 layers of 25 files of 1 MiB of random bytes
		var ents []ent
		ents = append(ents, ent{name: fmt.Sprintf("data%d/", l)})
		for f := range 25 {
			buf := make([]byte, 1<<20)
			rand.Read(buf)
			ents = append(ents, ent{name: fmt.Sprintf("data%d/f%d", l, f), body: string(buf)})
		}
		layers = append(layers, layer(b, ents...))
	}
	ref := reg.push(b, "virtx-test/big:1", ociImage(b, []string{"PATH=/bin"}, "/root", layers...))
	warm := startPeer(b, "sandbox")
	warm.init(&protocol.InitParams{Image: refImage(ref), Network: boolp(false)})
	warm.exec("true")
	host := startPeer(b, "sandbox")
	host.exec("true")
	// Alternated, so both see the same load on a shared host.
	cold := func(params *protocol.InitParams) time.Duration { return coldSession(b, "sandbox", params) }
	var onImage, onHost time.Duration
	n := 0
	for b.Loop() {
		onImage += cold(&protocol.InitParams{Image: refImage(ref), Network: boolp(false)})
		onHost += cold(&protocol.InitParams{Network: boolp(false)})
		n++
	}
	b.ReportMetric(float64(onImage.Microseconds())/float64(n)/1000, "ms-image")
	b.ReportMetric(float64(onHost.Microseconds())/float64(n)/1000, "ms-host")
	b.ReportMetric(float64(onImage)/float64(onHost), "ratio")
}

// sandboxImageCode is the sandbox's answer to an init on an image it cannot find.
func sandboxImageCode() protocol.Code {
	if os.Geteuid() != 0 {
		return protocol.CodeUnsupportedImage
	}
	return protocol.CodeUnknownImage
}

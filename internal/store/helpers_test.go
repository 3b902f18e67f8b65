package store

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
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
)

// requirePrereq skips a test whose prerequisite is missing, naming the package, except
// in CI (CI=true), where it fails.
func requirePrereq(t testing.TB, ok bool, what, fix string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("internal/store: prerequisite missing in CI: %s (%s)", what, fix)
	}
	t.Skipf("internal/store: prerequisite missing: %s (%s)", what, fix)
}

func requireRoot(t testing.TB) {
	t.Helper()
	requirePrereq(t, os.Geteuid() == 0, "root (whiteouts are 0/0 devices, opaque dirs trusted.* xattrs)", "run the tests as root")
}

// busybox is the static busybox the test images are made of.
func busybox(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile("/bin/busybox")
	ok := err == nil && bytes.HasPrefix(b, []byte("\x7fELF"))
	requirePrereq(t, ok, "/bin/busybox", "apt-get install busybox-static")
	return b
}

// tarEntry is one entry of a test layer.
type tarEntry struct {
	name, body, link string
	dir, symlink     bool
	mode             int64
}

func file(name, body string) tarEntry  { return tarEntry{name: name, body: body} }
func dir(name string) tarEntry         { return tarEntry{name: name, dir: true} }
func symlink(name, to string) tarEntry { return tarEntry{name: name, link: to, symlink: true} }
func whiteout(dir, name string) tarEntry {
	return tarEntry{name: strings.TrimPrefix(dir+"/.wh."+name, "/")}
}
func opaque(dir string) tarEntry { return tarEntry{name: dir + "/.wh..wh..opq"} }
func exe(name string, body []byte) tarEntry {
	return tarEntry{name: name, body: string(body), mode: 0o755}
}

func layerTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mt := time.Unix(1700000000, 0)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, ModTime: mt, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case e.dir:
			h.Typeflag, h.Mode, h.Size, h.Name = tar.TypeDir, 0o755, 0, e.name+"/"
		case e.symlink:
			h.Typeflag, h.Mode, h.Size, h.Linkname = tar.TypeSymlink, 0o777, 0, e.link
		}
		if e.mode != 0 {
			h.Mode = e.mode
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, e.body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// testImage builds an image of uncompressed layers with env and workdir in its config.
func testImage(t testing.TB, env []string, workdir string, layers ...[]byte) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range layers {
		var err error
		img, err = mutate.AppendLayers(img, static.NewLayer(l, types.OCIUncompressedLayer))
		if err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = hostPlatform().OS, hostPlatform().Architecture
	cf.Config.Env, cf.Config.WorkingDir = env, workdir
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// threeLayers is the acceptance image: busybox; files and directories; a layer that
// deletes a base file, replaces a base directory (opaque) and replaces a directory by a
// file.
func threeLayers(t testing.TB) v1.Image {
	bb := busybox(t)
	l1 := layerTar(t, dir("bin"), exe("bin/busybox", bb), symlink("bin/sh", "busybox"), symlink("bin/cat", "busybox"), symlink("bin/ls", "busybox"))
	l2 := layerTar(t, dir("etc"), file("etc/hello", "hello\n"), file("etc/removeme", "x\n"),
		dir("opt"), dir("opt/data"), file("opt/data/a", "a\n"), dir("opt/data/sub"), file("opt/data/sub/b", "b\n"),
		dir("opt/other"), file("opt/other/c", "c\n"))
	l3 := layerTar(t, whiteout("etc", "removeme"), dir("opt/data"), opaque("opt/data"), file("opt/data/new", "new\n"),
		file("opt/other", "now a file\n"))
	return testImage(t, []string{"PATH=/bin", "GREETING=hi there"}, "/opt/data", l1, l2, l3)
}

// testRegistry is an in-process registry that counts the requests it serves.
type testRegistry struct {
	*httptest.Server
	requests atomic.Int64
	mu       sync.Mutex
	blobGets map[string]int
	// stall, when set, is called for a blob GET; returning true makes the handler write
	// half the blob and then hang until the client goes away.
	stall func(digest string) bool
	hook  http.Handler
}

func newRegistry(t testing.TB) *testRegistry {
	t.Helper()
	r := &testRegistry{blobGets: map[string]int{}}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.requests.Add(1)
		if i := strings.Index(req.URL.Path, "/blobs/sha256:"); i >= 0 && req.Method == http.MethodGet {
			d := req.URL.Path[i+len("/blobs/"):]
			r.mu.Lock()
			r.blobGets[d]++
			stall := r.stall
			r.mu.Unlock()
			if stall != nil && stall(d) {
				rec := httptest.NewRecorder()
				reg.ServeHTTP(rec, req)
				body := rec.Body.Bytes()
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(body[:len(body)/2])
				w.(http.Flusher).Flush()
				<-req.Context().Done()
				return
			}
		}
		reg.ServeHTTP(w, req)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *testRegistry) host() string { return strings.TrimPrefix(r.URL, "http://") }

func (r *testRegistry) push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.host() + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

func (r *testRegistry) blobGetsOf(d string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGets[d]
}

func openStore(t testing.TB, dir string, opts ...Option) *Store {
	t.Helper()
	opts = append([]Option{WithProgress(io.Discard), WithMirrors(Mirrors{}), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, opts...)
	s, err := Open(context.Background(), dir, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func readFile(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func digestOf(t testing.TB, img v1.Image) string {
	d, err := img.Digest()
	must(t, err)
	return d.String()
}

var _ = fmt.Sprint

func pushIndex(t testing.TB, ref string, idx v1.ImageIndex) {
	t.Helper()
	r, err := name.ParseReference(ref)
	must(t, err)
	must(t, remote.WriteIndex(r, idx))
}

package cli

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// virtxImage runs `virtx image ARGS…` in-process and returns stdout, stderr and the error.
func virtxImage(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"image"}, args...))
	err := root.Execute()
	return out.String(), errOut.String(), err
}

func mustImage(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := virtxImage(t, args...)
	if err != nil {
		t.Fatalf("virtx image %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

func TestImageCommands(t *testing.T) {
	t.Setenv("VIRTX_HOME", t.TempDir())
	t.Setenv("VIRTX_REGISTRY_MIRRORS", "")
	old := imageStepRunner
	imageStepRunner = nil
	t.Cleanup(func() { imageStepRunner = old })

	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "etc/os-release"), []byte("ID=test\n"), 0o644)
	base := strings.TrimSpace(mustImage(t, "import", rootfs, "base:1"))
	if !strings.HasPrefix(base, "sha256:") {
		t.Fatalf("import printed %q", base)
	}

	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "msg"), []byte("hi\n"), 0o644)
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM base:1\nCOPY msg /msg\nENV A=1\nWORKDIR /w\n"), 0o644)
	out, errOut, err := virtxImage(t, "build", "-t", "built:1", ctxDir)
	if err != nil || !strings.HasPrefix(out, "sha256:") || !strings.Contains(errOut, "step 1/3: COPY msg /msg") {
		t.Fatalf("build: %v\nstdout %s\nstderr %s", err, out, errOut)
	}
	ls := mustImage(t, "ls")
	for _, want := range []string{"REPOSITORY", "base ", "built ", strings.TrimPrefix(base, "sha256:")[:12]} {
		if !strings.Contains(ls, want) {
			t.Errorf("ls lacks %q:\n%s", want, ls)
		}
	}

	// Refusals: a Dockerfile outside the subset names its line; RUN needs a backend.
	bad := filepath.Join(ctxDir, "Bad")
	os.WriteFile(bad, []byte("FROM base:1\nADD x /x\n"), 0o644)
	if _, _, err := virtxImage(t, "build", "-f", bad, ctxDir); err == nil || !strings.Contains(err.Error(), bad+":2: ADD") {
		t.Errorf("bad Dockerfile: %v", err)
	}
	runFile := filepath.Join(ctxDir, "Run")
	os.WriteFile(runFile, []byte("FROM base:1\nRUN true\n"), 0o644)
	if _, _, err := virtxImage(t, "build", "-f", runFile, ctxDir); err == nil || !strings.Contains(err.Error(), "no session backend to run RUN steps") {
		t.Errorf("RUN without a backend: %v", err)
	}

	archive := filepath.Join(t.TempDir(), "built.tar")
	mustImage(t, "export", "built:1", "-o", archive)
	mustImage(t, "rm", "built:1", "base:1")
	if q := mustImage(t, "ls", "-q"); q != "" {
		t.Errorf("ls after rm: %q", q)
	}
	if _, _, err := virtxImage(t, "rm", "built:1"); err == nil {
		t.Errorf("rm of a removed image worked")
	}
	mustImage(t, "import", archive)
	if ls := mustImage(t, "ls"); !strings.Contains(ls, "built ") || !strings.Contains(ls, " 1 ") {
		t.Errorf("ls after importing the export:\n%s", ls)
	}

	// pull, from an in-process registry.
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	img, err := random.Image(1024, 2)
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.TrimPrefix(srv.URL, "http://") + "/t/rand:1"
	r, _ := name.ParseReference(ref)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	out, errOut, err = virtxImage(t, "pull", ref)
	if err != nil || strings.TrimSpace(out) != ref+" "+d.String() || strings.Count(errOut, "pulled") != 2 {
		t.Errorf("pull: %v\nstdout %s\nstderr %s", err, out, errOut)
	}
}

// TestImageCommit: a snapshot (a layer tar with a whiteout) on top of its base becomes an
// image whose export holds both layers, and a missing base is refused naming it.
func TestImageCommit(t *testing.T) {
	t.Setenv("VIRTX_HOME", t.TempDir())
	t.Setenv("VIRTX_REGISTRY_MIRRORS", "")
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	os.WriteFile(filepath.Join(rootfs, "etc/os-release"), []byte("ID=test\n"), 0o644)
	mustImage(t, "import", rootfs, "base:1")

	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	tw.WriteHeader(&tar.Header{Name: "root/", Typeflag: tar.TypeDir, Mode: 0o700})
	tw.WriteHeader(&tar.Header{Name: "root/made-in-session", Typeflag: tar.TypeReg, Mode: 0o644, Size: 2})
	tw.Write([]byte("hi"))
	tw.WriteHeader(&tar.Header{Name: "etc/.wh.os-release", Typeflag: tar.TypeReg, Mode: 0o644})
	tw.Close()
	snap := filepath.Join(t.TempDir(), "snapshot.tar")
	os.WriteFile(snap, layer.Bytes(), 0o644)

	digest := strings.TrimSpace(mustImage(t, "commit", "base:1", snap, "after:1"))
	if !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("commit printed %q", digest)
	}
	if ls := mustImage(t, "ls"); !strings.Contains(ls, "after ") || !strings.Contains(ls, "base ") {
		t.Fatalf("ls after commit:\n%s", ls)
	}
	archive := filepath.Join(t.TempDir(), "after.tar")
	mustImage(t, "export", "after:1", "-o", archive)
	if fi, err := os.Stat(archive); err != nil || fi.Size() == 0 {
		t.Fatalf("export: %v", err)
	}
	if _, errOut, err := virtxImage(t, "commit", "no-such-base:1", snap); err == nil || !strings.Contains(errOut+err.Error(), "no-such-base") {
		t.Fatalf("commit on a missing base: %v %s", err, errOut)
	}
}

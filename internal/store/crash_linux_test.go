package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"virtx.dev/virtx/protocol"
)

// The test binary re-executes itself as a store client (another process sharing the
// store) when this variable says what to do.
const childEnv = "VIRTX_STORE_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "pull":
		os.Exit(childPull())
	case "build":
		os.Exit(childBuild())
	default:
		fmt.Fprintln(os.Stderr, "unknown child mode")
		os.Exit(2)
	}
}

func childStore() (*Store, error) {
	return Open(context.Background(), os.Getenv("VIRTX_STORE_TEST_DIR"), WithProgress(io.Discard), WithMirrors(Mirrors{}))
}

func childPull() int {
	s, err := childStore()
	if err == nil {
		var info ImageInfo
		if info, err = s.Pull(context.Background(), os.Getenv("VIRTX_STORE_TEST_REF")); err == nil {
			fmt.Println(info.Digest)
			return 0
		}
	}
	fmt.Fprintln(os.Stderr, "child:", err)
	return 1
}

// hangingRunner announces it runs (by creating a file) and then never returns.
type hangingRunner struct{ marker string }

func (h hangingRunner) RunStep(ctx context.Context, lowers, env []string, workdir, cmd string, out io.Writer) (io.ReadCloser, error) {
	os.WriteFile(h.marker, nil, 0o644)
	<-ctx.Done()
	return nil, ctx.Err()
}

func childBuild() int {
	s, err := childStore()
	if err == nil {
		r := &protocol.Recipe{Base: os.Getenv("VIRTX_STORE_TEST_REF"), Steps: []protocol.Step{
			{Kind: protocol.StepEnv, Key: "K", Value: "v"},
			{Kind: protocol.StepRun, Run: "echo things > /things"},
		}}
		_, err = s.Build(context.Background(), r, BuildOptions{Ref: "built:1", Runner: hangingRunner{os.Getenv("VIRTX_STORE_TEST_MARKER")}})
	}
	fmt.Fprintln(os.Stderr, "child:", err)
	return 1
}

func child(t *testing.T, mode, dir, ref string, extra ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "VIRTX_STORE_TEST_DIR="+dir, "VIRTX_STORE_TEST_REF="+ref)
	cmd.Env = append(cmd.Env, extra...)
	return cmd
}

func bigLayer(t *testing.T, size int) []byte {
	b := make([]byte, size)
	rand.Read(b)
	return layerTar(t, file("big", string(b)))
}

// TestPullSIGKILL kills a process pulling from a registry that stalls halfway through a
// blob; the same pull then succeeds and the store lists no broken entry.
func TestPullSIGKILL(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	big := bigLayer(t, 4<<20)
	img := testImage(t, []string{"A=1"}, "/", layerTar(t, file("small", "s\n")), big)
	ref := reg.push(t, "t/big:1", img)
	layers, _ := img.Layers()
	bigDigest, _ := layers[1].Digest()
	stalled := make(chan struct{})
	var once sync.Once
	reg.mu.Lock()
	reg.stall = func(d string) bool {
		if d != bigDigest.String() {
			return false
		}
		once.Do(func() { close(stalled) })
		return true
	}
	reg.mu.Unlock()

	dir := t.TempDir()
	cmd := child(t, "pull", dir, ref)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	select {
	case <-stalled:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the child never reached the big blob: %s", stderr.String())
	}
	tmpOf := func() []string {
		m, _ := filepath.Glob(filepath.Join(dir, "images/tmp", bigDigest.Hex+".*"))
		return m
	}
	// Wait until the half blob is on disk, then kill.
	deadline := time.Now().Add(10 * time.Second)
	for len(tmpOf()) == 0 || fileSize(tmpOf()[0]) < 1<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("no partial blob appeared in tmp/")
		}
		time.Sleep(10 * time.Millisecond)
	}
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
	reg.mu.Lock()
	reg.stall = nil
	reg.mu.Unlock()

	s := openStore(t, dir)
	ctx := context.Background()
	if list, _ := s.List(ctx); len(list) != 0 {
		t.Fatalf("after the kill the store lists %+v", list)
	}
	if _, err := os.Stat(s.blobPath(bigDigest)); err == nil {
		t.Fatalf("a half-fetched blob is in blobs/")
	}
	info, err := s.Pull(ctx, ref)
	must(t, err)
	if info.Digest != digestOf(t, img) {
		t.Errorf("digest %s", info.Digest)
	}
	if m := tmpOf(); len(m) != 0 {
		t.Errorf("the killed pull's leftovers are still in tmp/: %v", m)
	}
	list, _ := s.List(ctx)
	if len(list) != 1 || list[0].Digest != info.Digest {
		t.Errorf("list %+v", list)
	}
	im, err := s.Resolve(ctx, refSource(ref), nil)
	must(t, err)
	defer im.Release()
	if fileSize(filepath.Join(im.Lowers[0], "big")) != 4<<20 {
		t.Errorf("big file is not whole")
	}
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return -1
	}
	return fi.Size()
}

// TestBuildSIGKILL kills a process in the middle of a build's RUN step; the same build
// then succeeds and nothing the killed one did is listed.
func TestBuildSIGKILL(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	ref := reg.push(t, "t/base:1", threeLayers(t))
	dir := t.TempDir()
	marker := filepath.Join(t.TempDir(), "running")
	cmd := child(t, "build", dir, ref, "VIRTX_STORE_TEST_MARKER="+marker)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for fileSize(marker) < 0 {
		select {
		case <-exited:
			t.Fatalf("the child ended before its RUN step: %s", stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			t.Fatalf("the child's RUN step never started: %s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	<-exited

	s := openStore(t, dir)
	ctx := context.Background()
	list, _ := s.List(ctx)
	if len(list) != 1 || list[0].Refs[0] != strings.TrimPrefix(ref, "") {
		t.Fatalf("after the kill: %+v (want only the base)", list)
	}
	r := &protocol.Recipe{Base: ref, Steps: []protocol.Step{
		{Kind: protocol.StepEnv, Key: "K", Value: "v"},
		{Kind: protocol.StepRun, Run: "echo things > /things"},
	}}
	run := &scriptRunner{t: t}
	info, err := s.Build(ctx, r, BuildOptions{Ref: "built:1", Runner: run})
	must(t, err)
	if run.calls != 1 {
		t.Errorf("runner called %d times", run.calls)
	}
	list, _ = s.List(ctx)
	if len(list) != 2 {
		t.Errorf("list %+v", list)
	}
	im, err := s.Resolve(ctx, &protocol.ImageSource{Type: protocol.ImageRef, Ref: "built:1"}, nil)
	must(t, err)
	im.Release()
	if im.Digest != info.Digest {
		t.Errorf("built:1 is %s, build said %s", im.Digest, info.Digest)
	}
}

// TestConcurrentPulls pulls one image from two processes at once into one store: both
// succeed, and each blob is fetched once.
func TestConcurrentPulls(t *testing.T) {
	requireRoot(t)
	reg := newRegistry(t)
	img := threeLayers(t)
	ref := reg.push(t, "t/three:1", img)
	reg.mu.Lock()
	reg.stall = func(string) bool { time.Sleep(100 * time.Millisecond); return false }
	reg.mu.Unlock()
	dir := t.TempDir()
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for range 2 {
		c := child(t, "pull", dir, ref)
		var o bytes.Buffer
		c.Stdout, c.Stderr = &o, &o
		must(t, c.Start())
		cmds, outs = append(cmds, c), append(outs, &o)
	}
	want := digestOf(t, img)
	for i, c := range cmds {
		if err := c.Wait(); err != nil || strings.TrimSpace(outs[i].String()) != want {
			t.Errorf("pull %d: %v: %s", i, err, outs[i])
		}
	}
	layers, _ := img.Layers()
	for _, l := range layers {
		d, _ := l.Digest()
		if n := reg.blobGetsOf(d.String()); n != 1 {
			t.Errorf("layer %s fetched %d times, want 1", d, n)
		}
	}
	s := openStore(t, dir)
	list, _ := s.List(context.Background())
	if len(list) != 1 || list[0].Digest != want {
		t.Errorf("list %+v", list)
	}
	if e, _ := os.ReadDir(filepath.Join(s.Root(), "layers")); len(e) != 3 {
		t.Errorf("%d unpacked layers, want 3", len(e))
	}
}

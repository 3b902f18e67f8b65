//go:build linux

package executor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testPath is the PATH commands in tests get.
const testPath = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"

func newTestExecutor(t testing.TB, cfg Config) *Executor {
	t.Helper()
	if cfg.Env == nil {
		cfg.Env = []string{"PATH=" + testPath, "HOME=/root", "LC_ALL=C"}
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(e.KillAll)
	return e
}

func mustExec(t *testing.T, e *Executor, cwd string, cmd ...string) ExecResult {
	t.Helper()
	res, err := e.Exec(context.Background(), ExecRequest{Cmd: cmd, Cwd: cwd})
	if err != nil {
		t.Fatalf("Exec(%q): %v", cmd, err)
	}
	return res
}

func TestExecResults(t *testing.T) {
	e := newTestExecutor(t, Config{})
	dir := t.TempDir()
	tests := []struct {
		name      string
		cmd       []string
		code      int32
		out, errs string
		wantTrunc bool
	}{
		{"stdout", []string{"echo", "hi"}, 0, "hi\n", "", false},
		{"streams apart", []string{"sh", "-c", "printf out; printf err >&2; printf more"}, 0, "outmore", "err", false},
		{"exit status", []string{"sh", "-c", "exit 3"}, 3, "", "", false},
		{"false", []string{"false"}, 1, "", "", false},
		{"killed by SIGKILL", []string{"sh", "-c", "kill -9 $$"}, 137, "", "", false},
		{"killed by SIGTERM", []string{"sh", "-c", "kill -TERM $$"}, 143, "", "", false},
		{"bytes exact", []string{"printf", `\000\377\r\n`}, 0, "\x00\xff\r\n", "", false},
		{"argv without shell", []string{"echo", "$HOME", "*", "a  b"}, 0, "$HOME * a  b\n", "", false},
		{"stdin is empty", []string{"cat"}, 0, "", "", false},
		{"env PWD", []string{"sh", "-c", `echo "$PWD"`}, 0, dir + "\n", "", false},
		{"runs in cwd", []string{"pwd", "-P"}, 0, dir + "\n", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := mustExec(t, e, dir, tc.cmd...)
			if res.Code != tc.code || string(res.Stdout) != tc.out || string(res.Stderr) != tc.errs || res.Truncated != tc.wantTrunc || res.Cwd != dir {
				t.Errorf("got code=%d stdout=%q stderr=%q truncated=%v cwd=%q; want %d %q %q %v %q",
					res.Code, res.Stdout, res.Stderr, res.Truncated, res.Cwd, tc.code, tc.out, tc.errs, tc.wantTrunc, dir)
			}
			if res.Stdout == nil || res.Stderr == nil {
				t.Errorf("nil output slices: %#v", res)
			}
		})
	}
}

func TestExecEnv(t *testing.T) {
	dir := t.TempDir()
	e := newTestExecutor(t, Config{Env: []string{"PATH=" + testPath, "FOO=bar", "PWD=/nonsense"}})
	res := mustExec(t, e, dir, "env")
	env := strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	want := map[string]bool{"PATH=" + testPath: true, "FOO=bar": true, "PWD=" + dir: true}
	if len(env) != len(want) {
		t.Fatalf("env = %q, want exactly %v", env, want)
	}
	for _, kv := range env {
		if !want[kv] {
			t.Errorf("unexpected env entry %q (all: %q)", kv, env)
		}
	}
}

func TestExecInvalid(t *testing.T) {
	e := newTestExecutor(t, Config{})
	for _, req := range []ExecRequest{
		{Cmd: nil, Cwd: "/"},
		{Cmd: []string{}, Cwd: "/"},
		{Cmd: []string{"true"}, Cwd: "relative"},
		{Cmd: []string{"true"}, Cwd: ""},
		{Cmd: []string{"cd", "/"}, Cwd: "tmp"},
	} {
		_, err := e.Exec(context.Background(), req)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Exec(%+v) error = %v, want ErrInvalidArgument", req, err)
		}
	}
	if _, err := New(Config{OutputLimit: -1}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("New(OutputLimit:-1) = %v", err)
	}
	if _, err := New(Config{ReadOnly: []string{"rel"}}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("New(ReadOnly rel) = %v", err)
	}
}

func writeFile(t testing.TB, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func TestExecNotExecutable(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "plain"), "#!/bin/sh\necho hi\n", 0o644)
	writeFile(t, filepath.Join(dir, "garbage"), "\x00\x01\x02 not a program\n", 0o755)
	writeFile(t, filepath.Join(dir, "badinterp"), "#!/nonexistent/interp\n", 0o755)
	os.Mkdir(filepath.Join(dir, "subdir"), 0o755)
	e := newTestExecutor(t, Config{})
	tests := []struct {
		name  string
		cmd   string
		cwd   string
		msg   string
		errno error
	}{
		{"not in PATH", "nosuch-virtx-cmd", dir, `exec: "nosuch-virtx-cmd": executable file not found in $PATH`, exec.ErrNotFound},
		{"missing relative", "./nosuch", dir, `exec: "./nosuch": no such file or directory`, unix.ENOENT},
		{"missing absolute", "/nonexistent/x", dir, `exec: "/nonexistent/x": no such file or directory`, unix.ENOENT},
		{"no x bit", "./plain", dir, `exec: "./plain": permission denied`, unix.EACCES},
		{"directory", "./subdir", dir, `exec: "./subdir": is a directory`, unix.EISDIR},
		{"exec format error", "./garbage", dir, `exec: "./garbage": exec format error`, unix.ENOEXEC},
		{"missing interpreter", "./badinterp", dir, `exec: "./badinterp": no such file or directory`, unix.ENOENT},
		{"cwd gone", "true", filepath.Join(dir, "gone"), "", unix.ENOENT},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := e.Exec(context.Background(), ExecRequest{Cmd: []string{tc.cmd, "arg"}, Cwd: tc.cwd})
			if !errors.Is(err, ErrNotExecutable) {
				t.Fatalf("Exec = %+v, %v; want ErrNotExecutable", res, err)
			}
			if !errors.Is(err, tc.errno) {
				t.Errorf("error %v does not match %v", err, tc.errno)
			}
			if tc.msg != "" && err.Error() != tc.msg {
				t.Errorf("message %q, want %q", err.Error(), tc.msg)
			}
		})
	}
}

func TestExecLookup(t *testing.T) {
	dir := t.TempDir()
	for _, d := range []string{"bin", "other", "sub"} {
		os.Mkdir(filepath.Join(dir, d), 0o755)
	}
	writeFile(t, filepath.Join(dir, "bin", "hello"), "#!/bin/sh\necho hello from bin\n", 0o755)
	writeFile(t, filepath.Join(dir, "other", "hello"), "#!/bin/sh\necho hello from other\n", 0o755)
	writeFile(t, filepath.Join(dir, "other", "noexec"), "#!/bin/sh\necho wrong\n", 0o644)
	writeFile(t, filepath.Join(dir, "bin", "noexec"), "#!/bin/sh\necho right\n", 0o755)
	writeFile(t, filepath.Join(dir, "sub", "script"), "#!/bin/sh\necho script \"$@\"\n", 0o755)

	tests := []struct {
		name, path, cwd string
		cmd             []string
		out             string
	}{
		{"absolute PATH entry", dir + "/bin:" + testPath, "/", []string{"hello"}, "hello from bin\n"},
		{"PATH order", dir + "/other:" + dir + "/bin:" + testPath, "/", []string{"hello"}, "hello from other\n"},
		{"non-executable skipped", dir + "/other:" + dir + "/bin", "/", []string{"noexec"}, "right\n"},
		{"relative PATH entry against cwd", "bin:" + testPath, dir, []string{"hello"}, "hello from bin\n"},
		{"empty PATH entry is cwd", ":" + testPath, dir + "/sub", []string{"script"}, "script\n"},
		{"relative program", testPath, dir, []string{"sub/script", "x"}, "script x\n"},
		{"dot-slash program", testPath, dir + "/sub", []string{"./script"}, "script\n"},
		{"dot-dot program", testPath, dir + "/bin", []string{"../sub/script"}, "script\n"},
		{"absolute program", "", "/", []string{dir + "/bin/hello"}, "hello from bin\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestExecutor(t, Config{Env: []string{"PATH=" + tc.path}})
			res := mustExec(t, e, tc.cwd, tc.cmd...)
			if string(res.Stdout) != tc.out || res.Code != 0 {
				t.Errorf("got %d %q %q, want %q", res.Code, res.Stdout, res.Stderr, tc.out)
			}
		})
	}
	// The process's own PATH is not used.
	e := newTestExecutor(t, Config{Env: []string{"PATH=" + dir + "/bin"}})
	if _, err := e.Exec(context.Background(), ExecRequest{Cmd: []string{"true"}, Cwd: "/"}); !errors.Is(err, ErrNotExecutable) {
		t.Errorf("true found outside Config.Env's PATH: %v", err)
	}
	e = newTestExecutor(t, Config{Env: []string{}})
	if _, err := e.Exec(context.Background(), ExecRequest{Cmd: []string{"true"}, Cwd: "/"}); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("no PATH: %v", err)
	}
}

// symlinkedDir makes dir/real/sub and dir/link -> real, and returns the
// spelling through the link and the real one.
func symlinkedDir(t *testing.T) (dir, link, real string) {
	t.Helper()
	dir = t.TempDir()
	real = filepath.Join(dir, "real")
	if err := os.MkdirAll(filepath.Join(real, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(real, "file"), "x", 0o644)
	link = filepath.Join(dir, "link")
	if err := os.Symlink("real", link); err != nil {
		t.Fatal(err)
	}
	return dir, link, real
}

func TestCd(t *testing.T) {
	dir, link, real := symlinkedDir(t)
	e := newTestExecutor(t, Config{Env: []string{"PATH=" + testPath, "HOME=" + link}})
	noHome := newTestExecutor(t, Config{Env: []string{"PATH=" + testPath}})
	tests := []struct {
		name   string
		e      *Executor
		cwd    string
		args   []string
		code   int32
		stderr string
		newCwd string
	}{
		{"relative", e, dir, []string{"real"}, 0, "", real},
		{"absolute", e, "/", []string{real + "/sub"}, 0, "", real + "/sub"},
		{"symlink spelling kept", e, dir, []string{"link"}, 0, "", link},
		{"below a symlink", e, link, []string{"sub"}, 0, "", link + "/sub"},
		{"dot-dot is logical", e, link + "/sub", []string{".."}, 0, "", link},
		{"dot-dot out of symlink", e, link, []string{".."}, 0, "", dir},
		{"cleaned", e, dir, []string{"./link//sub/./"}, 0, "", link + "/sub"},
		{"home", e, "/", nil, 0, "", link},
		{"no home is root", noHome, dir, nil, 0, "", "/"},
		{"empty arg stays", e, dir, []string{""}, 0, "", dir},
		{"-L", e, dir, []string{"-L", "link"}, 0, "", link},
		{"-P resolves", e, dir, []string{"-P", "link"}, 0, "", real},
		{"--", e, dir, []string{"--", "link"}, 0, "", link},
		{"missing", e, dir, []string{"nope"}, 1, "cd: nope: No such file or directory\n", dir},
		{"missing below", e, dir, []string{"nope/deeper"}, 1, "cd: nope/deeper: No such file or directory\n", dir},
		{"not a directory", e, dir, []string{"real/file"}, 1, "cd: real/file: Not a directory\n", dir},
		{"too many", e, dir, []string{"a", "b"}, 1, "cd: too many arguments\n", dir},
		{"dash", e, dir, []string{"-"}, 1, "cd: OLDPWD not set\n", dir},
		{"bad option", e, dir, []string{"-x", "real"}, 2, "cd: -x: invalid option\ncd: usage: cd [-L|-P] [dir]\n", dir},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := tc.e.Exec(context.Background(), ExecRequest{Cmd: append([]string{"cd"}, tc.args...), Cwd: tc.cwd})
			if err != nil {
				t.Fatalf("Exec: %v", err)
			}
			if res.Code != tc.code || string(res.Stderr) != tc.stderr || len(res.Stdout) != 0 || res.Cwd != tc.newCwd {
				t.Errorf("got code=%d stderr=%q stdout=%q cwd=%q; want %d %q \"\" %q", res.Code, res.Stderr, res.Stdout, res.Cwd, tc.code, tc.stderr, tc.newCwd)
			}
		})
	}
}

func TestPwdAndSpelling(t *testing.T) {
	_, link, real := symlinkedDir(t)
	e := newTestExecutor(t, Config{})
	cwd := link + "/sub"
	tests := []struct {
		cmd []string
		out string
	}{
		{[]string{"pwd"}, cwd + "\n"},
		{[]string{"pwd", "-L"}, cwd + "\n"},
		{[]string{"pwd", "-P"}, real + "/sub\n"}, // the real program
		{[]string{"sh", "-c", `echo $PWD; pwd`}, cwd + "\n" + cwd + "\n"},
		{[]string{"sh", "-c", `cd .. && pwd`}, link + "\n"},
	}
	for _, tc := range tests {
		res := mustExec(t, e, cwd, tc.cmd...)
		if string(res.Stdout) != tc.out || res.Code != 0 {
			t.Errorf("%q: got %d %q %q, want %q", tc.cmd, res.Code, res.Stdout, res.Stderr, tc.out)
		}
		if res.Cwd != cwd {
			t.Errorf("%q moved the session to %q", tc.cmd, res.Cwd)
		}
	}
}

// liveProcs returns the pids of processes that are not zombies and whose
// argv is exactly args.
func liveProcs(t testing.TB, args ...string) []int {
	t.Helper()
	want := strings.Join(args, "\x00") + "\x00"
	var pids []int
	for pid, st := range scanProcs() {
		if st.dead() {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && string(b) == want {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestExecTimeoutKillsTree(t *testing.T) {
	e := newTestExecutor(t, Config{})
	tests := []struct {
		name  string
		cmd   string
		procs [][]string
	}{
		{"background and foreground", "sleep 9871 & sleep 9872", [][]string{{"sleep", "9871"}, {"sleep", "9872"}}},
		{"nested shells", "sh -c 'sleep 9873 & sleep 9874' & wait", [][]string{{"sleep", "9873"}, {"sleep", "9874"}}},
		{"left the group", "setsid sleep 9875 & sleep 9876", [][]string{{"sleep", "9875"}, {"sleep", "9876"}}},
		{"output flood", "yes & sleep 9877", [][]string{{"yes"}, {"sleep", "9877"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const timeout = 300 * time.Millisecond
			begin := time.Now()
			res, err := e.Exec(context.Background(), ExecRequest{Cmd: []string{"sh", "-c", tc.cmd}, Cwd: "/", Timeout: timeout})
			var te *TimeoutError
			if !errors.As(err, &te) {
				t.Fatalf("Exec = %+v, %v; want a *TimeoutError", res, err)
			}
			if te.After != timeout || err.Error() != "killed after 300ms" {
				t.Errorf("TimeoutError %+v %q", te, err)
			}
			if d := time.Since(begin); d < timeout || d > 10*time.Second {
				t.Errorf("returned after %v", d)
			}
			for _, args := range tc.procs {
				if pids := liveProcs(t, args...); len(pids) > 0 {
					t.Errorf("%q still alive: %v", args, pids)
				}
			}
		})
	}
}

func TestExecContextCancel(t *testing.T) {
	e := newTestExecutor(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		// Cancel once the tree is up (or after a while regardless).
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if len(liveProcs(t, "sleep", "9881")) > 0 && len(liveProcs(t, "sleep", "9882")) > 0 {
				break
			}
		}
		cancel()
	}()
	_, err := e.Exec(ctx, ExecRequest{Cmd: []string{"sh", "-c", "sleep 9881 & sleep 9882"}, Cwd: "/"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec error = %v, want context.Canceled", err)
	}
	for _, arg := range []string{"9881", "9882"} {
		if pids := liveProcs(t, "sleep", arg); len(pids) > 0 {
			t.Errorf("sleep %s still alive: %v", arg, pids)
		}
	}
	// Already cancelled: nothing runs.
	_, err = e.Exec(ctx, ExecRequest{Cmd: []string{"sh", "-c", "sleep 9883"}, Cwd: "/"})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Exec with a done ctx = %v", err)
	}
}

func TestExecBackgroundProcess(t *testing.T) {
	e := newTestExecutor(t, Config{})
	dir := t.TempDir()
	begin := time.Now()
	// The background sleep keeps the pipes open; output written before the
	// shell exits is collected, and the exec does not wait for the sleep.
	// (Output written during the ~200 ms grace after the shell exits is
	// collected too, but asserting that would time the scheduler.)
	res := mustExec(t, e, dir, "sh", "-c", `echo before; sleep 9891 & echo after`)
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("Exec took %v with a background process holding the pipe", d)
	}
	if string(res.Stdout) != "before\nafter\n" || string(res.Stderr) != "" || res.Code != 0 {
		t.Errorf("got %d %q %q", res.Code, res.Stdout, res.Stderr)
	}
	pids := liveProcs(t, "sleep", "9891")
	if len(pids) != 1 {
		t.Fatalf("background sleep not running after Exec returned: %v", pids)
	}
	// A second command runs fine meanwhile.
	if res := mustExec(t, e, dir, "true"); res.Code != 0 {
		t.Errorf("true: %+v", res)
	}
	if got := liveProcs(t, "sleep", "9891"); len(got) != 1 {
		t.Fatalf("background sleep died early: %v", got)
	}
	e.KillAll()
	if got := liveProcs(t, "sleep", "9891"); len(got) > 0 {
		t.Errorf("KillAll left %v alive", got)
	}
}

func TestKillAllRunning(t *testing.T) {
	e := newTestExecutor(t, Config{})
	done := make(chan ExecResult, 1)
	go func() {
		res, err := e.Exec(context.Background(), ExecRequest{Cmd: []string{"sh", "-c", "sleep 9901 & sleep 9902"}, Cwd: "/"})
		if err != nil {
			t.Errorf("Exec: %v", err)
		}
		done <- res
	}()
	waitFor(t, "the sleeps", func() bool { return len(liveProcs(t, "sleep", "9901")) > 0 && len(liveProcs(t, "sleep", "9902")) > 0 })
	e.KillAll()
	select {
	case res := <-done:
		if res.Code != 137 {
			t.Errorf("killed command: %+v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Exec did not return after KillAll")
	}
	if pids := append(liveProcs(t, "sleep", "9901"), liveProcs(t, "sleep", "9902")...); len(pids) > 0 {
		t.Errorf("still alive: %v", pids)
	}
}

func TestExecOutputLimit(t *testing.T) {
	const limit = 1 << 20
	e := newTestExecutor(t, Config{OutputLimit: limit})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res := mustExec(t, e, "/", "sh", "-c", "head -c 100M /dev/zero; echo tail >&2")
	runtime.ReadMemStats(&after)
	if res.Code != 0 || !res.Truncated || len(res.Stdout) != limit || string(res.Stderr) != "tail\n" {
		t.Fatalf("got code=%d truncated=%v len(stdout)=%d stderr=%q", res.Code, res.Truncated, len(res.Stdout), res.Stderr)
	}
	if !bytes.Equal(res.Stdout, make([]byte, limit)) {
		t.Error("stdout is not the first bytes of the output")
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 16<<20 {
		t.Errorf("100 MiB of output with a 1 MiB limit allocated %d MiB", alloc>>20)
	}

	// Exactly the limit is not truncated; one byte more is.
	e = newTestExecutor(t, Config{OutputLimit: 10})
	for _, tc := range []struct {
		n    int
		want bool
	}{{9, false}, {10, false}, {11, true}} {
		res := mustExec(t, e, "/", "head", "-c", strconv.Itoa(tc.n), "/dev/zero")
		if res.Truncated != tc.want || len(res.Stdout) != min(tc.n, 10) {
			t.Errorf("%d bytes: truncated=%v len=%d", tc.n, res.Truncated, len(res.Stdout))
		}
	}
	res = mustExec(t, e, "/", "sh", "-c", "head -c 20 /dev/zero >&2")
	if !res.Truncated || len(res.Stderr) != 10 || len(res.Stdout) != 0 {
		t.Errorf("stderr over the limit: %+v", res)
	}
}

func TestExecConcurrent(t *testing.T) {
	e := newTestExecutor(t, Config{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 5 {
				want := fmt.Sprintf("%d-%d", i, j)
				res, err := e.Exec(context.Background(), ExecRequest{Cmd: []string{"sh", "-c", "echo $0; echo $0 >&2; exit $1", want, strconv.Itoa(j)}, Cwd: "/"})
				if err != nil {
					t.Error(err)
					return
				}
				if string(res.Stdout) != want+"\n" || string(res.Stderr) != want+"\n" || res.Code != int32(j) {
					t.Errorf("%s: got %+v", want, res)
				}
			}
		}()
	}
	wg.Wait()
}

func TestParseStat(t *testing.T) {
	line := "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123456 0 0\n"
	st, err := parseStat(4242, []byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{procID: procID{pid: 4242, start: 123456}, ppid: 1, pgrp: 4242, state: 'S'}
	if st != want {
		t.Errorf("parseStat = %+v, want %+v", st, want)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2"} {
		if _, err := parseStat(1, []byte(bad)); err == nil {
			t.Errorf("parseStat(%q) succeeded", bad)
		}
	}
}

// The subreaper tests run in a child process: being a subreaper changes
// the whole process for good.
const subreaperEnv = "VIRTX_EXECUTOR_SUBREAPER_HELPER"

func TestSubreaper(t *testing.T) {
	if os.Getenv(subreaperEnv) != "" {
		t.Skip("in the helper")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestSubreaperHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), subreaperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestSubreaperHelper")) {
		t.Fatalf("helper: %v\n%s", err, out)
	}
}

func TestSubreaperHelper(t *testing.T) {
	if os.Getenv(subreaperEnv) == "" {
		t.Skip("run by TestSubreaper")
	}
	self := os.Getpid()
	e := newTestExecutor(t, Config{Subreaper: true})
	dir := t.TempDir()

	// An orphaned background process comes to us, and its zombie is reaped.
	mustExec(t, e, dir, "sh", "-c", "sleep 9911 &")
	pids := liveProcs(t, "sleep", "9911")
	if len(pids) != 1 {
		t.Fatalf("sleep 9911: %v", pids)
	}
	pid := pids[0]
	if st, err := readStat(pid); err != nil || st.ppid != self {
		t.Fatalf("orphan not re-parented to us: %+v %v", st, err)
	}
	unix.Kill(pid, unix.SIGKILL)
	waitFor(t, "the zombie", func() bool { st, err := readStat(pid); return err == nil && st.state == 'Z' })
	mustExec(t, e, dir, "true")
	if _, err := readStat(pid); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("zombie %d not reaped: %v", pid, err)
	}

	// A timeout kills and reaps orphans of the command too.
	_, err := e.Exec(context.Background(), ExecRequest{Cmd: []string{"sh", "-c", "(sleep 9912 &); sleep 9913"}, Cwd: dir, Timeout: 200 * time.Millisecond})
	var te *TimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("Exec: %v", err)
	}
	if left := append(liveProcs(t, "sleep", "9912"), liveProcs(t, "sleep", "9913")...); len(left) > 0 {
		t.Errorf("still alive after timeout: %v", left)
	}

	// A process that left for its own session is still ours to kill.
	mustExec(t, e, dir, "sh", "-c", "(setsid sleep 9914 &)")
	waitFor(t, "sleep 9914", func() bool { return len(liveProcs(t, "sleep", "9914")) == 1 })
	e.KillAll()
	if left := liveProcs(t, "sleep", "9914"); len(left) > 0 {
		t.Errorf("KillAll left %v", left)
	}

	// No zombie children are left behind.
	for _, pid := range childPids(self) {
		if st, err := readStat(pid); err == nil && st.state == 'Z' && st.pgrp != unix.Getpgrp() {
			t.Errorf("zombie child left: %+v", st)
		}
	}
}

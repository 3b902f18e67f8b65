package linux

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// exeRSS is how much of a process's executable it has mapped, read-only mappings only
// (KiB), from its smaps.
func exeRSS(t *testing.T, pid string) int {
	t.Helper()
	exe, err := os.Readlink("/proc/" + pid + "/exe")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/" + pid + "/smaps")
	if err != nil {
		t.Fatal(err)
	}
	total, in := 0, false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping's first line
			in = len(f) == 6 && f[5] == exe && len(f[1]) > 1 && f[1][1] == '-'
			continue
		}
		if in && f[0] == "Rss:" && len(f) > 1 {
			n, _ := strconv.Atoi(f[1])
			total += n
		}
	}
	return total
}

// The test binary runs itself as an idle process with an IdleTrimmer over its stdin, as
// `virtx serve` does, and the test watches its mappings from outside (looking from
// inside would map again what the looking touches).
func TestMain(m *testing.M) {
	if os.Getenv("LINUX_TEST_IDLE") == "1" {
		tr := NewIdleTrimmer(200 * time.Millisecond)
		io.Copy(os.Stdout, tr.Reader(os.Stdin)) // echo each line; idle in between
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestIdleTrimmer(t *testing.T) {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), "LINUX_TEST_IDLE=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	pid := strconv.Itoa(cmd.Process.Pid)
	echo := func() {
		t.Helper()
		if _, err := io.WriteString(in, "x\n"); err != nil {
			t.Fatal(err)
		}
		if _, err := out.Read(make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
	}
	echo()
	busy := exeRSS(t, pid)
	// Kept busy (a request every 50 ms, for longer than the trim's wait): no trim.
	for range 10 {
		time.Sleep(50 * time.Millisecond)
		echo()
	}
	// Large page-cache folios are mapped whole on a fault (Linux 6.x), so the code a
	// process runs again after the trim can map a megabyte or so: the bar is two thirds.
	if now := exeRSS(t, pid); now < busy*2/3 {
		t.Errorf("trimmed while busy: %d KiB of the executable mapped, was %d", now, busy)
	}
	// Idle: trimmed.
	deadline := time.Now().Add(5 * time.Second)
	for exeRSS(t, pid) >= busy*2/3 {
		if time.Now().After(deadline) {
			t.Fatalf("still %d KiB of the executable mapped after 5 s idle (was %d)", exeRSS(t, pid), busy)
		}
		time.Sleep(50 * time.Millisecond)
	}
	trimmed := exeRSS(t, pid)
	// And it serves on.
	echo()
	t.Logf("the executable's read-only pages mapped: %d KiB serving, %d KiB idle, %d KiB after the next request", busy, trimmed, exeRSS(t, pid))
}

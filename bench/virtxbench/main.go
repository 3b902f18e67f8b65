// Command virtxbench measures the sandbox backend against its peers for bench/peers.sh:
// medians of many runs of each, printed as a Markdown table with the ratios the sandbox
// issue sets as goals.
//
//	virtxbench -virtx ./virtx -n 50 [-runc-bundle DIR] [-podman-image REF] [-idle 100]
//
// Each measurement is a process started and waited for (peers), or a console session
// driven through the console package (ours); all are run in turn, round after round, so
// that a shared machine's changing load falls on all of them alike:
//
//   - cold: spawn `virtx serve --backend sandbox`, init, first exec of /bin/true answered
//     (network on, the protocol's default; and network off);
//   - warm: one exec of /bin/true in a booted session, against exec of /bin/true from Go;
//   - idle: N sessions booted and idle at once, the resident memory of each one's server
//     and executor (and network helper) read from /proc.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"virtx.dev/virtx/console"
	"virtx.dev/virtx/internal/linux"
)

type result struct {
	name   string
	median time.Duration
	note   string
}

func main() {
	virtx := flag.String("virtx", "virtx", "the virtx binary")
	n := flag.Int("n", 50, "runs of each measurement")
	bundle := flag.String("runc-bundle", "", "a runc bundle whose process runs true (empty: skip runc)")
	podmanImage := flag.String("podman-image", "", "a podman image with /bin/true (empty: skip podman)")
	idle := flag.Int("idle", 100, "concurrent idle sessions")
	only := flag.String("only", "", "comma-separated subset: bwrap,runc,podman,cold,coldoff,coldhost,warm,idle")
	flag.Parse()
	want := func(s string) bool { return *only == "" || slices.Contains(strings.Split(*only, ","), s) }
	if abs, err := filepath.Abs(*virtx); err == nil {
		*virtx = abs
	}

	// Every measurement is run once per round, in turn, so that the load of a shared
	// machine, which comes and goes, falls on all of them alike.
	var subjects []*subject
	addSubject := func(name string, n int, f func() error) {
		subjects = append(subjects, &subject{name: name, n: n, f: f})
	}
	addSubject("fork+exec", *n, func() error { return exec.Command("/bin/true").Run() })
	res := map[string]result{}
	if want("bwrap") {
		if bw, err := exec.LookPath("bwrap"); err == nil {
			args := []string{"--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
				"--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
				"--unshare-all", "--die-with-parent", "--new-session", "true"}
			addSubject("bwrap", *n, func() error { return run(bw, args...) })
		} else {
			res["bwrap"] = result{name: "bwrap", note: "not installed"}
		}
	}
	if want("runc") && *bundle != "" {
		i := 0
		addSubject("runc", *n, func() error {
			i++
			return run("runc", "run", "--bundle", *bundle, fmt.Sprintf("virtxbench-%d-%d", os.Getpid(), i))
		})
	}
	if want("podman") && *podmanImage != "" {
		addSubject("podman", min(*n, 20), func() error {
			return run("podman", "run", "--rm", "--network=none", *podmanImage, "/bin/true")
		})
	}
	server := []string{*virtx, "serve", "--backend", "sandbox"}
	ctx := context.Background()
	if want("cold") {
		addSubject("cold", *n, func() error { return coldSession(ctx, server, true) })
	}
	if want("coldoff") {
		addSubject("cold-netoff", *n, func() error { return coldSession(ctx, server, false) })
	}
	if want("coldhost") {
		// The same server and client without a sandbox: what a session costs before the
		// backend does anything (two process starts, the protocol, one exec).
		host := []string{*virtx, "serve", "--backend", "host"}
		addSubject("cold-host", *n, func() error { return coldSession(ctx, host, true) })
	}
	if want("warm") {
		c, err := console.Open(ctx, console.WithServer(server...))
		if err != nil {
			fatal(err)
		}
		defer c.Close()
		if _, err := c.Exec(ctx, []string{"/bin/true"}); err != nil {
			fatal(err)
		}
		addSubject("warm", *n, func() error {
			r, err := c.Exec(ctx, []string{"/bin/true"})
			if err == nil && r.Code != 0 {
				err = fmt.Errorf("exit %d", r.Code)
			}
			return err
		})
	}
	for _, r := range measureAll(subjects) {
		res[r.name] = r
		fmt.Fprintf(os.Stderr, "%-12s median %8.2f ms %s\n", r.name, ms(r.median), r.note)
	}
	var rss idleRSS
	if want("idle") && *idle > 0 {
		rss = idleSessions(ctx, server, *idle)
		fmt.Fprintf(os.Stderr, "idle: %+v\n", rss)
	}
	printTable(res, rss, *idle)
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func coldSession(ctx context.Context, server []string, network bool) error {
	c, err := console.Open(ctx, console.WithServer(server...), console.WithNetwork(network))
	if err != nil {
		return err
	}
	r, err := c.Exec(ctx, []string{"/bin/true"})
	if err == nil && r.Code != 0 {
		err = fmt.Errorf("exit %d", r.Code)
	}
	stopClock() // the session's end is not its start
	c.Close()
	return err
}

// The clock of the run in progress: coldSession stops it before closing.
var (
	clockMu   sync.Mutex
	clockStop time.Time
)

func stopClock() {
	clockMu.Lock()
	clockStop = time.Now()
	clockMu.Unlock()
}

type subject struct {
	name string
	n    int
	f    func() error
	ds   []time.Duration
	note string // why it could not be measured
}

// measureAll runs each subject once to warm it up (a subject that fails then cannot run
// here), then in rounds, each subject once per round while it has runs left, and returns
// the medians.
func measureAll(subjects []*subject) []result {
	for _, s := range subjects {
		if err := s.f(); err != nil {
			s.note = "cannot run here: " + firstLine(err.Error())
		}
	}
	for round := 0; ; round++ {
		ran := false
		for _, s := range subjects {
			if s.note != "" || round >= s.n {
				continue
			}
			ran = true
			clockMu.Lock()
			clockStop = time.Time{}
			clockMu.Unlock()
			t0 := time.Now()
			err := s.f()
			t1 := time.Now()
			clockMu.Lock()
			if !clockStop.IsZero() {
				t1 = clockStop
			}
			clockMu.Unlock()
			if err != nil {
				s.note = "failed: " + firstLine(err.Error())
				continue
			}
			s.ds = append(s.ds, t1.Sub(t0))
		}
		if !ran {
			break
		}
	}
	var out []result
	for _, s := range subjects {
		if s.note != "" {
			out = append(out, result{name: s.name, note: s.note})
			continue
		}
		ds := s.ds
		slices.Sort(ds)
		n := len(ds)
		out = append(out, result{name: s.name, median: ds[n/2], note: fmt.Sprintf("(n=%d, p10 %.2f, p90 %.2f ms)", n, ms(ds[n/10]), ms(ds[n*9/10]))})
	}
	return out
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

type idleRSS struct {
	sessions               int
	serverKiB, initKiB     int // RSS sums
	helperKiB              int // network helpers (slirp4netns, pasta)
	serverPssKiB, initPss  int // PSS sums (shared pages divided among sharers)
	helperPss, helperCount int
	reaperKiB, reaperPss   int // the cgroup reaper shell, one per server
	err                    string
}

// idleSessions boots n sessions at once (network off: the executor and server alone;
// the network helper is measured separately with network on for a tenth of them), and
// reads each one's processes from /proc.
func idleSessions(ctx context.Context, server []string, n int) idleRSS {
	out := idleRSS{sessions: n}
	var cs []*console.Console
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for i := range n {
		c, err := console.Open(ctx, console.WithServer(server...), console.WithNetwork(i%10 == 0))
		if err != nil {
			out.err = err.Error()
			return out
		}
		cs = append(cs, c)
		if _, err := c.Exec(ctx, []string{"/bin/true"}); err != nil {
			out.err = err.Error()
			return out
		}
	}
	// Idle: the runtimes settle, and server and init, with nothing to do for
	// linux.IdleTrimAfter, hand back their pages of the binary (linux.IdleTrimmer).
	time.Sleep(linux.IdleTrimAfter + 2*time.Second)
	runtime.GC()
	me := os.Getpid()
	for _, srv := range children(me) {
		if !strings.HasPrefix(comm(srv), "virtx") {
			continue
		}
		out.serverKiB += status(srv, "VmRSS")
		out.serverPssKiB += pss(srv)
		for _, ch := range children(srv) {
			switch comm(ch) {
			case "slirp4netns", "pasta", "passt":
				out.helperKiB += status(ch, "VmRSS")
				out.helperPss += pss(ch)
				out.helperCount++
			case "sh": // the cgroup reaper (waits for the server to go)
				out.reaperKiB += status(ch, "VmRSS")
				out.reaperPss += pss(ch)
			default:
				out.initKiB += status(ch, "VmRSS")
				out.initPss += pss(ch)
			}
		}
	}
	return out
}

func children(pid int) []int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var out []int
	if err != nil {
		return nil
	}
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	// Threads other than the main one fork too (the sandbox's fork thread).
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		if t.Name() == strconv.Itoa(pid) {
			continue
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		for _, f := range strings.Fields(string(b)) {
			if p, err := strconv.Atoi(f); err == nil && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

func status(pid int, key string) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

func pss(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pss:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "virtxbench:", err)
	os.Exit(1)
}

func printTable(res map[string]result, rss idleRSS, idle int) {
	cell := func(name string) string {
		r, ok := res[name]
		switch {
		case !ok:
			return "not measured"
		case r.median == 0:
			return r.note
		}
		return fmt.Sprintf("%.2f ms", ms(r.median))
	}
	ratio := func(a, b string) (float64, bool) {
		ra, oka := res[a]
		rb, okb := res[b]
		if !oka || !okb || ra.median == 0 || rb.median == 0 {
			return 0, false
		}
		return float64(ra.median) / float64(rb.median), true
	}
	fmt.Println("| measurement | median | |")
	fmt.Println("|---|---|---|")
	for _, name := range []string{"fork+exec", "bwrap", "runc", "podman", "cold", "cold-netoff", "cold-host", "warm"} {
		if _, ok := res[name]; ok {
			fmt.Printf("| %s | %s | %s |\n", label(name), cell(name), res[name].note)
		}
	}
	fmt.Println()
	fmt.Println("| goal | measured | met |")
	fmt.Println("|---|---|---|")
	goal := func(text string, v float64, ok, met bool, unit string) {
		if !ok {
			fmt.Printf("| %s | not measured | – |\n", text)
			return
		}
		m := "yes"
		if !met {
			m = "**no**"
		}
		fmt.Printf("| %s | %.2f%s | %s |\n", text, v, unit, m)
	}
	for _, cold := range []string{"cold", "cold-netoff"} {
		v, ok := ratio(cold, "bwrap")
		goal(label(cold)+" ≤ 2× bwrap true", v, ok, v <= 2, "×")
		v, ok = ratio("runc", cold)
		goal(label(cold)+" ≥ 5× faster than runc", v, ok, v >= 5, "×")
		v, ok = ratio("podman", cold)
		goal(label(cold)+" ≥ 30× faster than podman", v, ok, v >= 30, "×")
	}
	v, ok := ratio("warm", "fork+exec")
	goal("warm exec ≤ 1.5× fork+exec", v, ok, v <= 1.5, "×")
	if rss.err != "" {
		fmt.Printf("| %d idle sessions ≤ 10 MiB each | failed: %s | – |\n", idle, rss.err)
	} else if rss.sessions > 0 {
		per := float64(rss.serverKiB+rss.initKiB) / float64(rss.sessions) / 1024
		goal(fmt.Sprintf("%d idle sessions ≤ 10 MiB RSS each (server + executor)", rss.sessions), per, true, per <= 10, " MiB")
		fmt.Println()
		fmt.Printf("Idle sessions: RSS per session %.1f MiB (server %.1f + executor %.1f); PSS per session %.1f MiB (server %.1f + executor %.1f)",
			per, float64(rss.serverKiB)/float64(rss.sessions)/1024, float64(rss.initKiB)/float64(rss.sessions)/1024,
			float64(rss.serverPssKiB+rss.initPss)/float64(rss.sessions)/1024,
			float64(rss.serverPssKiB)/float64(rss.sessions)/1024, float64(rss.initPss)/float64(rss.sessions)/1024)
		if rss.helperCount > 0 {
			fmt.Printf("; a network:true session's helper adds %.1f MiB RSS (%.1f MiB PSS), measured over %d",
				float64(rss.helperKiB)/float64(rss.helperCount)/1024, float64(rss.helperPss)/float64(rss.helperCount)/1024, rss.helperCount)
		}
		if rss.reaperKiB > 0 {
			fmt.Printf("; the per-server cgroup reaper (a waiting sh) adds %.1f MiB RSS (%.2f MiB PSS)",
				float64(rss.reaperKiB)/float64(rss.sessions)/1024, float64(rss.reaperPss)/float64(rss.sessions)/1024)
		}
		fmt.Println(".")
	}
}

func label(name string) string {
	switch name {
	case "fork+exec":
		return "fork+exec of /bin/true (from Go)"
	case "bwrap":
		return "bwrap running true"
	case "runc":
		return "runc run (busybox bundle, true)"
	case "podman":
		return "podman run --rm (true)"
	case "cold":
		return "virtx cold session (serve → init → first exec), network on"
	case "cold-netoff":
		return "virtx cold session, network off"
	case "cold-host":
		return "for reference: virtx cold session on the host backend (no sandbox)"
	case "warm":
		return "virtx warm exec of /bin/true"
	}
	return name
}

package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/internal/executor"
	"virtx.dev/virtx/internal/linux/cgroup"
)

// The machine a session gets when init leaves the member out (see doc.go, Machine shape).
const (
	DefaultVCPUs     = 2
	DefaultMemoryMiB = 2048
	// DefaultPids caps the tasks (processes and threads) of a session: a fork bomb stops
	// there. The executor itself is about twenty threads (initThreads and the runtime's).
	DefaultPids = 4096
)

// NoLimitsEnv, set to 1 in the server's environment, lets a session that asks for no
// limits run without any where this host cannot enforce them (rootless without a
// delegated cgroup). A session that asks for vcpus or memory_mib is still refused.
const NoLimitsEnv = "VIRTX_SANDBOX_NO_LIMITS"

// machineShape is what a session's cgroup enforces; a zero Limits with none set means the
// session runs without a group (NoLimitsEnv).
type machineShape struct {
	limits cgroup.Limits
	none   bool     // no group at all (NoLimitsEnv where limits cannot be enforced)
	gpu    []string // device nodes to bind into /dev
}

// hostCPUs are the CPUs this process may run on, in order.
func hostCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cpus []int
	for i := 0; i < len(set)*64 && len(cpus) < set.Count(); i++ {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus
}

// cpuRotor spreads the cpusets of sessions that use fewer CPUs than the host has.
var cpuRotor atomic.Uint32

// pickCPUs is a cpuset of n of cpus, starting at the next session's turn.
func pickCPUs(cpus []int, n int) string {
	start := int(cpuRotor.Add(1)-1) % len(cpus)
	parts := make([]string, 0, n)
	for i := range n {
		parts = append(parts, strconv.Itoa(cpus[(start+i)%len(cpus)]))
	}
	return strings.Join(parts, ",")
}

// shape decides a session's machine from its spec, or refuses it (UNSUPPORTED_MACHINE,
// naming the fix): a machine is never smaller than asked, nor left unenforced.
func shape(spec *backend.Spec) (machineShape, error) {
	var ms machineShape
	if spec.Network {
		if err := networkAvailable(); err != nil {
			return ms, err
		}
	}
	if spec.GPUMemoryMiB != 0 {
		return ms, fmt.Errorf("%w: gpu_memory_mib %d: a sandbox hands the host's GPU devices to the session whole, and nothing on the host caps one process's GPU memory; leave gpu_memory_mib out (the session gets the devices' whole memory)", backend.ErrUnsupportedMachine, spec.GPUMemoryMiB)
	}
	if spec.GPU != nil && *spec.GPU {
		devs, err := gpuDevices()
		if err != nil {
			return ms, err
		}
		ms.gpu = devs
	}
	cpus := hostCPUs()
	ncpu := len(cpus)
	if ncpu == 0 {
		ncpu = 1
	}
	vcpus := int(min(spec.VCPUs, 1<<20))
	if vcpus == 0 {
		vcpus = min(DefaultVCPUs, ncpu)
	} else if vcpus > ncpu {
		return ms, fmt.Errorf("%w: vcpus %d: this host gives virtx %d CPUs, and a sandbox never pretends to more than it has; ask for at most %d", backend.ErrUnsupportedMachine, spec.VCPUs, ncpu, ncpu)
	}
	mem := int64(min(spec.MemoryMiB, 1<<40)) << 20
	total := memTotal()
	if mem == 0 {
		mem = DefaultMemoryMiB << 20
		if total > 0 && mem > total {
			mem = total
		}
	} else if total > 0 && mem > total {
		return ms, fmt.Errorf("%w: memory_mib %d: this host has %d MiB of memory; ask for at most that", backend.ErrUnsupportedMachine, spec.MemoryMiB, total>>20)
	}
	ms.limits = cgroup.Limits{MemoryBytes: mem, CPUs: float64(vcpus), Pids: DefaultPids}
	info := cgroup.Detect()
	if info.Has("cpuset") && len(cpus) > 0 {
		ms.limits.CPUSet = pickCPUs(cpus, vcpus)
	}
	if info.Version == 0 || !info.Writable || info.Reason != "" {
		asked := spec.VCPUs != 0 || spec.MemoryMiB != 0
		if !asked && os.Getenv(NoLimitsEnv) == "1" {
			return machineShape{none: true, gpu: ms.gpu}, nil
		}
		if asked {
			return ms, fmt.Errorf("%w: vcpus and memory_mib are enforced with cgroups, and here they cannot be: %s", backend.ErrUnsupportedMachine, info.Reason)
		}
		return ms, fmt.Errorf("%w: a session that asks for no limits gets the default machine (%d vCPUs, %d MiB, %d tasks), which is enforced with cgroups, and here they cannot be: %s. Or set %s=1 in the server's environment to run sessions that ask for no limits without any", backend.ErrUnsupportedMachine, DefaultVCPUs, DefaultMemoryMiB, DefaultPids, info.Reason, NoLimitsEnv)
	}
	return ms, nil
}

// gpuDevices lists the NVIDIA device nodes to hand a gpu:true session, or refuses it
// when there are none. The driver's user-space libraries (libcuda, libnvidia-*) and tools
// (nvidia-smi) are the host's /usr, which the host image is made of.
func gpuDevices() ([]string, error) {
	var devs []string
	for _, pat := range []string{"/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia-caps/*"} {
		m, _ := filepath.Glob(pat)
		for _, d := range m {
			var st unix.Stat_t
			if unix.Stat(d, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
				devs = append(devs, d)
			}
		}
	}
	gpus := 0
	for _, d := range devs {
		if n := strings.TrimPrefix(d, "/dev/nvidia"); n != d && n != "" && n[0] >= '0' && n[0] <= '9' {
			gpus++
		}
	}
	if gpus == 0 {
		return nil, fmt.Errorf("%w: gpu true: this host has no NVIDIA GPU device (/dev/nvidia0…): install the NVIDIA driver (Debian: nvidia-driver) on a machine with a GPU, or leave gpu out", backend.ErrUnsupportedMachine)
	}
	return devs, nil
}

// groupSeq names each session's group uniquely within this server.
var groupSeq atomic.Uint64

// newGroup makes the cgroup a booted sandbox's init is put in (once this server's reaper
// runs). A failure that means the limits cannot be enforced is UNSUPPORTED_MACHINE with the
// cgroup package's fix.
func newGroup(ms machineShape) (*cgroup.Group, error) {
	if ms.none {
		return nil, nil
	}
	g, err := cgroup.Create("sandbox-"+strconv.FormatUint(groupSeq.Add(1), 10), ms.limits)
	if errors.Is(err, cgroup.ErrCannotEnforce) {
		return nil, fmt.Errorf("%w: %v", backend.ErrUnsupportedMachine, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: the session's cgroup: %v", backend.ErrBootFailed, err)
	}
	return g, nil
}

// reapDone: reapStaleGroups removes, once per process, the groups SIGKILLed servers left
// (and starts this server's reaper ahead of its first group).
var reapDone atomic.Bool

func reapStaleGroups() {
	if reapDone.Swap(true) {
		return
	}
	info := cgroup.Detect()
	if !info.Writable {
		return
	}
	reaperOnce.Do(startReaper) // ahead of the first group, off its path
	cgroup.ReapStale()
}

// procID is a process by pid and start time (so a recycled pid is not taken for it).
type procID struct {
	pid   int
	start string
}

func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		f := strings.Fields(s[i+1:])
		if len(f) > 19 {
			return f[19]
		}
	}
	return ""
}

// groupProcs lists the processes of a session's group, with their start times.
func groupProcs(g interface{ Procs() ([]int, error) }) map[procID]bool {
	pids, err := g.Procs()
	if err != nil {
		return nil
	}
	out := make(map[procID]bool, len(pids))
	for _, p := range pids {
		out[procID{p, procStart(p)}] = true
	}
	return out
}

// sweepNew kills every process of the group that was not there before (a command's
// tree, daemonised grandchildren included: they stay in the session's cgroup however
// they leave their process group or session), except init. Commands of one session never
// run concurrently, so what appeared during a command is that command's.
func sweepNew(g interface{ Procs() ([]int, error) }, before map[procID]bool, initPid int) {
	deadline := time.Now().Add(5 * time.Second)
	for delay := 200 * time.Microsecond; time.Now().Before(deadline); delay = min(2*delay, 20*time.Millisecond) {
		left := 0
		for id := range groupProcs(g) {
			if id.pid == initPid || before[id] {
				continue
			}
			left++
			fd, err := unix.PidfdOpen(id.pid, 0)
			if err != nil {
				continue
			}
			if procStart(id.pid) == id.start {
				unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			}
			unix.Close(fd)
		}
		if left == 0 {
			return
		}
		time.Sleep(delay)
	}
}

// sameShape says whether a group made with a enforces b (a cpuset of as many CPUs is as
// good as another).
func sameShape(a, b cgroup.Limits) bool {
	n := func(s string) int { return len(strings.Split(s, ",")) }
	return a.MemoryBytes == b.MemoryBytes && a.CPUs == b.CPUs && a.Pids == b.Pids &&
		(a.CPUSet == "") == (b.CPUSet == "") && n(a.CPUSet) == n(b.CPUSet)
}

// Exec runs a command through the relay. When it ends without a result (its timeout, or
// the call given up), the command's tree has been killed inside by the executor; what it
// daemonised (a new session whose parent exited, re-parented to init) is not in that
// tree, so every process of the session's cgroup that was not there when the command
// started is killed too.
func (m *machine) Exec(ctx context.Context, req executor.ExecRequest) (executor.ExecResult, error) {
	if m.group == nil || req.Timeout <= 0 {
		return m.Client.Exec(ctx, req)
	}
	before := groupProcs(m.group)
	res, err := m.Client.Exec(ctx, req)
	if err != nil && before != nil {
		sweepNew(m.group, before, m.pid)
	}
	return res, err
}

// initThreads is how many OS threads init makes for itself ahead of need. The Go runtime
// makes threads on demand and aborts the process when it cannot (clone EAGAIN): in a
// session whose commands have used up its pids limit (a fork bomb), PID 1 must not need
// a new one. Threads the runtime has made stay, idle, for it to reuse. An idle executor
// runs on about 5; the relay, a running command's wait and the port dialer need a few
// more at once.
const initThreads = 16

// prewarmAfter keeps the thread making off the first command's path (a bomb takes far
// longer than that to reach the pids limit).
const prewarmAfter = 20 * time.Millisecond

// prewarmThreads makes the runtime start n OS threads (each goroutine locked to one while
// they all wait), after a delay, then lets them go idle.
func prewarmThreads(n int, after time.Duration) {
	time.Sleep(after)
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			runtime.LockOSThread()
			wg.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	wg.Wait()
	close(release)
}

// hintNetwork tells the init spawned ahead whether the first session wants network
// (the first init's Admit; later ones change nothing).
func (b *Backend) hintNetwork(network bool) {
	if b.netHint == nil {
		return
	}
	select {
	case b.netHint <- network:
	default:
	}
}

// The cgroup reaper: a SIGKILLed server cannot remove its groups, and cgroupfs removes
// nothing by itself (v1's release_agent is the host's, not ours to set). So a server
// that makes groups starts a small shell process, in a session of its own, that waits
// for the server to go (its stdin is a pipe only the server holds, read with the shell's
// own `read` — no `cat` process — until EOF, when the server is gone however it ended),
// then kills whatever is left in the server's groups (NAME@PID-START in each hierarchy)
// and removes them, and exits. After a clean end there is nothing left for it to do. It
// is started as the backend is made, or with WithPrespawn once the init spawned ahead is
// (a process start, 0.5–1.5 ms of CPU here, that need not compete with init's cgroup and
// spawn), and every boot waits for it before it returns (waitReaper): a session runs
// nothing before its server's reaper is there. A server killed in the millisecond
// between would leave groups with nothing in them but an init its parent-death signal
// kills; ReapStale, when a backend is made, removes them — the second net.
var (
	reaperOnce sync.Once
	reaperPipe *os.File // held for the life of the server
)

const reaperScript = `while read -r _; do :; done
suffix=$1; shift
i=0
while [ $i -lt 200 ]; do
	left=0
	for p in "$@"; do
		for d in $p/*"$suffix"; do
			[ -d "$d" ] || continue
			left=1
			pids=$(cat "$d/cgroup.procs" 2>/dev/null)
			[ -n "$pids" ] && kill -9 $pids 2>/dev/null
			rmdir "$d" 2>/dev/null
		done
	done
	[ $left = 0 ] && exit 0
	i=$((i+1))
	sleep 0.05
done
exit 1`

// waitReaper returns once this server's reaper has been started (or could not be).
func waitReaper() { reaperOnce.Do(startReaper) }

func startReaper() {
	info := cgroup.Detect()
	if !info.Writable || info.Root == "" {
		return
	}
	start := procStart(os.Getpid())
	if start == "" {
		return
	}
	// Every hierarchy's virtx parent: the v2 one (info.Root), or beside the v1 memory
	// one (ROOT/../../*/virtx: memory, pids, cpu, cpuset, freezer, unified…).
	parents := []string{info.Root, filepath.Join(filepath.Dir(filepath.Dir(info.Root)), "*", filepath.Base(info.Root))}
	r, w, err := os.Pipe()
	if err != nil {
		return
	}
	cmd := exec.Command("/bin/sh", append([]string{"-c", reaperScript, "virtx-cgroup-reaper", "@" + strconv.Itoa(os.Getpid()) + "-" + start}, parents...)...)
	cmd.Stdin = r
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return
	}
	reaperPipe = w
	go cmd.Wait()
}

// confine puts a spawned init, before its boot, in the session's cgroup (so everything it
// starts is born inside and limited) and sees to its network. An init is born in a group
// of the session's shape (spawnIn), except the one spawned ahead (prespawn), born in the
// default machine's: for another shape that group is given the shape's limits
// (cgroup.Group.SetLimits); should that fail, a new group replaces it (init moved to the
// new one first, join), as one does when none could be made ahead. For network false a
// helper started ahead is stopped (its tap device goes with it) and init checks that lo
// is all it has. For network true the helper is started, or left starting, in the
// background: the boot goes on beside it with a resolv.conf of its own, which netUp fills
// in once the helper is up, before the session runs anything.
func (m *machine) confine(ctx context.Context, ms machineShape, network bool, cfg *bootConfig) error {
	if !ms.none && m.group != nil && !sameShape(m.limits, ms.limits) {
		// The group init was born in, made ahead, takes this shape's limits in place: init
		// has started nothing yet.
		if err := m.group.SetLimits(ms.limits); err != nil {
			slog.Debug("sandbox: reshaping the cgroup made ahead; making a new one", "err", err)
		} else {
			m.limits = ms.limits
		}
	}
	if !ms.none && (m.group == nil || !sameShape(m.limits, ms.limits)) {
		old := m.group
		m.group = nil
		g, err := newGroup(ms)
		if err != nil {
			return err
		}
		if g != nil {
			if err := m.joined(); err != nil && old == nil {
				return err
			}
			m.group, m.limits = g, ms.limits
			m.join(g)
			if old != nil {
				// init leaves the old group only once it is in the new one.
				if err := m.joined(); err != nil {
					return err
				}
			}
		}
		if old != nil {
			if err := old.Destroy(); err != nil {
				return fmt.Errorf("%w: the cgroup made ahead: %v", backend.ErrBootFailed, err)
			}
		}
	}
	if !network {
		m.stopNet()
		cfg.LoopbackOnly = true
		return nil
	}
	if m.netDone == nil {
		m.startNet(ctx, nil)
	}
	cfg.ResolvConf = resolvPending
	return nil
}

// resolvPending is the session's resolv.conf until its network is up (nothing runs in
// the session before netUp replaces it).
const resolvPending = "# virtx: the session's network is starting\n"

// startNet starts the network helper in the background, once hint (if given) says the
// session wants it; netDone is closed when it is up or has failed (netErr).
func (m *machine) startNet(ctx context.Context, hint <-chan bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	m.netDone, m.cancelNet = make(chan struct{}), cancel
	go func() {
		defer close(m.netDone)
		defer cancel()
		if hint != nil {
			// Started once the first init says it wants it (Admit), not before: a
			// network false session would otherwise wait for the helper's tap device
			// to be torn down, which takes the kernel several milliseconds.
			select {
			case want := <-hint:
				if !want {
					return
				}
			case <-ctx.Done():
				return
			}
		}
		m.net, m.dns, m.netErr = startUserNet(ctx, m.pid)
		if m.net == nil && m.netErr == nil {
			m.netErr = errors.New("no network helper")
		}
	}()
}

// stopNet stops a helper started (or starting) in the background.
func (m *machine) stopNet() {
	if m.netDone == nil {
		return
	}
	m.cancelNet()
	<-m.netDone
	if m.net != nil {
		m.net.Close()
	}
	m.net, m.dns, m.netErr, m.netDone = nil, nil, nil, nil
}

// netUp waits, after the boot, for the network helper, starting it if the one started
// ahead never was (its hint said no), and writes the session's resolv.conf naming the
// helper's resolver: a file on a tmpfs of its own (see mountResolvConf), so neither the
// image nor the session's writes hold it.
func (m *machine) netUp(ctx context.Context) error {
	if m.netDone == nil {
		return nil // network false
	}
	select {
	case <-m.netDone:
	case <-ctx.Done():
		return fmt.Errorf("%w: network true: %v", backend.ErrBootFailed, ctx.Err())
	}
	if m.net == nil && m.netErr == nil {
		m.startNet(ctx, nil) // the hint said no; this session says yes
		<-m.netDone
	}
	if m.netErr != nil {
		return m.netErr
	}
	if _, err := m.Client.Write(ctx, "/etc/resolv.conf", []byte(resolvConf(m.dns)), 0, false); err != nil {
		return fmt.Errorf("%w: the session's resolv.conf: %v", backend.ErrBootFailed, err)
	}
	return nil
}

// preGroup makes, for an init spawned before any session asked (WithPrespawn), the group
// of the default machine — what a session that says nothing gets — for init to be born
// in. Whatever fails here (nil) is left for Boot to do, or to refuse.
func (b *Backend) preGroup() (*cgroup.Group, cgroup.Limits) {
	ms, err := shape(&backend.Spec{})
	if err != nil || ms.none {
		return nil, cgroup.Limits{}
	}
	g, err := newGroup(ms)
	if err != nil {
		b.log.Debug("making the cgroup of the init spawned ahead", "err", err)
		return nil, cgroup.Limits{}
	}
	return g, ms.limits
}

// preconfine does confine's network work ahead, for an init spawned before any session
// asked (WithPrespawn): the network helper, once the first init says it wants one (hint).
// Whatever fails here is left for Boot to do, or to refuse.
func (m *machine) preconfine(ctx context.Context, hint <-chan bool) {
	if networkAvailable() == nil {
		m.startNet(ctx, hint)
	}
}

// join moves an init spawned ahead into g, a group of another shape than the one it was
// born in, in the background: moving a process between cgroups waits for an RCU grace
// period (see the cgroup package), milliseconds that need not come before init builds
// its root filesystem — only before it runs anything (joined, which Boot waits for
// before the boot when an init snapshot is to be written, whose pages must be charged to
// the session, and before it returns). init has not forked yet: it waits for its boot.
func (m *machine) join(g *cgroup.Group) {
	done := make(chan struct{})
	m.added = done
	go func() {
		defer close(done)
		if err := g.Add(m.pid); err != nil {
			m.addErr = fmt.Errorf("%w: putting init in the session's cgroup: %v", backend.ErrBootFailed, err)
		}
	}()
}

// joined waits for join.
func (m *machine) joined() error {
	if m.added == nil {
		return nil
	}
	<-m.added
	return m.addErr
}

// takeSpareFor is takeSpare for a session that wants network or not: for network false,
// the network start of the init spawned ahead is cancelled (confine stops it if it was
// quicker).
func (b *Backend) takeSpareFor(network bool) *machine {
	if !network && b.spare != nil {
		if m := <-b.spare; m != nil {
			if m.cancelPre != nil {
				m.cancelPre()
			}
			b.spare <- m
		}
	}
	return b.takeSpare()
}

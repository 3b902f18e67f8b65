package console

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"virtx.dev/virtx/protocol"
)

// An Option configures a session. Options are only recorded when applied; they are all
// checked together by Open or New, before any process is started or any byte is sent, and
// every problem found is reported (each wrapping ErrInvalidOption and naming its option).
type Option func(*config)

// config is what the options said.
type config struct {
	server    []string
	serverSet bool
	serverEnv []string
	stderr    io.Writer
	stderrSet bool

	image    *protocol.ImageSource
	snapshot []byte
	network  *bool
	ports    []portOpt
	mounts   []mountOpt

	vcpus        *uint32
	memoryMiB    *uint64
	gpu          *bool
	gpuMemoryMiB *uint64
	diskGiB      *uint64

	errs []error
}

type mountOpt struct {
	name     string // how the option was spelled, for errors
	hostDir  string // WithMount / WithReadOnlyMount; "" for WithMountURL
	url      string // WithMountURL
	guest    string
	readOnly bool
}

type portOpt struct {
	name string
	spec string
}

func (cfg *config) refuse(option, format string, args ...any) {
	cfg.errs = append(cfg.errs, fmt.Errorf("%w: %s: %s", ErrInvalidOption, option, fmt.Sprintf(format, args...)))
}

// WithServer sets the server command, argv[0] being the program (looked up on PATH when
// it has no slash). Without it the server is $VIRTX_SERVER split on spaces when that is
// set, else `virtx serve` when virtx is on PATH, else <CacheDir>/bin/virtx-uvm. New
// ignores it.
func WithServer(argv ...string) Option {
	argv = append([]string(nil), argv...)
	return func(cfg *config) {
		if len(argv) == 0 || argv[0] == "" {
			cfg.refuse("WithServer()", "empty command")
			return
		}
		cfg.server, cfg.serverSet = argv, true
	}
}

// WithServerEnv adds "KEY=value" entries to the server's environment, which is otherwise
// this process's. Later entries win over earlier ones and over the inherited environment.
// New ignores it.
func WithServerEnv(env []string) Option {
	env = append([]string(nil), env...)
	return func(cfg *config) {
		for _, kv := range env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				cfg.refuse(fmt.Sprintf("WithServerEnv(%q)", kv), "want KEY=value")
				continue
			}
			cfg.serverEnv = append(cfg.serverEnv, kv)
		}
	}
}

// WithStderr sets where the server's stderr goes; by default it is passed through to
// os.Stderr, and nil discards it. Either way the last lines are kept, to explain a server
// that dies. Writes to w must not block for long: the server waits on them. New ignores
// it.
func WithStderr(w io.Writer) Option {
	return func(cfg *config) {
		if w == nil {
			w = io.Discard
		}
		cfg.stderr, cfg.stderrSet = w, true
	}
}

// WithImage sets the image the session runs on: a recipe to build, a ref or a digest.
// Without it the session runs on the server's default.
func WithImage(src protocol.ImageSource) Option {
	return func(cfg *config) {
		name := "WithImage(" + src.Type + ")"
		switch src.Type {
		case protocol.ImageRecipe:
			if src.Recipe == nil {
				cfg.refuse(name, "no recipe")
				return
			}
			if err := src.Recipe.Validate(); err != nil {
				cfg.refuse(name, "%v", err)
				return
			}
		case protocol.ImageRef:
			if src.Ref == "" {
				cfg.refuse(name, "empty ref")
				return
			}
		case protocol.ImageDigest:
			if !protocol.ValidDigest(src.Digest) {
				cfg.refuse(name, "digest %q: want \"sha256:<64 lowercase hex digits>\"", src.Digest)
				return
			}
		default:
			cfg.refuse(fmt.Sprintf("WithImage(%q)", src.Type), "type must be %q, %q or %q",
				protocol.ImageRecipe, protocol.ImageRef, protocol.ImageDigest)
			return
		}
		cfg.image = &src
	}
}

// WithMount mounts the host directory hostDir at guestPath, read-write. A relative hostDir
// is made absolute against the current directory; guestPath must be absolute and may not
// hold a colon. Mounts are made in the order given, so a mount at /work/out after one at
// /work lands inside it. It is sent as file://<absolute hostDir>:<guestPath>.
func WithMount(hostDir, guestPath string) Option {
	name := fmt.Sprintf("WithMount(%q, %q)", hostDir, guestPath)
	return func(cfg *config) {
		cfg.mounts = append(cfg.mounts, mountOpt{name: name, hostDir: hostDir, guest: guestPath})
	}
}

// WithReadOnlyMount is WithMount for a tree the session may read and not write.
func WithReadOnlyMount(hostDir, guestPath string) Option {
	name := fmt.Sprintf("WithReadOnlyMount(%q, %q)", hostDir, guestPath)
	return func(cfg *config) {
		cfg.mounts = append(cfg.mounts, mountOpt{name: name, hostDir: hostDir, guest: guestPath, readOnly: true})
	}
}

// WithMountURL mounts the tree at url, of any scheme, at guestPath. The URL is sent as
// given; a server that cannot realise its scheme refuses init with
// protocol.CodeUnsupportedMount.
func WithMountURL(url, guestPath string, readOnly bool) Option {
	name := fmt.Sprintf("WithMountURL(%q, %q, %t)", url, guestPath, readOnly)
	return func(cfg *config) {
		if url == "" {
			cfg.refuse(name, "empty URL")
			return
		}
		cfg.mounts = append(cfg.mounts, mountOpt{name: name, url: url, guest: guestPath, readOnly: readOnly})
	}
}

// WithSnapshot starts the session from a layer an earlier session's Snapshot returned.
// An empty layer is no snapshot.
func WithSnapshot(layer []byte) Option {
	return func(cfg *config) {
		if len(layer) == 0 {
			cfg.snapshot = nil
			return
		}
		cfg.snapshot = layer
	}
}

// WithNetwork says whether the session's commands reach a network; the default is on.
// Only off is sent, as upstream clients do.
func WithNetwork(on bool) Option {
	return func(cfg *config) { cfg.network = &on }
}

// WithPorts adds ways into the session, each "HOST:GUEST" as docker's -p spells it: a
// listener at 127.0.0.1:HOST on the server's machine reaching port GUEST in the session.
func WithPorts(ports ...string) Option {
	ports = append([]string(nil), ports...)
	return func(cfg *config) {
		for _, p := range ports {
			cfg.ports = append(cfg.ports, portOpt{name: fmt.Sprintf("WithPorts(%q)", p), spec: p})
		}
	}
}

// WithVCPUs asks for a machine with n vCPUs. A server that cannot give exactly that
// refuses init with protocol.CodeUnsupportedMachine.
func WithVCPUs(n uint32) Option {
	return func(cfg *config) {
		if n == 0 {
			cfg.refuse("WithVCPUs(0)", "a machine with no vCPUs runs nothing; leave the option out for the server's default")
			return
		}
		cfg.vcpus = &n
	}
}

// WithMemoryMiB asks for a machine with n MiB of memory.
func WithMemoryMiB(n uint64) Option {
	return func(cfg *config) {
		if n == 0 {
			cfg.refuse("WithMemoryMiB(0)", "a machine with no memory runs nothing; leave the option out for the server's default")
			return
		}
		cfg.memoryMiB = &n
	}
}

// WithGPU says whether the session's commands get an accelerator. false is sent: it is a
// session that must not have one, which is not the same as saying nothing.
func WithGPU(on bool) Option {
	return func(cfg *config) { cfg.gpu = &on }
}

// WithGPUMemoryMiB asks for an accelerator holding n MiB, beside the machine's memory. It
// needs WithGPU(true).
func WithGPUMemoryMiB(n uint64) Option {
	return func(cfg *config) {
		if n == 0 {
			cfg.refuse("WithGPUMemoryMiB(0)", "an accelerator with no memory; leave the option out for the server's default")
			return
		}
		cfg.gpuMemoryMiB = &n
	}
}

// WithDiskGiB bounds what the session may write, in GiB, on top of its image.
func WithDiskGiB(n uint64) Option {
	return func(cfg *config) {
		if n == 0 {
			cfg.refuse("WithDiskGiB(0)", "a session with no room to write; leave the option out for the server's default")
			return
		}
		cfg.diskGiB = &n
	}
}

// newConfig applies opts and checks what they say together. The error joins every
// problem found; each wraps ErrInvalidOption.
func newConfig(opts []Option) (*config, *protocol.InitParams, error) {
	cfg := &config{stderr: os.Stderr}
	for _, o := range opts {
		if o != nil {
			o(cfg)
		}
	}
	p := cfg.initParams()
	if len(cfg.errs) > 0 {
		return nil, nil, errors.Join(cfg.errs...)
	}
	return cfg, p, nil
}

// initParams builds init's params, recording what is wrong.
func (cfg *config) initParams() *protocol.InitParams {
	p := &protocol.InitParams{Image: cfg.image, Snapshot: cfg.snapshot}

	networkOff := cfg.network != nil && !*cfg.network
	if networkOff {
		off := false
		p.Network = &off
	}

	hostPorts := map[uint16]string{}
	for _, po := range cfg.ports {
		pt, err := protocol.ParsePort(po.spec)
		if err != nil {
			cfg.refuse(po.name, "%v", err)
			continue
		}
		if networkOff {
			cfg.refuse(po.name, "a port into a session without a network (WithNetwork(false))")
			continue
		}
		if prev, dup := hostPorts[pt.Host]; dup {
			cfg.refuse(po.name, "host port %d is already taken by %s", pt.Host, prev)
			continue
		}
		hostPorts[pt.Host] = po.name
		p.Ports = append(p.Ports, pt)
	}

	if cfg.vcpus != nil {
		n := uint64(*cfg.vcpus)
		p.VCPUs = &n
	}
	p.MemoryMiB, p.GPU, p.DiskGiB = cfg.memoryMiB, cfg.gpu, cfg.diskGiB
	if cfg.gpuMemoryMiB != nil {
		if cfg.gpu == nil || !*cfg.gpu {
			cfg.refuse(fmt.Sprintf("WithGPUMemoryMiB(%d)", *cfg.gpuMemoryMiB), "describes an accelerator, and the session has none: add WithGPU(true)")
		} else {
			p.GPUMemoryMiB = cfg.gpuMemoryMiB
		}
	}

	guests := map[string]string{}
	for _, mo := range cfg.mounts {
		m, ok := cfg.mount(mo)
		if !ok {
			continue
		}
		key := path.Clean(m.GuestPath)
		if prev, dup := guests[key]; dup {
			cfg.refuse(mo.name, "guest path %q is already mounted by %s", m.GuestPath, prev)
			continue
		}
		guests[key] = mo.name
		p.Mounts = append(p.Mounts, m)
	}
	return p
}

// mount checks one mount option and spells it for the wire.
func (cfg *config) mount(mo mountOpt) (protocol.Mount, bool) {
	switch {
	case mo.guest == "":
		cfg.refuse(mo.name, "empty guest path")
		return protocol.Mount{}, false
	case !path.IsAbs(mo.guest):
		cfg.refuse(mo.name, "guest path %q is not absolute", mo.guest)
		return protocol.Mount{}, false
	case strings.Contains(mo.guest, ":"):
		cfg.refuse(mo.name, "guest path %q holds a ':', which the mount syntax cannot carry", mo.guest)
		return protocol.Mount{}, false
	}
	url := mo.url
	if url == "" {
		if mo.hostDir == "" {
			cfg.refuse(mo.name, "empty host directory")
			return protocol.Mount{}, false
		}
		abs, err := filepath.Abs(mo.hostDir)
		if err != nil {
			cfg.refuse(mo.name, "host directory: %v", err)
			return protocol.Mount{}, false
		}
		url = "file://" + filepath.ToSlash(abs)
		if !strings.HasPrefix(url, "file:///") { // a Windows drive: file:///C:/x
			url = "file:///" + strings.TrimPrefix(url, "file://")
		}
	}
	want := protocol.Mount{URL: url, GuestPath: mo.guest, ReadOnly: mo.readOnly}
	// The wire spelling is read from the right; make sure it reads back as what was meant
	// (a URL ending in something that looks like a guest path or an option would not).
	got, err := protocol.ParseMount(want.String())
	if err != nil {
		cfg.refuse(mo.name, "%v", err)
		return protocol.Mount{}, false
	}
	if got != want {
		cfg.refuse(mo.name, "%q would read back as URL %q at %q", want.String(), got.URL, got.GuestPath)
		return protocol.Mount{}, false
	}
	return want, true
}

// An ExecOption configures one Exec.
type ExecOption func(*execConfig)

type execConfig struct {
	timeout time.Duration
}

// WithTimeout kills the command after d (sent as timeout_ms, rounded up to a whole
// millisecond); the call then fails with a *RefusedError of code protocol.CodeTimedOut.
// d <= 0 is no timeout. It is the server's clock, unlike the call's context, whose
// cancellation abandons the answer but leaves the command running.
func WithTimeout(d time.Duration) ExecOption {
	return func(ec *execConfig) { ec.timeout = d }
}

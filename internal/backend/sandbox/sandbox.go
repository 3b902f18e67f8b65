package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"sync"

	"virtx.dev/virtx/internal/backend"
	"virtx.dev/virtx/protocol"
)

// Defaults of a session that leaves the member out.
const (
	// DefaultDiskGiB is the room a session's writes get when init leaves disk_gib out.
	DefaultDiskGiB = 10
	// DefaultCwd is where a session starts: root's home, since commands run as root.
	DefaultCwd = "/root"
	// Hostname is the host name commands see.
	Hostname = "virtx"
)

// defaultEnv is the environment every command starts with (PWD is the executor's).
// Nothing of the server's own environment reaches a command.
var defaultEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"HOSTNAME=" + Hostname,
}

// ownPaths are the sandbox's own filesystems, where no tree may go.
var ownPaths = []string{"/proc", "/sys", "/dev"}

// Backend makes namespace sandbox sessions. Make one with New; Close releases what it
// holds between boots (the session's upper filesystem, the host image's lock).
type Backend struct {
	cacheDir string
	exe      string
	log      *slog.Logger
	early    bool // WithPrespawn
	rootless bool // the server is not root: each sandbox gets a user namespace

	imgs images // the image store and the images sessions hold (image.go)

	mu    sync.Mutex
	img   *hostImage
	state *sessionState // the session the last Boot was for
	platform
}

// Option configures the sandbox backend.
type Option func(*Backend)

// WithCacheDir sets virtx's cache directory, where the prepared host image is kept
// (console.CacheDir says which it is for `virtx serve`).
func WithCacheDir(dir string) Option { return func(b *Backend) { b.cacheDir = dir } }

// WithExecutable sets the virtx binary started as each sandbox's init (default: this
// process's own executable, /proc/self/exe). It must run RunInit for the hidden
// InitCommand.
func WithExecutable(path string) Option { return func(b *Backend) { b.exe = path } }

// WithPrespawn starts the first sandbox's init as the backend is made (for `virtx
// serve`: one server, one session), so that the cost of starting a process overlaps with
// the server's own start and the client's first calls. It is killed with the server if no
// boot takes it.
func WithPrespawn() Option { return func(b *Backend) { b.early = true } }

// WithLogger sets where the backend logs (stderr in `virtx serve`).
func WithLogger(l *slog.Logger) Option { return func(b *Backend) { b.log = l } }

// New makes the sandbox backend.
func New(opts ...Option) *Backend {
	b := &Backend{exe: "/proc/self/exe", log: slog.New(slog.DiscardHandler), rootless: os.Geteuid() != 0}
	for _, o := range opts {
		o(b)
	}
	if b.early {
		b.prespawn() // and, once it has spawned init, reapStaleGroups
	} else {
		go reapStaleGroups() // what a SIGKILLed server left, and this server's reaper
	}
	return b
}

// Name is "sandbox".
func (b *Backend) Name() string { return "sandbox" }

// InitCommand is the hidden command of the virtx binary that runs as a sandbox's PID 1
// (RunInit).
const InitCommand = "__sandbox-init"

// Admit refuses what this backend cannot make, without booting anything but an image's
// RUN steps, and answers where the session starts: DefaultCwd on the host image, the
// image's working directory on an image (resolved, pulled or built here: image.go).
func (b *Backend) Admit(ctx context.Context, spec *backend.Spec) (string, error) {
	if _, err := shape(spec); err != nil {
		return "", err
	}
	b.hintNetwork(spec.Network)
	disk, err := diskBytes(spec)
	if err != nil {
		return "", err
	}
	for i, m := range spec.Mounts {
		if _, err := treeSource(i, m); err != nil {
			return "", err
		}
		g := path.Clean(m.GuestPath)
		for _, own := range ownPaths {
			if g == own || strings.HasPrefix(g, own+"/") {
				return "", fmt.Errorf("%w: mount %d (%s): %s is the sandbox's own %s; put the tree elsewhere", backend.ErrInvalidSpec, i+1, m, g, own)
			}
		}
	}
	if spec.Snapshot != nil {
		if err := checkLayer(spec.Snapshot, disk); err != nil {
			return "", err
		}
	}
	return b.admitted(ctx, spec) // the image, last: it may pull or build (image.go)
}

// treeSource is the host directory a file:// tree names.
func treeSource(i int, m protocol.Mount) (string, error) {
	return backend.FileTree("sandbox", i, m)
}

// checkLayer reads a snapshot's tar headers: a blob that is not a layer tar is refused at
// init (the request is what has to change), and so is one whose files alone exceed the
// session's disk. What the names may hold is ApplyLayer's to check, when it applies it.
func checkLayer(blob []byte, disk int64) error {
	tr := tar.NewReader(bytes.NewReader(blob))
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: snapshot: not a layer tar as snapshot answers it: %v", backend.ErrInvalidSpec, err)
		}
		total += hdr.Size
	}
	if total > disk {
		return fmt.Errorf("%w: snapshot: its files hold %d bytes, more than the session's disk (%d bytes); ask for a larger disk_gib", backend.ErrInvalidSpec, total, disk)
	}
	return nil
}

// sessionState is what one session keeps across its boots: the spec it was made from
// (the server keeps one *Spec per init, so a new pointer is a new session) and the upper
// filesystem holding its writes, once the first boot has made it.
type sessionState struct {
	spec  *backend.Spec
	upper io.Closer // nil until the first boot made it
}

func (s *sessionState) release() {
	if s != nil && s.upper != nil {
		s.upper.Close()
		s.upper = nil
	}
}

// Close releases the current session's upper filesystem (its written files), an init
// spawned ahead and not taken, and the host image. A machine still booted is not shut
// down. A Backend can still boot afterwards.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state.release()
	b.state = nil
	b.releaseImages()
	b.closePlatform()
	if b.img != nil {
		b.img.close()
		b.img = nil
	}
	return nil
}
